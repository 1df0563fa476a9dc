"""A run's finalisation and its results file (`.cobalt/results/<timestamp>_<name>_<id>.json`, or
`.jsonl`/`.gz` for big runs: `cobalt.results_file`).

The file follows the seed format (id, name, timestamp, tags, config, summary, items) and adds,
per item, `status`, `verdict`, `error` and `runIndex`; each evaluation has its `verdict`
(`cobalt.verdict`: against its evaluator's pass mark), a failed one is `{"score": null,
"verdict": "error", "error"}`. Each evaluator's summary `passRate` counts its own pass mark,
kept beside it as `passMark`.
People's labels (`cobalt_app.labels`) come beside the scores: each item's `labels`, and the
run's label counts as `labels` in the header, as they are when the document is written; each
judge's agreement with them, certificate and corrected pass rate as `calibration`
(`cobalt_app.calibration`), by evaluator.
The summary (`run_summary`) is computed once, at finalisation, and stored on the run. The
file is written from chunked reads, a few hundred items in memory at a time.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.db import connection, transaction
from django.db.models.expressions import RawSQL
from django.utils import timezone

from cobalt import results_file, verdict
from cobalt.run_settings import RunSettings
from cobalt_app import calibration, labels, recordings, storable, trace_store
from cobalt_app.models import Evaluation, ItemResult, JudgeCall, Run
from cobalt_app.results_json import entry_line, json_text
from cobalt_app.run_summary import compute_summary
from cobalt_app.selectors import FAILED

if TYPE_CHECKING:
    from cobalt_app.engine import ItemOutcome

EXPORT_CHUNK = 2000


def run_finalise(run_id: str, *, status: str | None = None) -> Run:
    """Compute and store the run's summary and its final status (the results file is written
    where the run was started: `runs.lifecycle.write_results`)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(id=run_id)
        if run.finished_at is None:
            run.finished_at = timezone.now()
        if status is None:
            status = Run.Status.COMPLETED
        run.status = status
        summary = compute_summary(run)
        run.summary = summary
        run.duration_ms = summary["totalDurationMs"]
        run.error_count = summary["errors"]
        run.timeout_count = summary["timeouts"]
        run.total_tokens = summary["totalTokens"]
        run.estimated_cost = summary["estimatedCost"]
        run.save()
    from cobalt_app import failing_ranks, run_figures, score_tables  # numpy: when a run ends

    ranks = failing_ranks.of_finished(run_id)  # ranked once for both
    score_tables.store(run_id, ranks)
    run_figures.store(run_id, ranks)
    return run


def refresh_totals(run_ids: Iterable[str]) -> None:
    """Store again the summary of these runs, those that have finished: their items' tokens and
    cost grew after the end (a service's spans, `received.count_usage`)."""
    for run in Run.objects.filter(id__in=list(run_ids), finished_at__isnull=False):
        summary = compute_summary(run)
        Run.objects.filter(id=run.id).update(
            summary=summary,
            total_tokens=summary["totalTokens"],
            estimated_cost=summary["estimatedCost"],
        )


def trace_gaps(run: Run) -> list[dict[str, Any]]:
    """Why the run's items' traces were not captured (see `trace_store.not_captured`): from
    its summary once finished, read while it runs."""
    if run.is_finished and "traceNotCaptured" in (run.summary or {}):
        return run.summary["traceNotCaptured"]
    return trace_store.not_captured(run.id)


def run_header(run: Run) -> dict[str, Any]:
    config = run.config or {}
    settings = RunSettings.from_run_config(config)
    return {
        "id": run.id,
        "name": run.name,
        "timestamp": iso(run.created_at),
        "status": run.status,
        "file": run.file,
        "tags": run.tags,
        "gitCommit": run.git_commit or None,
        "parentRunId": run.parent_id,
        "replay": recordings.label(config.get("replay")),
        "traceNotCaptured": trace_gaps(run),
        "serviceSpans": (run.summary or {}).get("serviceSpans"),
        "config": {
            "runs": settings.runs,
            "concurrency": config.get("concurrency"),
            "timeout": int(settings.timeout * 1000),
            "evaluators": [e["name"] for e in config.get("evaluators", [])],
            "dataset": config.get("dataset"),
        },
        "summary": run.summary,
        # A variant's run of a sweep (`cobalt.variants`): the sweep and the variant's values.
        **({"sweep": {"id": run.sweep_id, "variant": run.variant}} if run.sweep_id else {}),
    }


