"""The API's JSON shapes (camelCase, as in the results file) and the validation of its input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rest_framework import serializers

from cobalt.config import Config
from cobalt.experiments import Experiment
from cobalt.verdict import Verdict
from cobalt_app import discovery, launcher
from cobalt_app.labels import MAX_NOTE
from cobalt_app.models import ItemResult, Label, Run

MAX_CONCURRENCY = 1000


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()


# Human labels (cobalt_app/labels.py) --------------------------------------------------------


class LabelSerializer(serializers.Serializer):
    """A person's label of one evaluation, on the item of the run it shows on."""

    id = serializers.IntegerField()
    item = serializers.IntegerField(help_text="The item's number (1-based).")
    itemId = serializers.IntegerField(help_text="The item result's id.")
    itemKey = serializers.CharField()
    repetition = serializers.IntegerField(help_text="0-based, as `runIndex`.")
    evaluator = serializers.CharField()
    reviewer = serializers.CharField()
    verdict = serializers.ChoiceField(choices=Label.Verdict.choices)
    score = serializers.FloatField(allow_null=True, help_text="A corrected score, 0 to 1.")
    note = serializers.CharField(allow_blank=True)
    expectedOutput = serializers.JSONField(
        allow_null=True, help_text="A corrected expected output (null: not corrected)."
    )
    stale = serializers.BooleanField(
        help_text="Given on another output of the item than this run's (it changed since)."
    )
    judgeScore = serializers.FloatField(allow_null=True)
    judgeVerdict = serializers.ChoiceField(choices=[v.value for v in Verdict])
    disagrees = serializers.BooleanField(
        help_text="A current label whose pass/fail differs from the judge's verdict."
    )
    version = serializers.IntegerField(help_text="Send it back to change the label.")
    labelledRun = serializers.CharField(allow_null=True, help_text="The run it was given on.")
    createdAt = serializers.CharField()
    updatedAt = serializers.CharField()


class LabelListSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    labels = LabelSerializer(many=True)


class LabelSummarySerializer(serializers.Serializer):
    labels = serializers.IntegerField(help_text="Current labels on the run's items.")
    stale = serializers.IntegerField(help_text="Labels given on outputs that changed since.")
    itemsLabelled = serializers.IntegerField()
    reviewers = serializers.ListField(child=serializers.CharField())
    disagreements = serializers.IntegerField(help_text="Current labels that differ from the judge.")


class LabelQuerySerializer(serializers.Serializer):
    evaluator = serializers.CharField(required=False, max_length=100)
    reviewer = serializers.CharField(required=False, max_length=150)
    disagrees = serializers.BooleanField(
        default=False, help_text="Only current labels that disagree with the judge."
    )
    stale = serializers.BooleanField(
        default=True, help_text="Include labels given on another output (false: current only)."
    )


class ItemLabelInputSerializer(serializers.Serializer):
    """The reviewer is the authenticated user. Without `version` a save overwrites the
    label; with the version last read, a label changed since is a 409."""

    evaluator = serializers.CharField(max_length=100)
    verdict = serializers.ChoiceField(
        choices=Label.Verdict.choices,
        required=False,
        allow_null=True,
        help_text="Without it, `score` decides by the evaluator's pass mark.",
    )
    score = serializers.FloatField(
        required=False, allow_null=True, help_text="A corrected score, 0 to 1."
    )
    note = serializers.CharField(required=False, allow_blank=True, max_length=MAX_NOTE)
    expectedOutput = serializers.JSONField(
        required=False,
        allow_null=True,
        help_text="A corrected expected output (null clears it; left out: unchanged).",
    )
    version = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=0,
        help_text="The label's version you last read (0: you saw none).",
    )


class LabelInputSerializer(ItemLabelInputSerializer):
    item = serializers.IntegerField(
        min_value=1, max_value=2**63 - 1, help_text="The item result's id (`itemId`)."
    )


class AddToDatasetSerializer(serializers.Serializer):
    file = serializers.CharField(
        max_length=500,
        help_text="A .jsonl dataset file, relative to the project folder (created if missing).",
    )
    evaluator = serializers.CharField(
        required=False,
        max_length=100,
        help_text="Take the corrected expected output from a label on this evaluator.",
    )


class AddedToDatasetSerializer(serializers.Serializer):
    file = serializers.CharField(help_text="Relative to the project folder.")
    line = serializers.IntegerField(help_text="The item's line in the file.")
    id = serializers.CharField(help_text="The item's id: its item key.")
    item = serializers.JSONField(help_text="The line written.")


