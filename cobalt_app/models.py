"""What Cobalt stores: runs, the item results of a run, their evaluations, the judge cache."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

from django.db import models
from django.utils import timezone


def new_run_id() -> str:
    return secrets.token_hex(6)


class Sweep(models.Model):
    """One experiment run once per variant over the same items (`cobalt.variants`): its runs
    are ordinary runs pointing here. `summary` holds the last analysis (`sweeps.settle`),
    computed once after its runs finished and again when one of them changed."""

    id = models.CharField(primary_key=True, max_length=32, default=new_run_id, editable=False)
    name = models.CharField(max_length=200)
    file = models.CharField(max_length=500, blank=True)
    variants = models.JSONField(default=list, help_text="[{label, values}] in declared order.")
    default_label = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    summary = models.JSONField(default=dict, blank=True)
    analysed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["name", "-created_at"], name="sweep_name_created")]

    def __str__(self) -> str:
        return f"sweep {self.name} ({self.id})"


class Run(models.Model):
    """One execution of one experiment over its dataset."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"
        INTERRUPTED = "interrupted"  # its process vanished (see cobalt_app/liveness.py)

    # Nothing executes these any more (an interrupted run goes on only with `--resume`).
    FINISHED = (Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.INTERRUPTED)

    class Mode(models.TextChoices):
        EMBEDDED = "embedded"
        TEAM = "team"

    id = models.CharField(primary_key=True, max_length=32, default=new_run_id, editable=False)
    name = models.CharField(max_length=200)
    file = models.CharField(max_length=500, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.EMBEDDED)
    tags = models.JSONField(default=list, blank=True)
    config = models.JSONField(default=dict, blank=True, help_text="Settings and evaluators used.")
    summary = models.JSONField(default=dict, blank=True, help_text="Statistics at finalisation.")
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="rejudged_runs",
        help_text="The run whose outputs this run scored again.",
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(
        null=True, blank=True, help_text="Last sign of life of the process executing it here."
    )
    duration_ms = models.FloatField(null=True, blank=True)
    total_items = models.PositiveIntegerField(default=0)
    finished_items = models.PositiveIntegerField(default=0)
    error_count = models.PositiveIntegerField(default=0)
    timeout_count = models.PositiveIntegerField(default=0)
    total_tokens = models.BigIntegerField(default=0)
    estimated_cost = models.FloatField(default=0.0)
    git_commit = models.CharField(max_length=64, blank=True)
    results_path = models.CharField(max_length=500, blank=True)
    failure = models.TextField(blank=True, help_text="Why the run failed, when it did.")
    sweep = models.ForeignKey(
        Sweep, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    variant = models.JSONField(
        null=True, blank=True, help_text="The variant's label and values, in a sweep."
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["-created_at"], name="run_created"),
            models.Index(fields=["name", "-created_at"], name="run_name_created"),
            models.Index(fields=["status"], name="run_status"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED

    @property
    def evaluator_names(self) -> list[str]:
        return [e["name"] for e in self.config.get("evaluators", [])]


class RunTag(models.Model):
    """A tag of a run, kept as rows so runs filter by tag with an index on any database."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tag_rows")
    name = models.CharField(max_length=100)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "name"], name="runtag_unique")]
        indexes = [models.Index(fields=["name", "run"], name="runtag_name")]

    def __str__(self) -> str:
        return self.name


class ItemResult(models.Model):
    """One dataset item × one repetition of a run: the item snapshot and what the agent did."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        OK = "ok"
        ERROR = "error"
        TIMEOUT = "timeout"
        CANCELLED = "cancelled"

    FINISHED = (Status.OK, Status.ERROR, Status.TIMEOUT, Status.CANCELLED)

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="items")
    item_index = models.PositiveIntegerField()
    run_index = models.PositiveIntegerField(default=0)
    item_key = models.CharField(max_length=200, help_text="The item's `id`, or a content hash.")
    input = models.JSONField(help_text="The dataset item as it was when the run was created.")
    output = models.JSONField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    error = models.TextField(blank=True)
    traceback = models.TextField(blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    tokens = models.PositiveIntegerField(default=0)
    cost = models.FloatField(default=0.0)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    worker = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["run", "item_index", "run_index"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "item_index", "run_index"], name="itemresult_unique"
            )
        ]
        indexes = [
            models.Index(fields=["run", "status"], name="item_run_status"),
            models.Index(fields=["run", "item_key"], name="item_run_key"),
            models.Index(fields=["run", "latency_ms"], name="item_run_latency"),
            # The sweeper's (`team.sweep`: running items whose lease ran out). Only running
            # items are in it: a claim adds an item and its record takes it out, where an
            # index of every item's (status, lease) changed twice at each (issue 41).
            models.Index(
                fields=["lease_expires_at"],
                condition=models.Q(status="running"),
                name="item_lease_running",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} #{self.number}" + (
            f" run {self.run_index + 1}" if self.run_index else ""
        )

    @property
    def number(self) -> int:
        """The item's number for people: 1-based (`item_index` is 0-based, as in results)."""
        return self.item_index + 1

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED


class Evaluation(models.Model):
    """One evaluator's verdict on one item result. An error is an error, never a score of 0."""

    class Status(models.TextChoices):
        OK = "ok"
        ERROR = "error"

    item = models.ForeignKey(ItemResult, on_delete=models.CASCADE, related_name="evaluations")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="evaluations")
    evaluator = models.CharField(max_length=100)
    score = models.FloatField(null=True, blank=True)
    reason = models.TextField(blank=True)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.OK)
    error = models.TextField(blank=True)
    cached = models.BooleanField(default=False)
    tokens = models.PositiveIntegerField(default=0)
    cost = models.FloatField(default=0.0)
    chain_of_thought = models.TextField(
        blank=True, default="", db_default="", help_text="The judge's step-by-step reasoning."
    )
    unpriced_model = models.CharField(
        max_length=200,
        blank=True,
        default="",
        db_default="",
        help_text="The model whose tokens it spent and that has no price (its cost counts 0).",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["item", "evaluator"], name="evaluation_unique")
        ]
        indexes = [models.Index(fields=["run", "evaluator", "score"], name="eval_run_score")]

    def __str__(self) -> str:
        return f"{self.evaluator}={self.score}"


class ItemTrace(models.Model):
    """The steps (model calls, tool calls, other spans) an item's agent took, one JSON list
    in the results-file shape (see `trace_spans`), stored compressed by `blob_store`: written
    and read through `trace_store`. A table of its own: the pages that list items never read
    it; only items that produced spans, or whose trace was not captured, have a row."""

    item = models.OneToOneField(
        ItemResult, primary_key=True, on_delete=models.CASCADE, related_name="trace"
    )
    data = models.BinaryField()
    blobs = models.BinaryField(default=b"")  # the sha256 of each blob `data` refers to
    missing = models.TextField(
        blank=True, help_text="Why the trace was not captured (see `traces`); empty if it was."
    )
    estimated = models.TextField(
        blank=True,
        default="",
        help_text="The model calls that reported no usage, whose tokens were counted or "
        "estimated (see `token_counts`), as JSON; empty if none.",
    )

    def __str__(self) -> str:
        return f"trace of item {self.item_id}"


class RunScoreTable(models.Model):
    """What comparing a run needs, stored once when it is finalised (see `score_tables`): its
    item keys, each evaluator's score per key and each key's status, as one numpy archive;
    how many items its failures view lists, per evaluator, and in which order."""

    run = models.OneToOneField(
        Run, primary_key=True, on_delete=models.CASCADE, related_name="score_table"
    )
    format = models.PositiveSmallIntegerField()
    data = models.BinaryField()
    failing = models.JSONField(
        default=dict, help_text="Items with a failing verdict, per evaluator ('' for any)."
    )
    failing_order = models.BinaryField(
        default=b"",
        help_text="The ids of the items with a failing verdict, in the failures view's order "
        "(int64, little-endian).",
    )

    def __str__(self) -> str:
        return f"score table of run {self.run_id}"


class JudgeCacheEntry(models.Model):
    """A judge (or embedding) reply, keyed by SHA-256 of the canonical request."""

    key = models.CharField(primary_key=True, max_length=64)
    provider = models.CharField(max_length=32)
    model = models.CharField(max_length=200)
    value = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "judge cache entries"
        indexes = [models.Index(fields=["expires_at"], name="cache_expires")]

    def __str__(self) -> str:
        return f"{self.provider}/{self.model} {self.key[:12]}"


class Recording(models.Model):
    """The model-provider HTTP exchanges of one item's agent (one repetition), recorded by
    `cobalt run --record` and served back by `--replay` (see `cobalt_app.recordings`).

    Keyed by experiment name, item key and repetition, so a later run of the same experiment
    finds it. Its exchanges, a JSON list of {request, response} without any header of the
    request (no API key, no Authorization), are stored compressed by `blob_store`: written
    and read through `recording_store`."""

    experiment = models.CharField(max_length=200)
    item_key = models.CharField(max_length=200)
    run_index = models.IntegerField(default=0)
    data = models.BinaryField()
    blobs = models.BinaryField(default=b"")  # the sha256 of each blob `data` refers to
    request_count = models.IntegerField(default=0)
    recorded_by = models.CharField(max_length=32, blank=True)  # the run that recorded it last
    recorded_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["experiment", "item_key", "run_index"], name="recording_item"
            )
        ]
        indexes = [models.Index(fields=["recorded_at"], name="recording_recorded_at")]

    def __str__(self) -> str:
        return f"{self.experiment} {self.item_key} #{self.run_index}"