ITEM_FIELDS = (
    "id",
    "item_index",
    "run_index",
    "item_key",
    "status",
    "error",
    "input",
    "output",
    "metadata",
    "latency_ms",
    "tokens",
    "cost",
)
# An item as the reporter sees it (`engine.ItemOutcome`): no input, but how it ended.
OUTCOME_FIELDS = (
    *(name for name in ITEM_FIELDS if name != "input"),
    "traceback",
    "started_at",
    "finished_at",
)
EVALUATION_FIELDS = (
    "item_id",
    "evaluator",
    "score",
    "reason",
    "status",
    "error",
    "cached",
    "chain_of_thought",
    "unpriced_model",
)


def evaluation_entry(
    score, reason, status, error, cached, chain_of_thought="", unpriced_model="", *, mark=None
) -> dict[str, Any]:
    """One evaluation of an item entry, with its `verdict` against the evaluator's pass mark."""
    if status == Evaluation.Status.OK:
        judged = verdict.evaluation_verdict(score, mark)
        entry: dict[str, Any] = {"score": score, "verdict": judged, "reason": reason}
        if chain_of_thought:
            entry["chainOfThought"] = chain_of_thought
    else:
        entry = {"score": None, "verdict": verdict.Verdict.ERROR, "error": error}
    if cached:
        entry["cached"] = True
    if unpriced_model:
        entry["unpricedModel"] = unpriced_model
    return entry


def row_verdict(row: tuple, evaluations: dict[str, Any]) -> verdict.Verdict:
    """The verdict of an item's `ITEM_FIELDS` row from its evaluations' (`verdict.item_verdict`)."""
    # Already `Verdict`s (`evaluation_entry`): converting each again was a tenth of a
    # results file's CPU (issue 41).
    return verdict.item_verdict(
        [e["verdict"] for e in evaluations.values()], errored=row[4] in FAILED
    )


def row_entry(
    row: tuple,
    evaluations: dict[str, Any],
    trace: trace_store.Trace | None = None,
) -> dict[str, Any]:
    """An item's entry from its `ITEM_FIELDS` row (JSON columns as text or decoded), with its
    `verdict` (`row_verdict`)."""
    decode = storable.from_json
    _, index, repetition, key, status, error, item, output, metadata, latency, tokens, cost = row
    judged = row_verdict(row, evaluations)
    return {
        "index": index,
        "runIndex": repetition,
        "key": key,
        "status": status,
        "verdict": judged,
        "error": error or None,
        "input": decode(item),
        "output": {"output": decode(output), "metadata": decode(metadata)},
        "latencyMs": latency,
        "tokens": tokens,
        "cost": cost,
        "evaluations": evaluations,
        "trace": decode(trace.steps) if trace else [],
        "traceNotCaptured": trace.missing or None if trace else None,
    }