class RunSerializer(serializers.ModelSerializer):
    """A run in the list: identity, status, progress, totals and the average per evaluator."""

    timestamp = serializers.DateTimeField(source="created_at")
    startedAt = serializers.DateTimeField(source="started_at", allow_null=True)
    finishedAt = serializers.DateTimeField(source="finished_at", allow_null=True)
    durationMs = serializers.FloatField(source="duration_ms", allow_null=True)
    totalItems = serializers.IntegerField(source="total_items")
    finishedItems = serializers.IntegerField(source="finished_items")
    errorCount = serializers.IntegerField(source="error_count")
    timeoutCount = serializers.IntegerField(source="timeout_count")
    totalTokens = serializers.IntegerField(source="total_tokens")
    estimatedCost = serializers.FloatField(source="estimated_cost")
    tags = serializers.ListField(child=serializers.CharField())
    scores = serializers.SerializerMethodField(help_text="Average score per evaluator.")

    class Meta:
        model = Run
        fields = [
            "id",
            "name",
            "file",
            "status",
            "mode",
            "tags",
            "timestamp",
            "startedAt",
            "finishedAt",
            "durationMs",
            "totalItems",
            "finishedItems",
            "errorCount",
            "timeoutCount",
            "totalTokens",
            "estimatedCost",
            "scores",
        ]

    def get_scores(self, run: Run) -> dict[str, float | None]:
        return {
            name: (values or {}).get("avg")
            for name, values in (run.summary.get("scores") or {}).items()
        }


class RunConfigSerializer(serializers.Serializer):
    runs = serializers.IntegerField()
    concurrency = serializers.IntegerField(allow_null=True)
    timeout = serializers.IntegerField(help_text="Milliseconds per item.")
    evaluators = serializers.ListField(child=serializers.CharField())
    dataset = serializers.JSONField(allow_null=True)


class ProgressSerializer(serializers.Serializer):
    totalItems = serializers.IntegerField()
    finishedItems = serializers.IntegerField()
    startedAt = serializers.DateTimeField(allow_null=True)
    finishedAt = serializers.DateTimeField(allow_null=True)


class TraceGapSerializer(serializers.Serializer):
    why = serializers.CharField()
    items = serializers.IntegerField()


class ServiceSpansSerializer(serializers.Serializer):
    linked = serializers.IntegerField(help_text="Items' traces their requests started.")
    noSpans = serializers.IntegerField(
        help_text="Of those, traces no span of their service joined."
    )
    incomplete = serializers.IntegerField(
        help_text="Traces with spans, but not their service's span under each of the item's "
        "requests (its root, which ends last)."
    )
    waitedS = serializers.FloatField(
        allow_null=True, help_text="How long the run's OTLP receiver waited after the last item."
    )
    receiver = serializers.CharField(
        allow_null=True, help_text="Where the run's OTLP receiver listened (base URL)."
    )
    serve = serializers.CharField(
        allow_null=True, help_text="Where the project's `cobalt serve` listened then (base URL)."
    )
    note = serializers.CharField(
        allow_null=True, help_text="The warning the run's summary shows; null when none."
    )


class RunDetailSerializer(serializers.Serializer):
    """The header of the run's results file, plus progress and the failure reason."""

    id = serializers.CharField()
    name = serializers.CharField()
    timestamp = serializers.CharField(help_text="ISO 8601, UTC.")
    status = serializers.ChoiceField(choices=Run.Status.choices)
    file = serializers.CharField(allow_blank=True)
    tags = serializers.ListField(child=serializers.CharField())
    gitCommit = serializers.CharField(allow_null=True)
    parentRunId = serializers.CharField(allow_null=True)
    sweep = serializers.DictField(
        required=False,
        help_text="A variant's run of a sweep: {id, variant: {label, values}} (/api/sweeps/ID/).",
    )
    replay = serializers.ChoiceField(
        choices=["recorded", "replayed"],
        allow_null=True,
        help_text="The agent's model calls were recorded, replayed (--replay), or live (null).",
    )
    config = RunConfigSerializer()
    traceNotCaptured = TraceGapSerializer(
        many=True,
        help_text="Why some items' traces were not captured, with how many items each (empty "
        "when every trace was): their evaluators that read the trace gave errors.",
    )
    serviceSpans = ServiceSpansSerializer(
        allow_null=True,
        help_text="An HTTP target's run (null for others): how many of its items' traces did "
        "not get their service's spans (exported over OTLP) by the time its receiver closed.",
    )
    summary = serializers.JSONField(help_text="Statistics per evaluator, totals, cost.")
    labels = LabelSummarySerializer(help_text="People's labels of the run's items, now.")
    calibration = serializers.JSONField(
        help_text="Per judge: agreement with people's labels (n, confusion matrix, Cohen's κ "
        "and 95% interval, TPR/TNR with Wilson lower bounds), its certificate, and the pass "
        "rate corrected for its errors (`correctedPassRate`)."
    )
    progress = ProgressSerializer()
    failure = serializers.CharField(allow_blank=True)


