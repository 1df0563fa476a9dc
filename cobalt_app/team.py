"""Team mode: runs executed by `cobalt worker` processes through Celery, on a shared database.

- `start_run()` creates the run and its item rows with the same `services.run_create` as the
  embedded mode, then enqueues it; `wait()` streams finished items to the reporter as
  workers announce them, then writes the results file where the run was started.
- A run is dispatched as lanes: at most `concurrency` messages, each naming a first few
  items. A worker claims them with one conditional UPDATE (pending → running, with a lease),
  executes them one after another with the engine's `execute_item`, records each with
  `items_record` (which only accepts the claim that is still current), then claims the run's
  next pending items itself, until none is left. The last item finalises the run, found by
  counting in the database (no chords).
- Every worker renews the leases of the items it holds (`leases_renew`). `sweep()` (one
  worker at a time) puts items whose lease ran out back to pending and enqueues them again
  (new lanes for the ones that died), gives up on an item whose workers died
  `MAX_ATTEMPTS` times, re-enqueues runs whose lanes all vanished with their workers, and
  finalises runs whose last worker died finalising.
  Nothing waits for Redis' visibility timeout.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Max
from django.utils import timezone

from cobalt.config import Config
from cobalt.experiment import Experiment
from cobalt_app import services
from cobalt_app.engine import ItemOutcome, Reporter
from cobalt_app.evaluators import EvalOutcome
from cobalt_app.models import Evaluation, ItemResult, ItemTrace, Run
from cobalt_app.runs import TeamModeError, lifecycle
from cobalt_app.runs.claims import UNFINISHED, item_ids, lease_grace

logger = logging.getLogger("cobalt.team")

KEY = "cobalt:"
DEFAULT_QUEUE = "cobalt"
MAX_ATTEMPTS = 3
MAX_CHUNK = 8  # items a lane claims at once, at most
CLAIMS_PER_LANE = 2  # fewer claims than this per lane: one item at a time
SWEEP_BATCH = 500
POLL_INTERVAL = 0.5  # between database reads while no worker announces progress
MIN_POLL_INTERVAL = 0.05  # between reads however often workers announce
WAIT_NOTICE_AFTER = 2.0
STALL_NOTICE_AFTER = 30.0
MIGRATION_LOCK = 0x0C0BA17  # pg_advisory_lock id: one migrating process at a time
ACTIVE_RUN = (Run.Status.QUEUED, Run.Status.RUNNING)


class Detached(KeyboardInterrupt):
    """Ctrl-C while waiting: the run goes on on the workers."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id


def beat_interval() -> float:
    """How often workers renew leases, announce themselves and sweep."""
    return max(0.2, min(10.0, lease_grace() / 4))


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
    enqueue(run.id, ids)
    return run, ids


def resume_run(run_id: str, *, no_cache: bool = False) -> tuple[Run, list[int]]:
    """Put failed, timed-out and cancelled items back to pending and enqueue what is missing."""
    run = lifecycle.resume(
        run_id, grace=lease_grace(), mode=Run.Mode.TEAM, extra=team_settings(no_cache)
    )
    forget_run(run.id)
    watched = item_ids(run.id, UNFINISHED)  # before enqueueing: workers may be quick
    enqueue(run.id, item_ids(run.id, [ItemResult.Status.PENDING]))
    return run, watched


def team_settings(no_cache: bool) -> dict[str, Any]:
    """What a team run adds to its settings: its queue, and whether to bypass the cache."""
    return {"queue": queue_name(), **({"noCache": True} if no_cache else {})}