def iter_item_entries(
    run: Run,
    *,
    ids: Iterable[int] | None = None,
    keys: Iterable[str] | None = None,
    first_repetition: bool = False,
    labelled: dict[int, list[dict[str, Any]]] | None = None,
    with_id: bool = False,
    as_lines: bool = False,
) -> Iterator[dict[str, Any]] | Iterator[str]:
    """Result entries of a run's items (only those of `ids`, or of `keys`, or only the first
    repetitions, when given), in order, each with its `labels` (`labelled`: already read
    with `labels.labels_by_item`; else read once here, one query when the run has none),
    and with the item result's database `id` if `with_id` (the API: labels name items by it);
    `as_lines`: each entry as its line of JSON text (`results_json.entry_line`), for the
    results file.

    Reads plain rows in chunks with plain cursors, not model instances: a run can hold a
    million items, and its results file is written whenever it ends.
    """
    where, params = ["run_id = %s"], [run.id]
    ids = None if ids is None else list(ids)
    for column, values in (("id", ids), ("item_key", keys)):
        if values is not None:
            values = list(values)
            if not values:
                return
            where.append(f"{column} IN ({', '.join(['%s'] * len(values))})")
            params += values
    if first_repetition:
        where.append("run_index = 0")
    marks = verdict.pass_marks((run.config or {}).get("evaluators", []))
    known: dict[tuple, Encoded] = {}  # `_lines`: evaluations encoded
    if labelled is None:
        labelled = labels.labels_by_item(run, item_ids=ids)
    # A row comparison: PostgreSQL seeks the (run, item_index, run_index) unique index with
    # it, where `item_index > %s OR (...)` filtered every earlier row of the run per chunk.
    chunk_of = (
        f"FROM {ItemResult._meta.db_table} "
        f"WHERE {' AND '.join(where)} AND (item_index, run_index) > (%s, %s) "
        "ORDER BY item_index, run_index LIMIT %s"
    )
    after = (-1, -1)
    while True:  # keyset chunks
        chunk_params = [*params, *after, EXPORT_CHUNK]
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {', '.join(ITEM_FIELDS)} {chunk_of}", chunk_params)
            chunk = cursor.fetchall()
        if not chunk:
            return
        # The chunk's evaluations and traces read by the same keyset as a subquery: binding
        # its 2,000 ids as parameters (and the ORM's `IN` of them) was half of a results
        # file's database reads (issue 41).
        scope = RawSQL(f"SELECT id {chunk_of}", chunk_params)
        if as_lines:
            yield from _lines(chunk, marks, labelled, scope, known)
        else:
            yield from _entries(chunk, marks, labelled, with_id, scope)
        if len(chunk) < EXPORT_CHUNK:
            return
        after = (chunk[-1][1], chunk[-1][2])


def _entries(
    rows: list[tuple],
    marks: dict[str, float],
    labelled: dict[int, list[dict[str, Any]]],
    with_id: bool,
    scope: RawSQL,
) -> Iterator[dict[str, Any]]:
    """The entries of `rows`, `scope` a subquery of their ids."""
    by_item = _evaluations(scope, marks)
    traces = trace_store.read_traces(scope)
    for row in rows:
        entry = row_entry(row, by_item.get(row[0], {}), traces.get(row[0]))
        entry["labels"] = labelled.get(row[0], [])
        yield {"id": row[0], **entry} if with_id else entry


def _lines(
    rows: list[tuple],
    marks: dict[str, float],
    labelled: dict[int, list[dict[str, Any]]],
    scope: RawSQL,
    known: dict[tuple, Encoded],
) -> Iterator[str]:
    """The entries of `rows` as lines of JSON text, `scope` a subquery of their ids; a
    trace's stored text written in as it is (`read_traces(as_text=True)`), not parsed again.

    An item's evaluations are encoded once for all the items whose evaluation rows are the
    same (`known`, by their rows: a function evaluator's same score and reason), with the
    verdict they give: building, judging and encoding them for each item was a fifth of a
    results file's CPU (issue 41). Judged items (their judge calls) are built each time."""
    stored, judged, apart = _evaluation_rows(scope)
    calls = {item_id: _entries_of(stored[item_id], marks) for item_id in judged}
    _add_judge_calls(calls, judged)
    traces = trace_store.read_traces(scope, as_text=True)
    label_of = labelled.get
    for row in rows:
        item_id = row[0]
        if item_id in calls or item_id in apart:
            evaluations = calls.get(item_id) or _entries_of(stored[item_id], marks)
            judged_item = row_verdict(row, evaluations)
            yield entry_line(
                row, judged_item, evaluations, traces.get(item_id), label_of(item_id, [])
            )
            continue
        its = stored.get(item_id, ())
        found = known.get(its)
        if found is None:
            evaluations = _entries_of(its, marks)
            verdicts = [e["verdict"] for e in evaluations.values()]
            found = (json_text(evaluations), verdicts, verdict.item_verdict(verdicts))
            if len(known) >= KNOWN_EVALUATIONS:
                known.clear()
            known[its] = found
        text, verdicts, scored = found
        # An item that errored: its verdict by the one rule too (`row_verdict`), only it is
        # worked out again per item.
        judged_item = verdict.item_verdict(verdicts, errored=True) if row[4] in FAILED else scored
        yield entry_line(row, judged_item, text, traces.get(item_id), label_of(item_id, []))