class EvaluationSerializer(serializers.Serializer):
    score = serializers.FloatField(allow_null=True)
    verdict = serializers.ChoiceField(
        choices=[v.value for v in Verdict if v is not Verdict.NONE],
        help_text="Against the evaluator's pass mark (pass_threshold, 0.5 unless set): pass, "
        "borderline (passes by less than 0.1), fail, or error (the evaluation errored).",
    )
    reason = serializers.CharField(required=False, allow_blank=True)
    error = serializers.CharField(required=False, allow_blank=True)
    cached = serializers.BooleanField(required=False)


class ItemOutputSerializer(serializers.Serializer):
    output = serializers.JSONField(allow_null=True)
    metadata = serializers.JSONField()


class TraceStepSerializer(serializers.Serializer):
    """One step of an item's trace: a model call, a tool call or another span."""

    name = serializers.CharField()
    kind = serializers.ChoiceField(choices=["llm", "tool", "agent", "retrieval", "other"])
    parent = serializers.IntegerField(allow_null=True, help_text="Index of the parent step.")
    startMs = serializers.FloatField(help_text="Since the item started.")
    durationMs = serializers.FloatField(allow_null=True)
    model = serializers.CharField(allow_null=True)
    inputTokens = serializers.IntegerField(allow_null=True)
    outputTokens = serializers.IntegerField(allow_null=True)
    cost = serializers.FloatField(allow_null=True)
    status = serializers.ChoiceField(choices=["ok", "error"], allow_null=True)
    error = serializers.CharField(allow_null=True)
    input = serializers.CharField(allow_null=True, help_text="Truncated; secrets removed.")
    output = serializers.CharField(allow_null=True, help_text="Truncated; secrets removed.")


class JudgeTurnSerializer(serializers.Serializer):
    prompt = serializers.CharField(help_text="What the judge was sent (the user message).")
    reply = serializers.CharField(allow_blank=True, help_text="What it answered.")
    promptChars = serializers.IntegerField(required=False, help_text="Its length when cut.")
    replyChars = serializers.IntegerField(required=False, help_text="Its length when cut.")


class JudgeCallSerializer(serializers.Serializer):
    provider = serializers.CharField()
    model = serializers.CharField()
    system = serializers.CharField(allow_blank=True)
    systemChars = serializers.IntegerField(required=False, help_text="Its length when cut.")
    calls = JudgeTurnSerializer(
        many=True,
        help_text="One, or two when the first reply was not usable JSON; a pairwise judge's "
        "two orders; the first four of an evaluation library's calls.",
    )
    via = serializers.CharField(
        required=False,
        help_text="Who made the calls when several made one judgement (`DeepEval's GEval`, "
        "`the pairwise judge, asked in both orders`).",
    )
    count = serializers.IntegerField(
        required=False, help_text="How many calls were made in all, when more than were kept."
    )


class JudgedEvaluationSerializer(EvaluationSerializer):
    judgeCall = JudgeCallSerializer(
        required=False,
        help_text="A judge's own call (each text capped, secrets removed); a cached "
        "evaluation shows the call that produced it.",
    )


class ItemSerializer(serializers.Serializer):
    """One item result, as in the results file, with its id."""

    id = serializers.IntegerField(help_text="The item result's id (its labels' `itemId`).")
    index = serializers.IntegerField()
    runIndex = serializers.IntegerField()
    key = serializers.CharField()
    status = serializers.ChoiceField(choices=ItemResult.Status.choices)
    verdict = serializers.ChoiceField(
        choices=[v.value for v in Verdict],
        help_text="fail when any evaluation failed; pass (or borderline) when every scored one "
        "passed; error when the item errored or timed out, or its evaluations only errored; "
        "none without evaluations.",
    )
    error = serializers.CharField(allow_null=True)
    input = serializers.JSONField()
    output = ItemOutputSerializer()
    latencyMs = serializers.FloatField(allow_null=True)
    tokens = serializers.IntegerField()
    cost = serializers.FloatField()
    evaluations = serializers.DictField(child=JudgedEvaluationSerializer())
    trace = TraceStepSerializer(many=True)
    traceNotCaptured = serializers.CharField(
        allow_null=True,
        help_text="Why the trace was not captured (tracing off, an SDK its instrumentation "
        "does not support, an error while capturing); null when it was. Evaluators that read "
        "the trace then give an error, never a score.",
    )
    labels = LabelSerializer(many=True, help_text="People's labels of the item, now.")


