"""`/api/sweeps/` (recent sweeps) and `/api/sweeps/<id>/` (which variant is best and why:
the ranking, the Holm-corrected paired tests against the best, the Pareto front and a page
of the items × variants matrix): parse, call `cobalt_app.sweeps`, respond."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from cobalt_app import sweeps
from cobalt_app.api.views import NO_NUL, CobaltAPIView, errors


class SweepListQuerySerializer(serializers.Serializer):
    name = serializers.RegexField(NO_NUL, required=False, max_length=200)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=200, default=20)


class SweepBriefSerializer(serializers.Serializer):
    id = serializers.CharField()
    name = serializers.CharField()
    file = serializers.CharField()
    variants = serializers.ListField(child=serializers.DictField())
    default_label = serializers.CharField()
    created_at = serializers.DateTimeField()


class SweepListSerializer(serializers.Serializer):
    sweeps = SweepBriefSerializer(many=True)


class SweepQuerySerializer(serializers.Serializer):
    offset = serializers.IntegerField(required=False, min_value=0, default=0)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=500, default=50)


class SweepSerializer(serializers.Serializer):
    id = serializers.CharField()
    name = serializers.CharField()
    file = serializers.CharField()
    alpha = serializers.FloatField()
    correction = serializers.CharField(help_text="holm: the tests against the best together.")
    best = serializers.CharField(allow_null=True)
    default = serializers.CharField(allow_null=True)
    ranking = serializers.ListField(child=serializers.CharField())
    pareto = serializers.ListField(child=serializers.CharField())
    verdict = serializers.CharField(help_text="Which variant is best and why, in words.")
    variants = serializers.ListField(
        child=serializers.DictField(), help_text="Totals, rank, test against the best (vsBest)."
    )
    ignoredKeys = serializers.ListField(child=serializers.CharField())
    missing = serializers.ListField(child=serializers.CharField())
    unfinished = serializers.ListField(child=serializers.CharField())
    complete = serializers.BooleanField()
    matrix = serializers.DictField(help_text="{labels, rows: [{key, cells}], total, offset}")


class SweepListView(CobaltAPIView):
    @extend_schema(
        summary="Recent sweeps (an experiment run once per variant)",
        parameters=[SweepListQuerySerializer],
        responses={200: SweepListSerializer, **errors(400)},
    )
    def get(self, request: Request) -> Response:
        query = SweepListQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        found = sweeps.sweep_list(query.validated_data["limit"], query.validated_data.get("name"))
        return Response(SweepListSerializer({"sweeps": found}).data)


class SweepDetailView(CobaltAPIView):
    @extend_schema(
        summary="A sweep's verdict: ranking, paired tests vs the best (Holm), Pareto front",
        parameters=[SweepQuerySerializer],
        responses={200: SweepSerializer, **errors(400, 404)},
    )
    def get(self, request: Request, sweep_id: str) -> Response:
        query = SweepQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        sweep = sweeps.sweep_get(sweep_id)
        offset, limit = query.validated_data["offset"], query.validated_data["limit"]
        runs = sweeps.variant_runs(sweep)
        tables = sweeps.tables_of(runs)
        result = sweeps.summary(sweep, runs, tables)
        labels, rows, total = sweeps.matrix_rows(
            sweep, offset=offset, limit=limit, order=result["ranking"], runs=runs, tables=tables
        )
        body = {
            **result,
            "matrix": {"labels": labels, "rows": rows, "total": total, "offset": offset},
        }
        return Response(SweepSerializer(body).data)