# An item's evaluations as `_lines` keeps them: their text, their verdicts, the item's verdict.
Encoded = tuple[str, list[verdict.Verdict], verdict.Verdict]
# Distinct evaluation rows whose encoded text `_lines` keeps, at most (then it starts again).
KNOWN_EVALUATIONS = 1024


def _evaluation_rows(scope: RawSQL) -> tuple[dict[int, tuple], set[int], set[int]]:
    """The evaluation rows (`EVALUATION_FIELDS` but the item id) of the items of `scope` (a
    subquery of their ids), by item id in the order stored; the items with an evaluation
    that called a model (or its cache), and those with a score of -0.0 (equal to 0.0, so
    `_lines` must not take one for the other)."""
    by_item: dict[int, list[tuple]] = defaultdict(list)
    judged: set[int] = set()
    apart: set[int] = set()
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {', '.join(EVALUATION_FIELDS)}, tokens FROM {Evaluation._meta.db_table} "
            f"WHERE item_id IN ({scope.sql}) ORDER BY id",
            scope.params,
        )
        for row in cursor.fetchall():
            by_item[row[0]].append(row[1:-1])
            if row[-1] or row[6]:  # tokens, cached
                judged.add(row[0])
            elif row[2] == 0.0 and math.copysign(1.0, row[2]) < 0:
                apart.add(row[0])
    return {item_id: tuple(rows) for item_id, rows in by_item.items()}, judged, apart


def _entries_of(rows: tuple, marks: dict[str, float]) -> dict[str, Any]:
    """An item's evaluation entries from its `_evaluation_rows`, by evaluator."""
    return {row[0]: evaluation_entry(*row[1:], mark=marks.get(row[0])) for row in rows}


def _evaluations(scope: RawSQL, marks: dict[str, float]) -> dict[int, dict[str, Any]]:
    """The evaluation entries of the items of `scope` (a subquery of their ids), by item id
    and evaluator, with their judge calls."""
    stored, judged, _ = _evaluation_rows(scope)
    by_item = {item_id: _entries_of(rows, marks) for item_id, rows in stored.items()}
    _add_judge_calls(by_item, judged)
    return by_item


def _add_judge_calls(by_item: dict[int, dict[str, Any]], judged: set[int]) -> None:
    """Each judged evaluation's `judgeCall` (what its judge was sent and answered, capped and
    redacted: `storable.judge_call`, again, with this process's secrets): one query for a
    chunk that has any, none for a run of function evaluators."""
    if not judged:
        return
    calls = JudgeCall.objects.filter(item_id__in=sorted(judged)).values_list(
        "item_id", "evaluator", "data"
    )
    for item_id, evaluator, data in calls:
        entry = by_item.get(item_id, {}).get(evaluator)
        call = storable.judge_call(data)
        if entry is not None and call is not None:
            entry["judgeCall"] = call


def item_outcomes(ids: list[int], *, order: list[str] | None = None) -> list[ItemOutcome]:
    """Finished items as the reporter sees them in the embedded mode, in the order they
    finished; their evaluations in `order` (the run's evaluators), failed items' traces."""
    from cobalt_app.engine import ItemOutcome
    from cobalt_app.evaluators import EvalOutcome

    rank = {name: position for position, name in enumerate(order or [])}
    evaluations: dict[int, list[EvalOutcome]] = defaultdict(list)
    rows = Evaluation.objects.filter(item_id__in=ids).values_list(*EVALUATION_FIELDS)
    for item_id, *values in rows:
        evaluations[item_id].append(
            EvalOutcome(**dict(zip(EVALUATION_FIELDS[1:], values, strict=True)))
        )
    items = (
        ItemResult.objects.filter(id__in=ids)
        .order_by("finished_at", "id")
        .values_list(*OUTCOME_FIELDS)
    )
    found = []
    for values in items:
        outcome = ItemOutcome(**dict(zip(OUTCOME_FIELDS, values, strict=True)))
        outcome.evaluations = sorted(
            evaluations.get(outcome.id, []), key=lambda e: rank.get(e.evaluator, len(rank))
        )
        found.append(outcome)
    # The traces of failed items only: their lines give the step count.
    failed = [o.id for o in found if o.status != ItemResult.Status.OK]
    if failed:
        traces = trace_store.read(failed)
        for outcome in found:
            outcome.trace = traces.get(outcome.id) or []
    return found


