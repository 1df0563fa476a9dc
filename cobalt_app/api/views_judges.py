"""`/api/compare/pairwise/` (a pairwise judge's win rate of run B over run A) and
`/api/judges/<judge>/calibration/` (a judge's agreement with the reviewers and every
disagreement): parse, call `cobalt_app.pairwise_compare` / `cobalt_app.judge_loop`, respond."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from cobalt.config import active_config
from cobalt_app import judge_loop
from cobalt_app.api.views import NO_NUL, CobaltAPIView, errors
from cobalt_app.pairwise_compare import REQUEST_PAIRS, pairwise_compare
from cobalt_app.selectors import run_get


class PairwiseQuerySerializer(serializers.Serializer):
    a = serializers.CharField(max_length=32, help_text="Baseline run id (or unique prefix).")
    b = serializers.CharField(max_length=32, help_text="Candidate run id (or unique prefix).")
    judge = serializers.RegexField(
        NO_NUL, max_length=100, help_text='A pairwise evaluator (type="pairwise") of run B or A.'
    )


class PairwiseSerializer(serializers.Serializer):
    judge = serializers.CharField()
    runA = serializers.CharField()
    runB = serializers.CharField()
    n = serializers.IntegerField(help_text="Items judged (both outputs present, no error).")
    wins = serializers.IntegerField(help_text="Items where B won in both orders.")
    tied = serializers.IntegerField(help_text="Ties, the orders' disagreements included.")
    losses = serializers.IntegerField()
    orderDisagreements = serializers.IntegerField()
    winRate = serializers.FloatField(allow_null=True, help_text="B's win rate, ties half.")
    low = serializers.FloatField(allow_null=True)
    high = serializers.FloatField(allow_null=True)
    ties = serializers.CharField()
    method = serializers.CharField()
    errors = serializers.IntegerField(help_text="Pairs the judge could not judge.")
    errorMessages = serializers.ListField(child=serializers.CharField())
    tokens = serializers.IntegerField()
    cost = serializers.FloatField()
    items = serializers.ListField(child=serializers.DictField())


class CalibrationQuerySerializer(serializers.Serializer):
    run = serializers.CharField(
        max_length=32, required=False, help_text="Run id; default: the latest with the judge."
    )


class CalibrationSerializer(serializers.Serializer):
    judge = serializers.CharField()
    run = serializers.CharField()
    experiment = serializers.CharField()
    labels = serializers.IntegerField(help_text="Current labels of the judge on the run.")
    judgeKey = serializers.CharField(help_text="The judge's version: a hash of prompt and model.")
    runsPooled = serializers.IntegerField(help_text="Runs whose labels the agreement pools.")
    agreement = serializers.DictField(
        help_text="n, confusion, kappa with kappa_low/kappa_high, tpr and tnr with Wilson bounds."
    )
    calibration = serializers.DictField(
        help_text="The certificate, corrected pass rate, reviewer agreement, excluded labels."
    )
    disagreements = serializers.ListField(
        child=serializers.DictField(),
        help_text="input, output, judgeScore, judgeVerdict, judgeReason, label, reviewer, note.",
    )


class PairwiseCompareView(CobaltAPIView):
    @extend_schema(
        summary="A pairwise judge's win rate of run B over run A (both orders; ties half)",
        parameters=[PairwiseQuerySerializer],
        responses={200: PairwiseSerializer, **errors(400, 404)},
    )
    def get(self, request: Request) -> Response:
        query = PairwiseQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        a, b = run_get(query.validated_data["a"]), run_get(query.validated_data["b"])
        judge = query.validated_data["judge"]
        found = pairwise_compare(a, b, judge, active_config(), max_pairs=REQUEST_PAIRS)
        return Response(PairwiseSerializer(found).data)


class JudgeCalibrationView(CobaltAPIView):
    @extend_schema(
        summary="A judge against the reviewers: agreement and every disagreement",
        parameters=[CalibrationQuerySerializer],
        responses={200: CalibrationSerializer, **errors(400, 404)},
    )
    def get(self, request: Request, judge: str) -> Response:
        query = CalibrationQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        report = judge_loop.judge_report(judge, query.validated_data.get("run"))
        return Response(CalibrationSerializer(report).data)