class ItemDetailSerializer(ItemSerializer):
    evaluations = serializers.DictField(child=JudgedEvaluationSerializer())


class RunRefSerializer(serializers.Serializer):
    id = serializers.CharField()
    name = serializers.CharField()
    createdAt = serializers.CharField()


class EvaluatorDeltaSerializer(serializers.Serializer):
    a = serializers.FloatField(allow_null=True)
    b = serializers.FloatField(allow_null=True)
    delta = serializers.FloatField(allow_null=True)


class CostSerializer(serializers.Serializer):
    a = serializers.FloatField()
    b = serializers.FloatField()


class ItemChangeSerializer(serializers.Serializer):
    key = serializers.CharField()
    indexA = serializers.IntegerField()
    indexB = serializers.IntegerField()
    evaluator = serializers.CharField()
    a = serializers.FloatField()
    b = serializers.FloatField()
    delta = serializers.FloatField()


class IntervalSerializer(serializers.Serializer):
    low = serializers.FloatField()
    high = serializers.FloatField()
    level = serializers.FloatField()
    method = serializers.CharField(help_text="bootstrap, t, or exact (every difference equal).")


class McNemarTableSerializer(serializers.Serializer):
    passPass = serializers.IntegerField()
    passFail = serializers.IntegerField()
    failPass = serializers.IntegerField()
    failFail = serializers.IntegerField()


class SignificanceSerializer(serializers.Serializer):
    """One evaluator's paired test of B against A over the items both scored (by key)."""

    n = serializers.IntegerField(help_text="Items scored in both runs.")
    kind = serializers.CharField(help_text="score, or pass/fail when every value is 0 or 1.")
    test = serializers.CharField(help_text="wilcoxon (signed-rank) or mcnemar.")
    meanA = serializers.FloatField(allow_null=True)
    meanB = serializers.FloatField(allow_null=True)
    delta = serializers.FloatField(allow_null=True, help_text="Mean difference B − A.")
    ci = IntervalSerializer(allow_null=True, help_text="Interval of the mean difference.")
    pValue = serializers.FloatField(allow_null=True)
    alpha = serializers.FloatField()
    verdict = serializers.CharField(
        help_text="regressed, improved, no significant change, or not enough data."
    )
    table = McNemarTableSerializer(allow_null=True, help_text="pass/fail only.")
    onlyInA = serializers.IntegerField(help_text="Items scored only in A.")
    onlyInB = serializers.IntegerField(help_text="Items scored only in B.")
    onlyInAKeys = serializers.ListField(child=serializers.CharField())
    onlyInBKeys = serializers.ListField(child=serializers.CharField())


class StripFiguresSerializer(serializers.Serializer):
    """One run's column of the verdict strip, from its stored summary."""

    id = serializers.CharField()
    name = serializers.CharField()
    items = serializers.IntegerField()
    errors = serializers.IntegerField(allow_null=True)
    timeouts = serializers.IntegerField(allow_null=True)
    latencyP50 = serializers.FloatField(allow_null=True, help_text="Milliseconds.")
    latencyP95 = serializers.FloatField(allow_null=True, help_text="Milliseconds.")
    tokens = serializers.IntegerField(allow_null=True)
    cost = serializers.FloatField(allow_null=True, help_text="Estimated, in dollars.")
    passRates = serializers.DictField(
        child=serializers.FloatField(allow_null=True),
        help_text="Per evaluator, the share of scored evaluations at or above its pass mark.",
    )


class StripEvaluatorSerializer(serializers.Serializer):
    name = serializers.CharField()
    passRateA = serializers.FloatField(allow_null=True)
    passRateB = serializers.FloatField(allow_null=True)
    delta = serializers.FloatField(allow_null=True)
    verdict = serializers.CharField(allow_null=True, help_text="Of the paired test.")
    pValue = serializers.FloatField(allow_null=True)
    test = serializers.CharField(allow_null=True)