class Blob(models.Model):
    """A large value that traces and recordings share (a system prompt, a tools array),
    stored once: its JSON text, zstd-compressed, keyed by the text's sha256 (`blob_store`)."""

    sha256 = models.CharField(max_length=64, primary_key=True)
    data = models.BinaryField()

    def __str__(self) -> str:
        return f"blob {self.sha256[:12]}"


class Label(models.Model):
    """A person's verdict on one evaluation of one output: pass or fail, optionally a corrected
    score and a corrected expected output, and a note.

    A label is about the output it was given on, not about a row of one run: it is keyed by
    experiment, item key and a hash of the output (`labels.output_hash`), so it comes back
    when the same output does (a re-judge, a replayed or cached run) and reads as stale when
    the output changed. Each reviewer has their own label (never averaged away); `version`
    counts edits, so a save that did not see the latest one is refused, not lost."""

    class Verdict(models.TextChoices):
        PASS = "pass"
        FAIL = "fail"

    experiment = models.CharField(max_length=200)
    item_key = models.CharField(max_length=200)
    output_hash = models.CharField(max_length=64)
    evaluator = models.CharField(max_length=100)
    reviewer = models.CharField(max_length=150)
    verdict = models.CharField(max_length=8, choices=Verdict.choices)
    score = models.FloatField(null=True, blank=True, help_text="A corrected score, 0..1.")
    expected_output = models.JSONField(
        null=True, blank=True, help_text="A corrected expected output (null: not corrected)."
    )
    note = models.TextField(blank=True)
    run = models.ForeignKey(
        Run,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="labels",
        help_text="The run it was given on.",
    )
    version = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["experiment", "item_key", "output_hash", "evaluator", "reviewer"],
                name="label_unique",
            )
        ]
        indexes = [models.Index(fields=["experiment", "item_key"], name="label_item")]

    def __str__(self) -> str:
        return f"{self.reviewer}: {self.evaluator}={self.verdict} ({self.item_key})"


class ReceivedTrace(models.Model):
    """A trace whose spans a service exported to the OTLP receiver (`otlp`): an item's, when
    an HTTP target's request carried its trace id (`item`, linked by `otlp.link_items`, in
    whichever order the spans and the item's result arrive), else a production trace."""

    trace_id = models.CharField(max_length=32, unique=True)
    item = models.ForeignKey(  # indexed by `received_item` (item, received_at)
        ItemResult,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="received_traces",
        db_index=False,
    )
    service = models.CharField(max_length=200, blank=True, db_index=True)
    name = models.CharField(max_length=500, blank=True)  # the root span's
    status = models.CharField(max_length=10, default="ok")  # ok | error (any span failed)
    start_ns = models.BigIntegerField(null=True, blank=True)  # of its first span, Unix ns
    end_ns = models.BigIntegerField(null=True, blank=True)  # of its last
    span_count = models.IntegerField(default=0)
    # An item's trace: the ids of its HTTP calls' client spans whose service has not sent the
    # span it made under them (its root, which ends last); complete when empty and span_count.
    awaiting = models.TextField(db_default="", blank=True)
    input = models.TextField(blank=True)  # the root span's (redacted, cut)
    output = models.TextField(blank=True)
    attributes = models.JSONField(default=dict, blank=True)  # the root span's (redacted)
    received_at = models.DateTimeField(default=timezone.now)
    tokens = models.BigIntegerField(
        db_default=0, help_text="Its model calls' tokens, counted in its item's."
    )
    cost = models.FloatField(
        db_default=0.0, help_text="Its model calls' cost, counted in its item's."
    )

    class Meta:
        indexes = [
            models.Index(fields=["item", "received_at"], name="received_item"),
            models.Index(fields=["received_at"], name="received_at"),
        ]

    def __str__(self) -> str:
        return f"trace {self.trace_id}"

    @property
    def started_at(self) -> datetime | None:
        if self.start_ns is None:
            return None
        return datetime.fromtimestamp(self.start_ns / 1e9, tz=UTC)

    @property
    def duration_ms(self) -> float | None:
        if self.start_ns is None or self.end_ns is None:
            return None
        return round((self.end_ns - self.start_ns) / 1e6, 3)


