"""`GET /api/runs/<run id>/items/<number>/`: one item with its trace and its judges' calls."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from cobalt_app.api import selectors as api_selectors
from cobalt_app.api import serializers
from cobalt_app.api.item_address import MOVED, PARAMETERS, located
from cobalt_app.api.views import CobaltAPIView, errors
from cobalt_app.selectors import run_get


class ItemDetailView(CobaltAPIView):
    @extend_schema(
        summary="One item result of a run, with each LLM judge's own call",
        operation_id="runs_items_retrieve",
        parameters=PARAMETERS,
        responses={200: serializers.ItemDetailSerializer, **MOVED, **errors(400, 404)},
    )
    def get(self, request: Request, run_id: str, number: int) -> Response | HttpResponse:
        run = run_get(run_id)
        item_id, moved = located(request, run, number)
        return moved or Response(api_selectors.item_detail(run, item_id))