def enqueue(run_id: str, ids: list[int]) -> None:
    """Dispatch the run's pending items as lanes (call outside any open transaction).

    At most `concurrency` messages (the run's setting), each with a first few item ids; a
    worker that is done with them goes on claiming the run's next pending items itself, a
    few at a time, until none is left. So the run's concurrency holds across all workers,
    and a big run costs a handful of messages instead of one per item.
    """
    if not ids:
        return
    from cobalt_app import tasks
    from cobalt_project.celery import app

    info = run_info(run_id)
    size = chunk_size(len(ids), info.queue, info.concurrency)
    chunks = [ids[start : start + size] for start in range(0, len(ids), size)]
    with app.producer_or_acquire() as producer, _batched(producer):
        for chunk in chunks[: info.concurrency]:
            tasks.run_lane.apply_async((run_id, chunk, size), queue=info.queue, producer=producer)
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
        return max(1, int(self.config.get("concurrency") or 5))

    @property
    def timeout(self) -> float:
        return float(self.config.get("timeout", 30))

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
    from cobalt_app import tasks

    tasks.run_lane.apply_async((run_id, [], then), queue=run_info(run_id).queue)


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
    return report


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
        # Pending work, nobody on it, its queue empty, nothing dispatched or claimed for a
        # whole grace period: the messages left with a worker that died holding them.
        info = run_info(run_id)
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
        enqueue(run_id, ids)
        report.redispatched += len(ids)


# ------------------------------------------------------------------------------- redis


_redis: Any = None


def redis_client() -> Any:
    global _redis
    if _redis is None:
        import redis
        from django.conf import settings

        if not settings.BROKER_URL.startswith(("redis://", "rediss://", "unix://")):
            raise TeamModeError(
                "team mode needs a Redis broker: set COBALT_BROKER_URL=redis://host:6379/0"
            )
        _redis = redis.Redis.from_url(settings.BROKER_URL)
    return _redis


def check_broker() -> None:
    """Fail before creating anything when the broker does not answer."""
    from cobalt.config import redact

    try:
        redis_client().ping()
    except TeamModeError:
        raise
    except Exception as exc:
        from django.conf import settings

        where = redact(settings.BROKER_URL, "broker_url")
        raise TeamModeError(f"cannot reach the broker at {where}: {exc}") from None


def dispatched_at(run_id: str) -> float:
    """When the run's items were last enqueued (unknown: from now on)."""
    client = redis_client()
    value = client.get(f"{KEY}dispatched:{run_id}")
    if value is None:
        client.set(f"{KEY}dispatched:{run_id}", time.time(), ex=7 * 86400)
        return time.time()
    return float(value)


def queue_size(queue: str) -> int:
    """Messages waiting in a queue (not those a worker has received)."""
    from cobalt_project.celery import app

    with app.connection_for_read() as conn:
        try:
            return conn.default_channel.queue_declare(queue=queue, passive=True).message_count
        except Exception:  # an empty Redis queue does not exist at all
            return 0


def worker_beat(name: str, info: dict[str, Any], ttl: float) -> None:
    redis_client().set(f"{KEY}worker:{name}", json.dumps(info), px=int(ttl * 1000))


def worker_gone(name: str) -> None:
    redis_client().delete(f"{KEY}worker:{name}")


def live_workers() -> list[dict[str, Any]]:
    """Workers that announced themselves within their last few heartbeats."""
    client = redis_client()
    keys = sorted(client.scan_iter(match=f"{KEY}worker:*", count=500))
    values = client.mget(keys) if keys else []
    return [json.loads(v) for v in values if v]


def sweep_turn(name: str) -> bool:
    """One sweeper per interval across all workers."""
    interval_ms = int(beat_interval() * 1000)
    return bool(redis_client().set(f"{KEY}sweeper", name, nx=True, px=interval_ms))


def progress_channel(run_id: str) -> str:
    return f"{KEY}progress:{run_id}"


def announce_progress(run_ids: Iterable[str]) -> None:
    """Wake whoever waits on these runs (`cobalt run`, `cobalt watch`): items were recorded.

    Best effort: a waiting client also reads the database every `POLL_INTERVAL` anyway.
    """
    run_ids = list(run_ids)
    if not run_ids:
        return
    try:
        client = redis_client()
        with client.pipeline(transaction=False) as pipe:
            for run_id in run_ids:
                pipe.publish(progress_channel(run_id), "1")
            pipe.execute()
    except Exception as exc:  # noqa: BLE001 - the waiting side polls; never fail a record
        logger.debug("could not announce progress of %s: %s", run_ids, exc)


