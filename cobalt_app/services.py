"""Writes: create a run with its item snapshots, record item outcomes, finalise a run.

Every write of the engine lives here, shared by the embedded executor and the workers.
Writes are batched: one transaction per batch of outcomes.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from cobalt.dataset import item_key
from cobalt.errors import ConflictError
from cobalt.experiments import Experiment
from cobalt_app import bulk_sql, flaky, storable, trace_store
from cobalt_app.models import Evaluation, ItemResult, ItemTrace, JudgeCall, Run, RunTag

CREATE_BATCH = 2000


@dataclass(frozen=True)
class ItemSnapshot:
    """An item result row as the executor needs it: ids and the snapshotted dataset item."""

    id: int
    item_index: int
    run_index: int
    item_key: str
    item: dict[str, Any]


def run_create(
    *,
    experiment: Experiment,
    settings: dict[str, Any],
    file: str = "",
    tags: Sequence[str] = (),
    mode: str = Run.Mode.EMBEDDED,
    project_dir: Path | None = None,
) -> Run:
    """Create a run and snapshot every dataset item × repetition into pending item rows."""
    all_tags = list(dict.fromkeys([*experiment.tags, *tags]))
    config = {
        **settings,
        "evaluators": [e.describe() for e in experiment.evaluators],
        "dataset": {
            "name": experiment.dataset.name,
            "source": experiment.dataset.source,
            "size": len(experiment.dataset),
            "sampleSeed": getattr(experiment.dataset, "sample_seed", None),
        },
        "thresholds": experiment.thresholds,
    }
    # The items are read once, as they are inserted: a dataset read from a file is streamed
    # from it (`cobalt.dataset_stream`), never held whole (issue 41).
    # `--repeat-flaky N`: the items that flipped in the experiment's history run N times.
    repeats = flaky.repeats(experiment.name, settings["runs"], settings.get("repeat_flaky"))
    with transaction.atomic():
        run = Run.objects.create(
            name=experiment.name,
            file=file,
            mode=mode,
            tags=all_tags,
            config=storable.redacted(_json_safe(config)),
            total_items=0,
            git_commit=git_commit(project_dir),
            sweep_id=experiment.sweep_id,
            variant=None
            if experiment.variant is None
            else variant_stored(experiment.variant.label, experiment.variant.values),
        )
        RunTag.objects.bulk_create([RunTag(run=run, name=t) for t in all_tags])
        run.total_items = _insert_snapshots(_snapshot_rows(run.id, experiment.dataset, repeats))
        Run.objects.filter(id=run.id).update(total_items=run.total_items)
    return run


def _snapshot_rows(
    run_id: str, items: Iterable[dict[str, Any]], repeats: Callable[[str], int]
) -> Iterator[tuple]:
    """An item row per item and repetition, in the dataset's order."""
    dumps = _dumper()
    for index, item in enumerate(items):
        key = item_key(item)[:200]
        stored = dumps(item)
        for repetition in range(repeats(key)):
            yield (run_id, index, repetition, key, stored)


def variant_stored(label: str, values: dict[str, Any]) -> dict[str, Any]:
    """A sweep variant as its run stores it: its label and its values, JSON-safe, redacted."""
    return storable.redacted(_json_safe({"label": label, "values": values}))


# Hot paths below use executemany with plain SQL: creating and updating tens of thousands of
# rows through model instances costs more than running the agent on them.
SNAPSHOT_INSERT_SQL = (
    "INSERT INTO cobalt_app_itemresult (run_id, item_index, run_index, item_key, input, "
    "output, metadata, status, error, traceback, tokens, cost, attempts, worker) "
    "VALUES (%s, %s, %s, %s, %s, NULL, '{}', 'pending', '', '', 0, 0, 0, '')"
)


def _insert_snapshots(rows: Iterable[tuple]) -> int:
    """Insert the rows, CREATE_BATCH at a time; how many there were."""
    batch: list[tuple] = []
    count = 0
    with connection.cursor() as cursor:
        for row in rows:
            batch.append(row)
            if len(batch) >= CREATE_BATCH:
                cursor.executemany(SNAPSHOT_INSERT_SQL, batch)
                count += len(batch)
                batch = []
        if batch:
            cursor.executemany(SNAPSHOT_INSERT_SQL, batch)
            count += len(batch)
    return count


def run_start(run_id: str) -> bool:
    """Mark the run as executing; False when it was cancelled before it could start."""
    now = timezone.now()
    return (
        Run.objects.filter(id=run_id, status__in=[Run.Status.QUEUED, Run.Status.RUNNING]).update(
            status=Run.Status.RUNNING, started_at=now, finished_at=None, heartbeat_at=now
        )
        == 1
    )


def run_heartbeat(run_id: str) -> bool:
    """The process executing the run is alive: touch it, and take back an `interrupted` that a
    reader concluded from a stalled heartbeat. False when the run ended meanwhile."""
    alive = Run.objects.filter(id=run_id, status__in=[Run.Status.RUNNING, Run.Status.INTERRUPTED])
    return alive.update(status=Run.Status.RUNNING, heartbeat_at=timezone.now()) == 1


