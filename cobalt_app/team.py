"""Team mode: runs executed by `cobalt worker` processes through Celery, on a shared database.

- `start_run()` creates the run and its item rows (`runs.lifecycle.create`, as the embedded
  mode does), then enqueues it; `team_wait.wait()` follows it where it was started.
- A run is dispatched as lanes: at most `concurrency` messages, each naming a first few
  items. A lane executes only while it holds one of the run's `concurrency` slots
  (`team_lanes`), so a message delivered twice or sent again by the sweeper adds no lane.
  A worker runs the lane of `runs.lane` — the embedded mode's loop too: claim with one
  conditional UPDATE (pending → running, with a lease), execute, record only the claim still
  current, claim the run's next pending items — for a bounded time, then enqueues the lane's
  continuation. The last item finalises the run, found by counting in the database (no chords).
- Every worker renews the leases of the items it holds (`claims.leases_renew`). `sweep()` (one
  worker at a time) puts items whose lease ran out back to pending and enqueues them again
  (new lanes for the ones that died), gives up on an item whose workers died
  `MAX_ATTEMPTS` times, re-enqueues runs whose lanes all vanished with their workers, and
  finalises runs whose last worker died finalising.
  Nothing waits for Redis' visibility timeout.
- Once an hour (one worker across the team), the sweep applies `[retention]` (`retention`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Max
from django.utils import timezone

from cobalt.config import Config
from cobalt.experiments import Experiment
from cobalt.run_settings import RunSettings
from cobalt_app import retention, services, team_cursor
from cobalt_app.engine import ItemOutcome
from cobalt_app.models import ItemResult, Run
from cobalt_app.runs import lifecycle
from cobalt_app.runs.claims import UNFINISHED, item_ids, lease_grace
from cobalt_app.team_broker import (
    KEY,
    announce_progress,
    dispatched_at,
    live_workers,
    queue_size,
    redis_client,
)
from cobalt_app.team_lanes import lanes_held

logger = logging.getLogger("cobalt.team")

DEFAULT_QUEUE = "cobalt"
MAX_ATTEMPTS = 3
MAX_CHUNK = 8  # items a lane claims at once, at most
# ... when its step is all sync (`sync_items`) and the run is big (its messages say MAX_CHUNK):
# each claim is one batch on a runner thread, its items quick; fewer claims, round trips and
# commits per item.
SYNC_CHUNK = 32
CLAIMS_PER_LANE = 2  # fewer claims than this per lane: one item at a time
SWEEP_BATCH = 500
ANALYZE_FROM = 1000  # items of a new run from which stale statistics are renewed
MIGRATION_LOCK = 0x0C0BA17  # pg_advisory_lock id: one migrating process at a time
ACTIVE_RUN = (Run.Status.QUEUED, Run.Status.RUNNING)
RETENTION_EVERY = 3600  # seconds between two applications of `[retention]`, team-wide
# The Celery task of a lane (`tasks.run_lane`), sent by name after commit: a message never
# names a run or items a worker cannot see yet, and this module needs not import the worker.
RUN_LANE = "cobalt.run_lane"


def queue_name() -> str:
    return os.environ.get("COBALT_QUEUE") or DEFAULT_QUEUE


# ---------------------------------------------------------------------------- services


def ensure_schema() -> None:
    """Migrate the shared database if needed, one process at a time."""
    from cobalt_project.bootstrap import migrate_if_needed

    if connection.vendor != "postgresql":
        migrate_if_needed()
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [MIGRATION_LOCK])
        try:
            migrate_if_needed()
        finally:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [MIGRATION_LOCK])


def start_run(
    experiment: Experiment,
    config: Config,
    *,
    overrides: dict[str, Any] | None = None,
    tags: list[str] | None = None,
    file: str = "",
    no_cache: bool = False,
) -> tuple[Run, list[int]]:
    """Create a team run with its item rows and enqueue every item; returns (run, item ids)."""
    run = lifecycle.create(
        experiment,
        config,
        mode=Run.Mode.TEAM,
        overrides=overrides,
        extra=team_settings(no_cache),
        tags=tags,
        file=file,
    )
    ids = item_ids(run.id, UNFINISHED)
    statistics_for(len(ids))
    enqueue(run.id, ids, cursor=True)
    return run, ids


def statistics_for(created: int) -> None:
    """ANALYZE the item and evaluation tables when a new run's rows outnumber what their
    statistics know (a new or truncated database, or a run bigger than all before): with none,
    PostgreSQL plans the workers' statements by primary key (`claims.CLAIM_RANGE_SQL`,
    `bulk_sql.items_record_claimed`) as scans of the whole table, for every batch, until its
    autovacuum gets there (a minute or more). ANALYZE reads a sample (30,000 rows at most)."""
    if connection.vendor != "postgresql" or created < ANALYZE_FROM:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reltuples FROM pg_class WHERE oid = 'cobalt_app_itemresult'::regclass"
        )
        (known,) = cursor.fetchone()
        if known < created:
            cursor.execute("ANALYZE cobalt_app_itemresult, cobalt_app_evaluation")


def resume_run(run_id: str, *, no_cache: bool = False) -> tuple[Run, list[int]]:
    """Put failed, timed-out and cancelled items back to pending and enqueue what is missing."""
    run = lifecycle.resume(
        run_id, grace=lease_grace(), mode=Run.Mode.TEAM, extra=team_settings(no_cache)
    )
    forget_run(run.id)
    watched = item_ids(run.id, UNFINISHED)  # before enqueueing: workers may be quick
    enqueue(run.id, item_ids(run.id, [ItemResult.Status.PENDING]), cursor=True)
    return run, watched


def team_settings(no_cache: bool) -> dict[str, Any]:
    """What a team run adds to its settings: its queue, and whether to bypass the cache."""
    return {"queue": queue_name(), **({"noCache": True} if no_cache else {})}


def enqueue(run_id: str, ids: list[int], *, cursor: bool = False) -> None:
    """Dispatch the run's pending items as lanes (call outside any open transaction).

    At most `concurrency` messages (the run's setting), less the lanes executing already,
    each with a first few item ids; a worker that is done with them goes on claiming the
    run's next pending items itself, a few at a time, until none is left. So a big run costs
    a handful of messages instead of one per item; its concurrency holds across all workers
    because a lane executes only while it holds one of the run's slots (`team_lanes`).
    `cursor` (no lane of the run executes: a new, resumed or re-dispatched run): the ids
    after those the messages name are handed out by range (`team_cursor`).
    """
    if not ids:
        return
    info = run_info(run_id)
    lanes = info.concurrency - lanes_held(run_id, info.concurrency)
    if lanes < 1:
        return  # the executing lanes claim these items next
    size = chunk_size(len(ids), info.queue, info.concurrency)
    chunks = [ids[start : start + size] for start in range(0, len(ids), size)]
    rest = ids[lanes * size :] if cursor else None
    transaction.on_commit(lambda: _send_lanes(run_id, chunks[:lanes], size, info.queue, rest))


def _send_lanes(
    run_id: str, chunks: list[list[int]], then: int, queue: str, rest: list[int] | None
) -> None:
    """The lanes' messages, by task name (`tasks.run_lane`), in pipelined batches; `rest`:
    the ids the lanes claim next, by range (`team_cursor`)."""
    from cobalt_project.celery import app

    if rest is not None:  # before the messages: their lanes go on from it
        team_cursor.cursor_set(run_id, rest)

    with app.producer_or_acquire() as producer, _batched(producer):
        for chunk in chunks:
            app.send_task(RUN_LANE, (run_id, chunk, then), queue=queue, producer=producer)
    redis_client().set(f"{KEY}dispatched:{run_id}", time.time(), ex=7 * 86400)


def chunk_size(count: int, queue: str, concurrency: int) -> int:
    """Items a lane claims at a time: one, unless every lane would still claim several times.

    A claim costs a database round trip and, for the first, a message; sharing it among a
    few items saves most of the dispatch overhead of big runs, while small runs claim one
    item at a time so that two workers share them evenly.
    """
    listening = [w for w in live_workers() if queue in (w.get("queues") or [])]
    threads = sum(int(worker.get("concurrency") or 0) for worker in listening) or concurrency
    lanes = max(1, min(concurrency, threads))
    return max(1, min(MAX_CHUNK, count // (lanes * CLAIMS_PER_LANE)))


def _batched(producer: Any) -> Any:
    """One pipelined round trip per 50 messages instead of one each (kombu >= 5.7)."""
    batch = getattr(producer, "batch", None)
    return batch(max_size=50) if batch is not None else contextlib.nullcontext()


@dataclass(frozen=True)
class RunInfo:
    """What a worker needs to know about a run; it does not change while the run executes."""

    id: str
    name: str
    file: str
    config: dict[str, Any]

    @property
    def queue(self) -> str:
        return self.config.get("queue") or DEFAULT_QUEUE

    @property
    def concurrency(self) -> int:
        return max(1, RunSettings.from_run_config(self.config).concurrency)

    @property
    def timeout(self) -> float:
        return RunSettings.from_run_config(self.config).timeout

    @property
    def no_cache(self) -> bool:
        return bool(self.config.get("noCache"))


RUN_INFO_TTL = 10.0
_run_infos: dict[str, tuple[float, RunInfo]] = {}


def run_info(run_id: str) -> RunInfo:
    """Cached for a few seconds: `--resume` may change a run's queue or cache setting."""
    cached = _run_infos.get(run_id)
    if cached is not None and time.monotonic() - cached[0] < RUN_INFO_TTL:
        return cached[1]
    name, file, config = Run.objects.values_list("name", "file", "config").get(id=run_id)
    info = RunInfo(run_id, name, file, config or {})
    _run_infos[run_id] = (time.monotonic(), info)
    return info


def cached_run_info(run_id: str) -> RunInfo | None:
    """`run_info` when it needs no query (any thread may call it), else None."""
    cached = _run_infos.get(run_id)
    if cached is not None and time.monotonic() - cached[0] < RUN_INFO_TTL:
        return cached[1]
    return None


def forget_run(run_id: str) -> None:
    _run_infos.pop(run_id, None)


def enqueue_lane(run_id: str, then: int) -> None:
    """One lane of the run, to go on on another worker: it claims the run's next items."""
    queue = run_info(run_id).queue
    transaction.on_commit(lambda: _send_continuation(run_id, then, queue))


def _send_continuation(run_id: str, then: int, queue: str) -> None:
    from cobalt_project.celery import app

    app.send_task(RUN_LANE, (run_id, [], then), queue=queue)


@dataclass
class SweepReport:
    requeued: int = 0
    abandoned: int = 0
    redispatched: int = 0
    finalised: list[str] = field(default_factory=list)


def sweep(config: Config | None = None) -> SweepReport:
    """Recover the work of vanished workers (safe to run anywhere, any number of times);
    a run it finalises sends its webhooks as any other (`config`: whose webhooks)."""
    report = SweepReport()
    now = timezone.now()
    requeue: dict[str, list[int]] = {}
    touched: set[str] = set()
    with transaction.atomic():
        expired = list(
            ItemResult.objects.select_for_update(skip_locked=True)
            .filter(
                status=ItemResult.Status.RUNNING, lease_expires_at__lt=now, run__mode=Run.Mode.TEAM
            )
            .values_list("id", "run_id", "attempts", "worker")[:SWEEP_BATCH]
        )
        retry = [row for row in expired if row[2] < MAX_ATTEMPTS]
        if retry:
            ItemResult.objects.filter(id__in=[row[0] for row in retry]).update(
                status=ItemResult.Status.PENDING, worker="", lease_expires_at=None
            )
        for item_id, run_id, _attempts, _worker in retry:
            requeue.setdefault(run_id, []).append(item_id)
        for item_id, run_id, attempts, worker in expired:
            if attempts < MAX_ATTEMPTS:
                continue
            message = (
                f"abandoned: the worker executing this item stopped responding {attempts} "
                f"times (last: {worker or 'unknown'}); was it killed or out of memory?"
            )
            services.record_item_outcomes(run_id, [_abandoned(item_id, message, now)])
            report.abandoned += 1
            touched.add(run_id)
    for run_id, ids in requeue.items():
        enqueue(run_id, ids)
        report.requeued += len(ids)
    for run_id in touched:
        if lifecycle.finish_if_done(run_id, config=config):
            report.finalised.append(run_id)
    _sweep_runs(report, config)
    announce_progress(touched | set(report.finalised))
    _retention_turn(config)
    return report


_retention_thread: threading.Thread | None = None


def _retention_turn(config: Config | None) -> None:
    """Apply `[retention]` if no worker did within the hour, on a thread of its own: deleting
    and vacuuming may take minutes, and the sweep runs on the heartbeat thread, whose
    lease renewals must not wait."""
    global _retention_thread
    if config is None or not retention.policy(config):
        return
    if _retention_thread is not None and _retention_thread.is_alive():
        return
    # Per database: projects sharing a broker may keep their history in different ones.
    database = f"{connection.settings_dict.get('HOST') or ''}/{connection.settings_dict['NAME']}"
    if not redis_client().set(f"{KEY}retention:{database}", 1, nx=True, ex=RETENTION_EVERY):
        return
    _retention_thread = threading.Thread(
        target=_apply_retention, args=(config,), name="cobalt-retention", daemon=True
    )
    _retention_thread.start()


def _apply_retention(config: Config) -> None:
    try:
        report = retention.clean(retention.policy(config), config)
        if report.anything:
            logger.warning(
                "retention: deleted %s; kept %d matching runs; %s",
                report.summary(),
                len(report.kept),
                report.space.how if report.space else "no space measured",
            )
    except Exception:
        logger.exception("retention failed; the next turn (within the hour) tries again")
    finally:
        connection.close()  # this thread's own connection


def _abandoned(item_id: int, message: str, now) -> ItemOutcome:
    return ItemOutcome(
        id=item_id,
        item_index=0,
        run_index=0,
        item_key="",
        status=ItemResult.Status.ERROR,
        error=message,
        finished_at=now,
    )


def _sweep_runs(report: SweepReport, config: Config | None) -> None:
    """Active team runs: finalise finished ones, re-enqueue items whose messages were lost."""
    grace = lease_grace()
    queue_sizes: dict[str, int] = {}
    for run_id in Run.objects.filter(status__in=ACTIVE_RUN, mode=Run.Mode.TEAM).values_list(
        "id", flat=True
    ):
        counts = dict(
            ItemResult.objects.filter(run_id=run_id, status__in=UNFINISHED)
            .values_list("status")
            .annotate(n=Count("id"))
        )
        if not counts:
            if lifecycle.finish_if_done(run_id, config=config):
                report.finalised.append(run_id)
            continue
        if counts.get(ItemResult.Status.RUNNING) or not counts.get(ItemResult.Status.PENDING):
            continue
        # Pending work, no lane executing, its queue empty, nothing dispatched or claimed for
        # a whole grace period: the messages left with a worker that died holding them.
        info = run_info(run_id)
        if lanes_held(run_id, info.concurrency):
            continue
        if info.queue not in queue_sizes:
            queue_sizes[info.queue] = queue_size(info.queue)
        if queue_sizes[info.queue]:
            continue
        if time.time() - dispatched_at(run_id) < grace:
            continue
        last_claim = ItemResult.objects.filter(run_id=run_id).aggregate(last=Max("started_at"))
        if last_claim["last"] and (timezone.now() - last_claim["last"]).total_seconds() < grace:
            continue
        ids = item_ids(run_id, [ItemResult.Status.PENDING])
        enqueue(run_id, ids, cursor=True)
        report.redispatched += len(ids)
