"""Items in the API's addresses by their number, as on the pages: `/api/runs/<run>/items/<number>/`
(`?repeat=N` for the Nth repetition of a run with repetitions, from 1).

An old address by the item result's database id (what the API used before, and what an item's
`id` still is) keeps working when no item of the run has that number: a GET is redirected (301)
to the number's address, as the pages redirect theirs; a POST is served where it was sent (a
redirect would lose its body in most clients).
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.http import HttpResponse, HttpResponsePermanentRedirect
from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import serializers
from rest_framework.request import Request

from cobalt.errors import NotFoundError
from cobalt_app.models import Run
from cobalt_app.page_triage import item_address

PARAMETERS = [
    OpenApiParameter(
        "number",
        int,
        OpenApiParameter.PATH,
        description="The item's number, as on the pages (its `index` + 1). An item result's "
        "database `id` (an old address) still names it when no item of the run has that "
        "number: a GET is then redirected (301) to its number's address.",
    ),
    OpenApiParameter(
        "repeat",
        int,
        OpenApiParameter.QUERY,
        required=False,
        description="Which repetition of the item (its `runIndex` + 1), in a run whose items "
        "ran several times; 1 when left out.",
    ),
]
MOVED = {
    301: OpenApiResponse(
        description="An old address (the item result's database id): `Location` names the "
        "item by its number."
    )
}


class RepeatQuery(serializers.Serializer):
    repeat = serializers.IntegerField(min_value=1, max_value=10**6, required=False, default=1)


def located(request: Request, run: Run, number: int) -> tuple[int, HttpResponse | None]:
    """The database id of the item the address names, and for a GET of an old address the
    redirect to its number's address (None otherwise)."""
    query = RepeatQuery(data={k: v for k, v in request.query_params.items() if k == "repeat"})
    query.is_valid(raise_exception=True)
    repeat = query.validated_data["repeat"]
    found = item_address(run, number, repeat)
    if found is None:
        shown = f"#{number}" + (f" (repeat {repeat})" if repeat > 1 else "")
        raise NotFoundError(f"run {run.id} has no item {shown}")
    if not found.moved or request.method != "GET":
        return found.id, None
    kept = [(k, v) for k, v in request.query_params.items() if k != "repeat"]
    if found.repeat > 1:
        kept.insert(0, ("repeat", str(found.repeat)))
    name = request.resolver_match.view_name
    url = reverse(name, kwargs={"run_id": run.id, "number": found.number})
    return found.id, HttpResponsePermanentRedirect(f"{url}?{urlencode(kept)}" if kept else url)