class ReceivedSpan(models.Model):
    """One received span as a stored step (`trace_spans.step_of`), with its ids to rebuild
    the service's span tree across export batches."""

    # Indexed by `received_span_once` (trace, span_id): one index less to write a span.
    trace = models.ForeignKey(
        ReceivedTrace, on_delete=models.CASCADE, related_name="spans", db_index=False
    )
    span_id = models.CharField(max_length=16)
    parent_span_id = models.CharField(max_length=16, blank=True)
    start_ns = models.BigIntegerField()
    step = models.JSONField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["trace", "span_id"], name="received_span_once")
        ]

    def __str__(self) -> str:
        return f"span {self.span_id}"


class JudgeCall(models.Model):
    """What an LLM judge was sent and answered for one evaluation (`item`, `evaluator`):
    `{"provider", "model", "system", "calls": [{"prompt", "reply"}]}`, each text capped and
    redacted (`storable.judge_call`). A table of its own, keyed like the evaluation, so the
    evaluation rows that pages aggregate stay narrow; only judged evaluations have a row."""

    item = models.ForeignKey(ItemResult, on_delete=models.CASCADE, related_name="judge_calls")
    evaluator = models.CharField(max_length=100)
    data = models.JSONField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["item", "evaluator"], name="judge_call_unique")
        ]

    def __str__(self) -> str:
        return f"judge call of {self.evaluator} on item {self.item_id}"


class RunFigures(models.Model):
    """What a finished run's page shows that would otherwise be counted over every verdict of
    the run on each visit, stored once when it is finalised (`run_figures`): the score
    histogram per evaluator, and each evaluator's failures view in its order."""

    run = models.OneToOneField(Run, primary_key=True, on_delete=models.CASCADE, related_name="+")
    histogram = models.JSONField(
        default=dict, help_text="Per evaluator, how many scores fall in each tenth of [0, 1]."
    )
    failing_at = models.JSONField(
        default=dict,
        help_text="Where each evaluator's items are in `failing_orders` ({'at': {name: [start, "
        "count]}}), and the pass marks they were ranked with ({'marks': {name: mark}}).",
    )
    failing_orders = models.BinaryField(
        default=b"",
        help_text="Each evaluator's failing items' ids in its failures view's order, one after "
        "another (int64, little-endian).",
    )

    def __str__(self) -> str:
        return f"figures of run {self.run_id}"


class SearchIndex(models.Model):
    """A finished run's search index (`run_search`), built by the dashboard off the item
    write path: the texts a search reads (SQLite: an FTS5 trigram table, PostgreSQL: a table
    with a trigram GIN index) and each short field's value per item (`ItemField`). Deleting
    the row deletes its texts (a trigger on SQLite, a foreign key on PostgreSQL)."""

    run = models.OneToOneField(Run, primary_key=True, on_delete=models.CASCADE, related_name="+")
    ready = models.BooleanField(default=False)
    finished_at = models.DateTimeField(
        null=True, help_text="The run's `finished_at` it was built for (a new one rebuilds it)."
    )
    started_at = models.DateTimeField(help_text="When its build was claimed.")
    keys = models.JSONField(
        default=dict,
        help_text="The fields in `ItemField`, each with whether some of its values were too long "
        "to keep.",
    )
    low = models.BigIntegerField(default=0, help_text="SQLite: the run's texts' first rowid.")
    high = models.BigIntegerField(default=-1, help_text="SQLite: the run's texts' last rowid.")
    shared = models.BooleanField(
        default=False,
        help_text="SQLite: other runs' items have ids between this run's (its texts are told "
        "apart by their run, a slower search).",
    )
    folded = models.BooleanField(
        default=False,
        help_text="SQLite: some text holds a character the trigram index folds to ASCII "
        "(`run_search.FOLDED`): every search compares the texts it finds again.",
    )

    def __str__(self) -> str:
        return f"search index of run {self.run_id}"


class ItemField(models.Model):
    """One item's value of a field the run's items are filtered and grouped by
    (`page_triage.field_value`'s text; None: the item has no such field), for a finished run
    whose `SearchIndex` is ready. Values longer than `run_search.LONG_VALUE` are not kept."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+", db_index=False)
    key = models.CharField(max_length=200)
    value = models.TextField(null=True)  # noqa: DJ001 - None: the item has no such field
    item_id = models.BigIntegerField()

    class Meta:
        indexes = [
            models.Index(fields=["run", "key", "value", "item_id"], name="item_field_value"),
        ]

    def __str__(self) -> str:
        return f"{self.key}={self.value} of item {self.item_id}"