class ProgressListener:
    """Sleeps until a worker announces progress on a run, or `timeout` passes."""

    def __init__(self, run_id: str) -> None:
        self.pubsub = None
        try:
            self.pubsub = redis_client().pubsub(ignore_subscribe_messages=True)
            self.pubsub.subscribe(progress_channel(run_id))
        except Exception as exc:  # noqa: BLE001 - without it, wait() polls the database
            logger.debug("progress announcements unavailable: %s", exc)
            self.pubsub = None

    def wait(self, timeout: float) -> None:
        if self.pubsub is None:
            time.sleep(timeout)
            return
        try:
            message = self.pubsub.get_message(timeout=timeout)
            while message is not None:  # several announcements make one wake-up
                message = self.pubsub.get_message(timeout=0)
        except Exception:  # noqa: BLE001 - the connection broke: fall back to polling
            self.close()
            time.sleep(timeout)

    def close(self) -> None:
        if self.pubsub is not None:
            with contextlib.suppress(Exception):
                self.pubsub.close()
            self.pubsub = None


# ------------------------------------------------------------------------------ waiting


def execute(
    experiments: list[Experiment],
    config: Config,
    *,
    reporter: Reporter | None = None,
    no_cache: bool = False,
    overrides: dict[str, Any] | None = None,
    resume_run_id: str | None = None,
    tags: list[str] | None = None,
    on_notice: Callable[[str], None] | None = None,
) -> list[Run]:
    """`cobalt run` in team mode: enqueue every experiment's run, then stream each to the end."""
    from cobalt_app.launcher import relative_file

    check_broker()
    ensure_schema()
    on_notice = on_notice or _print_notice
    started: list[tuple[Run, Experiment, list[int]]] = []
    for experiment in experiments:
        if resume_run_id:
            run, ids = resume_run(resume_run_id, no_cache=no_cache)
        else:
            run, ids = start_run(
                experiment,
                config,
                overrides=overrides,
                tags=tags,
                file=relative_file(config, experiment),
                no_cache=no_cache,
            )
        started.append((run, experiment, ids))
    runs: list[Run] = []
    for run, experiment, ids in started:
        if reporter is not None:
            reporter.run_started(run, experiment)
        capped = capacity_notice(run_info(run.id).concurrency)
        if capped:
            on_notice(capped)
        try:
            runs.append(wait(run.id, config, reporter=reporter, ids=ids, on_notice=on_notice))
        except KeyboardInterrupt:
            raise Detached(run.id) from None
    return runs


def wait(
    run_id: str,
    config: Config,
    *,
    reporter: Reporter | None = None,
    ids: list[int] | None = None,
    on_notice: Callable[[str], None] | None = None,
    poll: float = POLL_INTERVAL,
) -> Run:
    """Stream the items of `ids` (default: all) as they finish; write the results file."""
    watched = sorted(item_ids(run_id) if ids is None else ids)
    waiting = set(watched)
    cursor = 0
    total, run_config = Run.objects.values_list("total_items", "config").get(id=run_id)
    order = [e["name"] for e in (run_config or {}).get("evaluators", [])]
    done = total - len(waiting)
    began = last_progress = next_check = time.monotonic()
    noticed_queue = noticed_stall = False
    counted, fetched_at = -1, 0.0
    listener = ProgressListener(run_id)
    try:
        while True:
            read_at = time.monotonic()
            status, finished = Run.objects.values_list("status", "finished_items").get(id=run_id)
            while cursor < len(watched) and watched[cursor] not in waiting:
                cursor += 1
            fresh = []
            # Read the items only when the run's counter moved (or now and then, to be sure).
            stale = time.monotonic() - fetched_at > 2
            look = finished != counted or status in Run.FINISHED or stale
            if cursor < len(watched) and look:
                counted, fetched_at = finished, time.monotonic()
                ended = ItemResult.objects.filter(
                    run_id=run_id, id__gte=watched[cursor], status__in=ItemResult.FINISHED
                ).values_list("id", flat=True)
                fresh = [i for i in ended if i in waiting]
            if fresh:
                waiting.difference_update(fresh)
                last_progress = time.monotonic()
                noticed_stall = False
                for outcome in outcomes(fresh, order=order):
                    done += 1
                    if reporter is not None and outcome.status != ItemResult.Status.CANCELLED:
                        reporter.item_finished(outcome, done, total)
            if status in Run.FINISHED:
                break
            now = time.monotonic()
            if on_notice and now >= next_check:
                next_check = now + WAIT_NOTICE_AFTER
                if status == Run.Status.QUEUED and not noticed_queue:
                    if now - began >= WAIT_NOTICE_AFTER:
                        on_notice(waiting_message())
                        noticed_queue = True
                elif (
                    not noticed_stall
                    and now - last_progress >= STALL_NOTICE_AFTER
                    and not live_workers()
                ):
                    on_notice(waiting_message())
                    noticed_stall = True
            # Until a worker announces recorded items (or `poll` passes); a busy run is read
            # at most every MIN_POLL_INTERVAL, not on every announcement.
            listener.wait(poll)
            time.sleep(max(0.0, read_at + MIN_POLL_INTERVAL - time.monotonic()))
    finally:
        listener.close()
    run = lifecycle.write_results(run_id, config.results_dir)
    if reporter is not None:
        reporter.run_finished(run)
    return run


