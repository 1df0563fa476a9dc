"""The item panel and its downloads, addressed by the item's number (`/runs/<id>/items/17/`,
`?repeat=N` for a repetition), walking the list it was opened from (`page_triage.ListState`
in the query string). An old address by database id redirects (301) to the number's.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.http import Http404, HttpRequest, HttpResponse, HttpResponsePermanentRedirect
from django.urls import reverse
from django.views.decorators.http import require_GET

from cobalt.run_settings import RunSettings
from cobalt_app import page_items, page_repeats, page_trace, page_triage, page_values
from cobalt_app.models import ItemResult, Run
from cobalt_app.views import (
    HtmxHttpRequest,
    ItemFilterForm,
    PageForm,
    get_run_or_404,
    is_repeated,
    page,
    partial_or_page,
)

LIST_PARAMS = ("view", "status", "evaluator", "min", "max", "sort", "q", "key", "value")


class RepeatForm(forms.Form):
    """`?repeat=` of an item's address: its repetition, from 1."""

    repeat = forms.IntegerField(required=False, min_value=1, max_value=10**6)


def _repeat(request: HttpRequest) -> int:
    form = RepeatForm(request.GET)
    if not form.is_valid():
        raise Http404("repeat must be a repetition's number, from 1")
    return form.cleaned_data.get("repeat") or 1


def _moved(request: HttpRequest, run: Run, number: int, path: str = "") -> HttpResponse:
    """A 301 from an old address (by database id) to the item's number, or a 404."""
    item = page_triage.legacy_item(run, number)
    if item is None:
        raise Http404(f"run {run.id} has no item #{number}")
    kept = [(k, v) for k, v in request.GET.items() if k != "repeat"]
    url = page_triage.item_url(run.id, item.number, item.run_index, kept)
    if path:
        base, _, query = url.partition("?")
        url = f"{base}{path}" + (f"?{query}" if query else "")
    return HttpResponsePermanentRedirect(url)


def _list_state(request: HttpRequest, run: Run) -> page_triage.ListState | None:
    """The list the item was opened from; None without one (then: all items, by number)."""
    if not any(name in request.GET for name in LIST_PARAMS):
        return None
    return ItemFilterForm(request.GET, run=run).list_state()


@page
def item_panel(request: HtmxHttpRequest, run_id: str, number: int) -> HttpResponse:
    run = get_run_or_404(run_id)
    repeat = _repeat(request)
    form = PageForm(request.GET)
    trace_page = (form.cleaned_data.get("page") if form.is_valid() else None) or 1
    if request.htmx and request.htmx.target == "item-trace":  # a page of steps
        found = ItemResult.objects.filter(run=run, item_index=number - 1, run_index=repeat - 1)
        item_id = found.values_list("id", flat=True).first()
        item = page_trace.trace_only(run, item_id) if item_id else None
        if item is None:
            raise Http404(f"run {run.id} has no item #{number}")
        item.item_index, item.run_index = number - 1, repeat - 1  # for its pages' links
        context = {"run": run, "item": item, "trace": page_trace.item_trace(item, trace_page)}
        return partial_or_page(request, "cobalt/item.html", context, "trace")
    item = page_items.item_detail_at(run, number, repeat)
    if item is None and repeat > 1:  # a repeat it does not have: the item, on its worst
        item = page_items.item_detail_at(run, number)
    if item is None:
        return _moved(request, run, number)
    state = _list_state(request, run)
    params = state.params() if state else []
    repeats = None
    if is_repeated(RunSettings.from_run_config(run.config)):
        repeats = page_repeats.item_repeats(run, item, request.GET.get("repeat"))
    if repeats:  # the asked (or the worst) repeat; j and k step from item to item
        if repeats.current.id != item.id:
            item = page_items.item_detail(run, repeats.current.id) or item
        place, links = None, _item_links(run, item, params)
    else:
        place = page_triage.item_place(run, item, state)
        links = _links(run, place, params)
    values = page_values.item_values(run, item)
    context: dict[str, Any] = {
        "run": run,
        "item": item,
        "repeats": repeats,
        "place": place,
        "list_state": state,
        "list_params": params,
        "links": links,
        "back_url": reverse("cobalt:run", args=[run.id]) + (f"?{state.query()}" if state else ""),
        "trace": page_trace.item_trace(item, trace_page),
        "values": values,
        "conversation": page_items.conversation_turns(item.output, item.metadata),
        # The whole item to copy, unless the page shows only part of it (then it downloads).
        "item_json": None if values.cut else page_values.item_json(item),
        # Over a run's page (an htmx swap into #panel), not a page of its own.
        "floating": bool(request.htmx and not request.htmx.history_restore_request),
    }
    return partial_or_page(request, "cobalt/item.html", context, "panel")


def _links(run: Run, place: page_triage.Place, params: list[tuple[str, str]]) -> dict[str, str]:
    """The previous, next and next-failure items' addresses, in the same list."""
    found = {"previous": place.previous, "next": place.next, "next_failure": place.next_failure}
    return {
        name: page_triage.item_url(run.id, at[0], at[1], params)
        for name, at in found.items()
        if at is not None
    }


def _item_links(run: Run, item: ItemResult, params: list[tuple[str, str]]) -> dict[str, str]:
    """The items just before and after a repeated one (each opening on its worst repeat)."""
    found = dict(zip(("previous", "next"), page_repeats.item_neighbours(run, item), strict=True))
    return {
        name: page_triage.item_url(run.id, at, 0, params)
        for name, at in found.items()
        if at is not None
    }


@require_GET
def item_download(request: HttpRequest, run_id: str, number: int, part: str) -> HttpResponse:
    """The whole of an item's value a page shows only the start of, as a file (never HTML)."""
    run = get_run_or_404(run_id)
    repeat = _repeat(request)
    found = ItemResult.objects.filter(run=run, item_index=number - 1, run_index=repeat - 1)
    item_id = found.values_list("id", flat=True).first()
    if item_id is None:
        return _moved(request, run, number, f"download/{part}")
    download = page_values.item_download(run, item_id, part)
    if download is None:
        raise Http404(f"run {run.id} has no {part} for item #{number}")
    response = HttpResponse(download.body, content_type=download.content_type)
    response["Content-Disposition"] = f'attachment; filename="{download.filename}"'
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    return response