def run_interrupt(run_id: str, last_heartbeat: datetime | None) -> bool:
    """Store a running run as `interrupted` unless its heartbeat moved since it was read."""
    silent = Run.objects.filter(id=run_id, status=Run.Status.RUNNING)
    if last_heartbeat is None:
        silent = silent.filter(heartbeat_at__isnull=True)
    else:
        silent = silent.filter(heartbeat_at=last_heartbeat)
    with transaction.atomic():
        if silent.update(status=Run.Status.INTERRUPTED) != 1:
            return False
        # The items its lanes held when the process died wait for `--resume`, as pending.
        ItemResult.objects.filter(run_id=run_id, status=ItemResult.Status.RUNNING).update(
            status=ItemResult.Status.PENDING, worker="", lease_expires_at=None
        )
    return True


class RunBusy(ConflictError):
    """The run is being executed by another process right now; it cannot be resumed."""


def run_resume(run_id: str, *, grace: float) -> Run:
    """Take over a run to resume it: refused (`RunBusy`) while another process executes it.

    An embedded run is busy while its heartbeat is younger than `grace` seconds; a team run
    while it is queued or running (its workers hold it). The time the run already took is
    kept in its config (`priorDurationMs`) so that its duration adds both sessions up.
    """
    now = timezone.now()
    with transaction.atomic():
        run = Run.objects.select_for_update().get(id=run_id)
        last_sign = run.heartbeat_at or run.started_at or run.created_at
        if run.mode == Run.Mode.TEAM and run.status in (Run.Status.QUEUED, Run.Status.RUNNING):
            raise RunBusy(
                f"run {run.id} is still {run.status} on the workers: follow it with "
                f"`cobalt watch {run.id}`, or stop it with `cobalt cancel {run.id}` first"
            )
        if run.status == Run.Status.RUNNING and (now - last_sign).total_seconds() < grace:
            raise RunBusy(
                f"run {run.id} is still being executed by another process (its last sign of "
                f"life was {(now - last_sign).total_seconds():.0f}s ago): wait for it to end, "
                "or stop it (Ctrl-C in its terminal), then resume it"
            )
        prior = run.duration_ms
        if prior is None and run.started_at is not None:  # its process died before the end
            prior = (last_sign - run.started_at).total_seconds() * 1000
        config = {**run.config, "priorDurationMs": (prior or 0.0)}
        Run.objects.filter(id=run.id).update(
            config=config, status=Run.Status.RUNNING, heartbeat_at=now, finished_at=None
        )
        run.config = config
    return run


def item_snapshots(
    run_id: str, statuses: Sequence[str] = (ItemResult.Status.PENDING, ItemResult.Status.RUNNING)
) -> list[ItemSnapshot]:
    rows = (
        ItemResult.objects.filter(run_id=run_id, status__in=statuses)
        .order_by("item_index", "run_index")
        .values_list("id", "item_index", "run_index", "item_key", "input")
    )
    return [ItemSnapshot(*row) for row in rows.iterator(chunk_size=5000)]


def item_reset_for_retry(run_id: str, statuses: Sequence[str]) -> int:
    """Put items back to pending (for `--resume`): their evaluations are dropped."""
    with transaction.atomic():
        items = ItemResult.objects.filter(run_id=run_id, status__in=statuses)
        Evaluation.objects.filter(item__in=items).delete()
        JudgeCall.objects.filter(item__in=items).delete()
        ItemTrace.objects.filter(item__in=items).delete()
        count = items.update(
            status=ItemResult.Status.PENDING,
            output=None,
            error="",
            traceback="",
            latency_ms=None,
            finished_at=None,
        )
        recorded = ItemResult.objects.filter(
            run_id=run_id,
            status__in=[ItemResult.Status.OK, ItemResult.Status.ERROR, ItemResult.Status.TIMEOUT],
        ).count()
        Run.objects.filter(id=run_id).update(finished_items=recorded)
    return count


RUN_COUNT_SQL = "UPDATE cobalt_app_run SET finished_items = finished_items + %s WHERE id = %s"