def _print_notice(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def capacity_notice(asked: int) -> str | None:
    """Why fewer items than the experiment's `concurrency` will run at once, if so: the live
    workers of this queue have fewer lanes in all. None when they have enough (or none is up:
    `waiting_message` says that)."""
    queue = queue_name()
    lanes = sum(
        int(w.get("concurrency") or 0) for w in live_workers() if queue in w.get("queues", [])
    )
    if not lanes or lanes >= asked:
        return None
    return (
        f"the experiment asks for concurrency {asked}, but the live workers of queue {queue!r} "
        f"run {lanes} lanes in all: at most {lanes} items at once (start more workers, or "
        "`cobalt worker --concurrency N`)"
    )


def waiting_message() -> str:
    workers = live_workers()
    if not workers:
        return (
            "waiting for workers… none is running: start one with `cobalt worker` "
            "(same COBALT_DATABASE_URL and COBALT_BROKER_URL)"
        )
    return (
        f"waiting for workers… {len(workers)} running, none has picked up this run yet "
        f"(busy, or listening on other queues than {queue_name()!r})"
    )


ITEM_FIELDS = (
    "id",
    "item_index",
    "run_index",
    "item_key",
    "status",
    "output",
    "metadata",
    "error",
    "traceback",
    "latency_ms",
    "tokens",
    "cost",
    "started_at",
    "finished_at",
)
EVALUATION_FIELDS = ("item_id", "evaluator", "score", "reason", "status", "error", "cached")


def outcomes(ids: list[int], *, order: list[str] | None = None) -> list[ItemOutcome]:
    """Finished item rows as the reporter sees them in the embedded mode."""
    rank = {name: position for position, name in enumerate(order or [])}
    evaluations: dict[int, list[EvalOutcome]] = {}
    rows = Evaluation.objects.filter(item_id__in=ids).values_list(*EVALUATION_FIELDS)
    for item_id, evaluator, score, reason, status, error, cached in rows:
        evaluations.setdefault(item_id, []).append(
            EvalOutcome(evaluator, score, reason=reason, status=status, error=error, cached=cached)
        )
    items = (
        ItemResult.objects.filter(id__in=ids)
        .order_by("finished_at", "id")
        .values_list(*ITEM_FIELDS)
    )
    found = []
    for values in items:
        outcome = ItemOutcome(**dict(zip(ITEM_FIELDS, values, strict=True)))
        outcome.evaluations = sorted(
            evaluations.get(outcome.id, []), key=lambda e: rank.get(e.evaluator, len(rank))
        )
        found.append(outcome)
    # The traces of failed items only: their lines give the step count.
    failed = [o.id for o in found if o.status != ItemResult.Status.OK]
    if failed:
        traces = dict(ItemTrace.objects.filter(item_id__in=failed).values_list("item_id", "steps"))
        for outcome in found:
            outcome.trace = traces.get(outcome.id) or []
    return found