class StripDeltasSerializer(serializers.Serializer):
    items = serializers.IntegerField(allow_null=True)
    errors = serializers.IntegerField(allow_null=True)
    timeouts = serializers.IntegerField(allow_null=True)
    latencyP50 = serializers.FloatField(allow_null=True)
    latencyP95 = serializers.FloatField(allow_null=True)
    tokens = serializers.IntegerField(allow_null=True)
    cost = serializers.FloatField(allow_null=True)


class StripColumnSerializer(StripFiguresSerializer):
    label = serializers.CharField(help_text="B, or B1, B2… when several runs are compared.")
    deltas = StripDeltasSerializer(help_text="This run less the baseline.")
    evaluators = StripEvaluatorSerializer(many=True)
    wins = serializers.ListField(child=serializers.CharField())
    losses = serializers.ListField(child=serializers.CharField())
    sentence = serializers.CharField(help_text="Where this run wins and loses, in words.")


class VerdictStripSerializer(serializers.Serializer):
    """Is B better than A: items, errors, timeouts, pass rates, latency, tokens and cost of
    each run with their changes, and a sentence naming the significant ones."""

    baseline = StripFiguresSerializer()
    evaluators = serializers.ListField(child=serializers.CharField())
    runs = StripColumnSerializer(many=True)


class CompareSerializer(serializers.Serializer):
    strip = VerdictStripSerializer()
    runA = RunRefSerializer()
    runB = RunRefSerializer()
    evaluators = serializers.DictField(child=EvaluatorDeltaSerializer())
    cost = CostSerializer()
    matchedItems = serializers.IntegerField()
    onlyInA = serializers.ListField(child=serializers.CharField())
    onlyInB = serializers.ListField(child=serializers.CharField())
    regressions = ItemChangeSerializer(many=True)
    improvements = ItemChangeSerializer(many=True)
    regressionCount = serializers.IntegerField()
    improvementCount = serializers.IntegerField()
    alpha = serializers.FloatField()
    significance = serializers.DictField(child=SignificanceSerializer())


class CompareQuerySerializer(serializers.Serializer):
    a = serializers.CharField(max_length=32, help_text="Baseline run id (or unique prefix).")
    b = serializers.CharField(max_length=32, help_text="Candidate run id (or unique prefix).")
    top = serializers.IntegerField(
        min_value=1, max_value=100, default=10, help_text="Items per direction."
    )
    alpha = serializers.FloatField(
        default=0.05,
        min_value=1e-6,
        max_value=0.5,
        help_text="Significance level of the paired tests (verdicts).",
    )


class TrendsQuerySerializer(serializers.Serializer):
    experiment = serializers.CharField(
        required=False, max_length=200, help_text="Experiment name (exact)."
    )
    tag = serializers.CharField(required=False, max_length=100)
    evaluator = serializers.CharField(required=False, max_length=100)
    limit = serializers.IntegerField(
        min_value=1, max_value=1000, default=100, help_text="Latest completed runs to include."
    )


class TrendScoreSerializer(serializers.Serializer):
    avg = serializers.FloatField(allow_null=True)
    min = serializers.FloatField(allow_null=True)
    max = serializers.FloatField(allow_null=True)
    p50 = serializers.FloatField(allow_null=True)
    p95 = serializers.FloatField(allow_null=True)
    p99 = serializers.FloatField(allow_null=True)
    stddev = serializers.FloatField(allow_null=True)
    passRate = serializers.FloatField(allow_null=True)
    count = serializers.IntegerField(allow_null=True)
    errors = serializers.IntegerField(allow_null=True)


class TrendPointSerializer(serializers.Serializer):
    runId = serializers.CharField()
    timestamp = serializers.CharField()
    tags = serializers.ListField(child=serializers.CharField())
    totalItems = serializers.IntegerField()
    errors = serializers.IntegerField()
    estimatedCost = serializers.FloatField()
    avgLatencyMs = serializers.FloatField(allow_null=True)
    scores = serializers.DictField(
        child=TrendScoreSerializer(), help_text="Per evaluator, as stored at finalisation."
    )


class TrendSeriesSerializer(serializers.Serializer):
    experiment = serializers.CharField()
    evaluators = serializers.ListField(child=serializers.CharField())
    points = TrendPointSerializer(many=True)


class TrendsSerializer(serializers.Serializer):
    series = TrendSeriesSerializer(many=True)