def record_item_outcomes(run_id: str, outcomes: Sequence[Any], *, exclusive: bool = False) -> int:
    """Store finished items and their evaluations in one transaction; returns rows recorded.

    An item already finished is left alone (a redelivered task records nothing twice).
    `exclusive` skips that check when the caller alone executes these items (embedded mode).
    """
    if not outcomes:
        return 0
    finished = [str(s) for s in ItemResult.FINISHED]
    # No savepoint inside a caller's transaction (team mode records a batch in one): a
    # failure here fails the whole transaction either way.
    with transaction.atomic(savepoint=False):
        if not exclusive:
            open_ids = set(
                ItemResult.objects.filter(id__in=[o.id for o in outcomes])
                .exclude(status__in=finished)
                .values_list("id", flat=True)
            )
            outcomes = [o for o in outcomes if o.id in open_ids]
        outcomes = [storable.prepare(o) for o in outcomes]
        rows, evaluations = outcome_rows(run_id, outcomes)
        recorded = 0
        if rows:  # one statement for the batch (`bulk_sql`)
            recorded = bulk_sql.items_update(rows, finished)
        if evaluations:
            bulk_sql.evaluations_upsert(evaluations)
        write_extras(outcomes)
        if recorded:
            # Raw: the ORM compiles this UPDATE anew each time, a worker's hottest query.
            with connection.cursor() as cursor:
                cursor.execute(RUN_COUNT_SQL, [recorded, run_id])
    return recorded


def outcome_rows(run_id: str, outcomes: Sequence[Any]) -> tuple[list[tuple], list[tuple]]:
    """Prepared outcomes (`storable.prepare`) as the rows `bulk_sql` writes: the items'
    (`bulk_sql.ITEM_COLUMNS`) and their evaluations' (`bulk_sql.EVALUATION_COLUMNS`)."""
    adapt = bulk_sql.datetime_adapter()  # SQLite stores datetimes as text
    items = [
        (
            o.status,
            *o.stored,
            o.error,
            o.traceback,
            o.latency_ms,
            o.tokens,
            o.cost,
            adapt(o.started_at),
            adapt(o.finished_at),
            o.id,
        )
        for o in outcomes
    ]
    evaluations = [
        (
            o.id,
            run_id,
            e.evaluator,
            e.score,
            e.reason,
            e.status,
            e.error,
            e.cached,
            e.tokens,
            e.cost,
            e.chain_of_thought,
            e.unpriced_model,
        )
        for o in outcomes
        for e in o.evaluations
    ]
    return items, evaluations


def has_extras(outcome: Any) -> bool:
    """Whether `write_extras` stores anything for this (prepared) outcome."""
    if outcome.stored_trace is not None or outcome.trace_missing:
        return True
    return any(getattr(e, "judge_call", None) for e in outcome.evaluations)


def write_extras(outcomes: Sequence[Any]) -> None:
    """What recorded outcomes store beside their rows: judges' calls, traces."""
    _write_judge_calls(outcomes)
    trace_store.write(
        [
            (o.id, o.stored_trace or "[]", o.trace, o.trace_missing)
            for o in outcomes
            if o.stored_trace is not None or o.trace_missing
        ]
    )


def _write_judge_calls(outcomes: Sequence[Any]) -> None:
    """Store the LLM judges' calls of these outcomes' evaluations (one query, none when no
    judge was called), replacing an evaluation's earlier call."""
    calls = [
        JudgeCall(item_id=o.id, evaluator=e.evaluator, data=e.judge_call)
        for o in outcomes
        for e in o.evaluations
        if getattr(e, "judge_call", None)
    ]
    if calls:
        JudgeCall.objects.bulk_create(
            calls,
            update_conflicts=True,
            unique_fields=["item", "evaluator"],
            update_fields=["data"],
        )


def unstorable_outcome(outcome: Any, message: str) -> Any:
    """The outcome as an item error with only `message`: nothing else of it is stored."""
    return dataclasses.replace(
        outcome,
        status=ItemResult.Status.ERROR,
        output=None,
        metadata={},
        error=storable.clean_text(message),
        traceback="",
        tokens=0,
        cost=0.0,
        evaluations=[],
        stored=None,
        trace=[],
        stored_trace=None,
    )


def run_cancel_pending(run_id: str) -> int:
    return ItemResult.objects.filter(
        run_id=run_id, status__in=[ItemResult.Status.PENDING, ItemResult.Status.RUNNING]
    ).update(status=ItemResult.Status.CANCELLED, finished_at=timezone.now())


def git_commit(project_dir: Path | None) -> str:
    if project_dir is None:
        return ""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=project_dir,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return result.stdout.strip() if result.returncode == 0 else ""


def _dumper() -> Callable[[Any], str]:
    """`json.dumps(value, ensure_ascii=False, default=str)` for many values, a third of the
    CPU: json's C encoder made once here, where `json.dumps` builds a `JSONEncoder` (its
    Python setup) at every call, and made once for a run's items, not for each (~14 ms at
    50,000; issue 41). Its `{}` is the circular-reference check `json.dumps` makes too:
    each call that returns leaves it empty; one that raises may not, so a caller stops at
    the first error (as `_snapshot_rows` does)."""
    make = json.encoder.c_make_encoder
    if make is None:  # a Python without json's C speedups
        return lambda value: json.dumps(value, ensure_ascii=False, default=str)
    encode = make({}, str, json.encoder.encode_basestring, None, ": ", ", ", False, False, True)
    return lambda value: "".join(encode(value, 0))


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, ensure_ascii=False, default=str))