def run_results(run: Run) -> dict[str, Any]:
    """The whole results document of a run, in memory."""
    header, labelled = labelled_header(run)
    return {**header, "items": list(iter_item_entries(run, labelled=labelled))}


def labelled_header(run: Run) -> tuple[dict[str, Any], dict[int, list[dict[str, Any]]]]:
    """The results document's header with the run's label counts (`labels`), and its labels
    by item id: the labels are read once for both."""
    rows = labels.run_labels(run)
    header = {
        **run_header(run),
        "labels": labels.label_summary(run, rows=rows),
        "calibration": calibration.calibration_json(run),
    }
    return header, labels.labels_by_item(run, rows=rows)


RESULTS_NAME_MAX = 100  # of the experiment name in a file name (file systems allow 255 bytes)
WRITE_BATCH = 500  # item entries joined into one write


def results_stem(run: Run) -> str:
    """`<timestamp>_<name>_<id>`: the name in ASCII letters, digits, `.`, `_` and `-`, cut to
    RESULTS_NAME_MAX characters (the run id keeps the file names of long names apart)."""
    stamp = run.created_at.strftime("%Y-%m-%dT%H-%M-%S")
    safe_name = re.sub(r"[^A-Za-z0-9._-]+", "-", run.name).strip("-")
    safe_name = safe_name[:RESULTS_NAME_MAX].rstrip("-.") or "experiment"
    return f"{stamp}_{safe_name}_{run.id}"


def results_filename(run: Run, form: results_file.Form = results_file.Form()) -> str:
    """The results file's name: its stem and the suffix of its form (`.json` by default)."""
    return results_stem(run) + form.suffix


def write_results_file(
    run: Run, results_dir: Path, form: results_file.Form = results_file.Form()
) -> Path:
    """Stream the results document to disk in `form` (atomic rename: nothing half-written).
    A file of the run in another form (written before a `--resume`) is removed."""
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / results_filename(run, form)
    temporary = path.with_name(path.name + ".tmp")
    try:
        with results_file.open_text(temporary, "w", compressed=form.compressed) as fh:
            fh.writelines(results_lines(run) if form.lines else results_document(run))
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    for suffix in results_file.SUFFIXES:
        if suffix != form.suffix:
            (results_dir / (results_stem(run) + suffix)).unlink(missing_ok=True)
    return path


def results_document(run: Run) -> Iterator[str]:
    """The results document as text, WRITE_BATCH items at a time: the results file and the
    downloads stream it, never holding a big run in memory."""
    header, labelled = labelled_header(run)
    head = json.dumps(header, ensure_ascii=False, indent=2, default=str)
    yield head[:-2] + ',\n  "items": ['
    lines = iter_item_entries(run, labelled=labelled, as_lines=True)
    for position, batch in enumerate(_batches(lines, ",\n    ")):
        yield ("\n    " if position == 0 else ",\n    ") + batch
    yield "\n  ]\n}\n"


def results_lines(run: Run) -> Iterator[str]:
    """The results as JSON Lines: the header (the document without `items`) on the first
    line, then one item entry per line."""
    header, labelled = labelled_header(run)
    yield json.dumps(header, ensure_ascii=False, default=str) + "\n"
    for batch in _batches(iter_item_entries(run, labelled=labelled, as_lines=True), "\n"):
        yield batch + "\n"


def _batches(lines: Iterable[str], separator: str) -> Iterator[str]:
    """WRITE_BATCH lines at a time, joined by `separator`."""
    batch: list[str] = []
    for line in lines:
        batch.append(line)
        if len(batch) >= WRITE_BATCH:
            yield separator.join(batch)
            batch = []
    if batch:
        yield separator.join(batch)


def iso(value: datetime | None = None) -> str:
    """An ISO-8601 UTC timestamp in milliseconds (`…Z`), of `value` or of now: the one
    format of the results file, the API, webhooks and CI reports."""
    moment = datetime.now(UTC) if value is None else value.astimezone(UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