class ExperimentInfoSerializer(serializers.Serializer):
    name = serializers.CharField()
    tags = serializers.ListField(child=serializers.CharField())
    evaluators = serializers.ListField(child=serializers.CharField())
    datasetSize = serializers.IntegerField()
    runs = serializers.IntegerField()
    concurrency = serializers.IntegerField(allow_null=True)
    timeout = serializers.FloatField(allow_null=True)


class ExperimentFileSerializer(serializers.Serializer):
    file = serializers.CharField(help_text="Relative to the project folder.")
    experiments = ExperimentInfoSerializer(many=True)
    error = serializers.CharField(allow_null=True, help_text="Why the file failed to import.")


class ExperimentsSerializer(serializers.Serializer):
    testDir = serializers.CharField()
    files = ExperimentFileSerializer(many=True)


class ConfigSerializer(serializers.Serializer):
    projectDir = serializers.CharField()
    configFile = serializers.CharField(allow_null=True)
    sources = serializers.ListField(child=serializers.CharField())
    teamMode = serializers.BooleanField()
    config = serializers.JSONField(help_text="Secrets replaced by ***.")


class StartRunSerializer(serializers.Serializer):
    """`file` must be an experiment file under the test directory, inside the project."""

    file = serializers.CharField(
        max_length=500, help_text="Experiment file, relative to the project folder."
    )
    filter = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=200,
        help_text="Experiment name (or glob) when the file registers several.",
    )
    concurrency = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_CONCURRENCY
    )
    maxLlmCalls = serializers.IntegerField(  # noqa: N815 - the API's camelCase
        required=False, allow_null=True, min_value=1, help_text="Per item: model calls at most."
    )
    maxToolCalls = serializers.IntegerField(  # noqa: N815
        required=False, allow_null=True, min_value=1, help_text="Per item: tool calls at most."
    )
    maxTokens = serializers.IntegerField(  # noqa: N815
        required=False, allow_null=True, min_value=1, help_text="Per item: tokens at most."
    )
    maxCost = serializers.FloatField(  # noqa: N815
        required=False, allow_null=True, min_value=0.000001, help_text="Per item: dollars."
    )
    tags = serializers.ListField(
        child=serializers.CharField(max_length=100), required=False, max_length=50, default=list
    )

    @property
    def config(self) -> Config:
        return self.context["config"]

    def validate_file(self, value: str) -> Path:
        config = self.config
        if "\x00" in value:
            raise serializers.ValidationError("the path contains a NUL character")
        try:
            path = discovery.runnable_file(value, config, what="file")
        except (discovery.FileRefused, FileNotFoundError) as exc:
            raise serializers.ValidationError(str(exc)) from None
        return path

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        path: Path = attrs["file"]
        name_filter = attrs.get("filter") or None
        experiments, errors, _ = launcher.load_experiments(self.config, [str(path)])
        shown = _relative(path, self.config)
        if errors:
            raise serializers.ValidationError(
                {"file": [f"{shown} failed to import: {errors[0].error}"]}
            )
        names = [e.name for e in experiments]
        if not experiments:
            raise serializers.ValidationError(
                {"file": [f"{shown} registers no experiment; call experiment(...) in it"]}
            )
        attrs["experiment"] = self._choose(experiments, name_filter, names, shown)
        return attrs

    @staticmethod
    def _choose(
        experiments: list[Experiment], name_filter: str | None, names: list[str], shown: str
    ) -> Experiment:
        exact = [e for e in experiments if e.name == name_filter]
        chosen = exact or [e for e in experiments if launcher.name_matches(e, name_filter)]
        if len(chosen) == 1:
            return chosen[0]
        listed = ", ".join(repr(n) for n in names)
        if not chosen:
            raise serializers.ValidationError(
                {
                    "filter": [
                        f"no experiment in {shown} matches {name_filter!r}; it registers {listed}"
                    ]
                }
            )
        raise serializers.ValidationError(
            {
                "filter": [
                    f"{shown} registers {len(chosen)} matching experiments ({listed}); "
                    "pass `filter` with one name"
                ]
            }
        )


class StartedRunSerializer(serializers.Serializer):
    id = serializers.CharField()
    name = serializers.CharField()
    file = serializers.CharField()
    status = serializers.CharField()
    url = serializers.CharField(help_text="Poll this for progress and the summary.")


def _relative(path: Path, config: Config) -> str:
    try:
        return path.relative_to(config.project_dir.resolve()).as_posix()
    except ValueError:
        return str(path)
