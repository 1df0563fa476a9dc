"""`cobalt run` in team mode: enqueue each experiment's run, then follow it to the end,
streaming finished items to the reporter as workers announce them. The run's finalisation
(on a worker, a cancel or the sweeper) writes its results file, whoever follows it or not.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import threading
import time
from collections.abc import Callable

from django.db import connections

from cobalt.config import Config
from cobalt.experiments import Experiment
from cobalt_app.engine import Reporter
from cobalt_app.models import ItemResult, Run
from cobalt_app.results import item_outcomes
from cobalt_app.run_options import RunOptions, relative_file
from cobalt_app.runs.claims import item_ids
from cobalt_app.selectors import finished_item_ids, run_get, run_progress
from cobalt_app.team import ensure_schema, queue_name, resume_run, run_info, start_run
from cobalt_app.team_broker import ProgressListener, check_broker, live_workers

POLL_INTERVAL = 0.5  # between database reads while no worker announces progress
MIN_POLL_INTERVAL = 0.05  # between reads however often workers announce
WAIT_NOTICE_AFTER = 5.0  # a live worker may take seconds to import the experiment and start
STALL_NOTICE_AFTER = 30.0


class Detached(KeyboardInterrupt):
    """Ctrl-C while waiting: the run goes on on the workers."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id


async def follow(
    experiments: list[Experiment],
    config: Config,
    options: RunOptions,
    *,
    on_start: Callable[[str], None] | None = None,
) -> list[Run]:
    """`execute` awaited on the engine's loop: it waits on the database and the broker on a
    thread of its own. Cancelled, it stops following within a poll; the runs go on on the
    workers (`cobalt watch` re-attaches, `cobalt cancel` stops them)."""
    stop = threading.Event()
    done: concurrent.futures.Future[list[Run]] = concurrent.futures.Future()

    def work() -> None:
        try:
            done.set_result(execute(experiments, config, options, on_start=on_start, stop=stop))
        except Detached:  # asked to stop: the caller is cancelled already
            done.set_result([])
        except Exception as exc:  # noqa: BLE001 - raised again on the loop
            done.set_exception(exc)
        except BaseException as exc:  # noqa: BLE001 - never a KeyboardInterrupt on the loop
            done.set_exception(RuntimeError(f"following the team runs failed: {exc!r}"))
        finally:
            connections.close_all()

    threading.Thread(target=work, name="cobalt-team-wait", daemon=True).start()
    following = asyncio.wrap_future(done)
    try:
        return await asyncio.shield(following)
    except asyncio.CancelledError:
        stop.set()
        await asyncio.wait([following])
        raise


def execute(
    experiments: list[Experiment],
    config: Config,
    options: RunOptions,
    *,
    on_notice: Callable[[str], None] | None = None,
    on_start: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
) -> list[Run]:
    """Enqueue every experiment's run, then stream each to the end; `on_start` is told of
    each run as it is followed, `stop` ends the following (`Detached`)."""
    check_broker()
    ensure_schema()
    on_notice = on_notice or _print_notice
    no_cache = options.get("no_cache", False)
    resume_run_id = options.get("resume_run_id")
    started: list[tuple[Run, Experiment, list[int]]] = []
    for experiment in experiments:
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt  # as Ctrl-C did here: before any run is followed
        if resume_run_id:
            run, ids = resume_run(resume_run_id, no_cache=no_cache)
        else:
            run, ids = start_run(
                experiment,
                config,
                overrides=options.get("overrides"),
                tags=options.get("tags"),
                file=relative_file(config, experiment),
                no_cache=no_cache,
            )
        started.append((run, experiment, ids))
    reporter = options.get("reporter")
    runs: list[Run] = []
    for run, experiment, ids in started:
        if on_start is not None:
            on_start(run.id)
        if reporter is not None:
            reporter.run_started(run, experiment)
        capped = capacity_notice(run_info(run.id).concurrency)
        if capped:
            on_notice(capped)
        try:
            runs.append(
                wait(run.id, config, reporter=reporter, ids=ids, on_notice=on_notice, stop=stop)
            )
        except KeyboardInterrupt:
            raise Detached(run.id) from None
    return runs


def wait(
    run_id: str,
    config: Config | None = None,
    *,
    reporter: Reporter | None = None,
    ids: list[int] | None = None,
    on_notice: Callable[[str], None] | None = None,
    poll: float = POLL_INTERVAL,
    stop: threading.Event | None = None,
) -> Run:
    """Stream the items of `ids` (default: all) as they finish, until the run ends (its
    finalisation wrote the results file, in the project of whoever finalised it). `stop`
    set: `Detached`."""
    follower = Follower(run_id, ids, reporter)
    notices = Notices(on_notice)
    listener = ProgressListener(run_id)
    try:
        while True:
            if stop is not None and stop.is_set():
                raise Detached(run_id)
            read_at = time.monotonic()
            status, finished = run_progress(run_id)
            if follower.report(status, finished):
                notices.progressed()
            if status in Run.FINISHED:
                break
            notices.check(status)
            # Until a worker announces recorded items (or `poll` passes); a busy run is read
            # at most every MIN_POLL_INTERVAL, not on every announcement.
            listener.wait(poll)
            time.sleep(max(0.0, read_at + MIN_POLL_INTERVAL - time.monotonic()))
    finally:
        listener.close()
    run = run_get(run_id)
    if reporter is not None:
        reporter.run_finished(run)
    return run


class Follower:
    """The items of a run one waits for, and those already reported."""

    def __init__(self, run_id: str, ids: list[int] | None, reporter: Reporter | None) -> None:
        self.run_id = run_id
        self.reporter = reporter
        self.watched = sorted(item_ids(run_id) if ids is None else ids)
        self.waiting = set(self.watched)
        self.cursor = 0
        run = run_get(run_id)
        self.total, self.order = run.total_items, run.evaluator_names
        self.done = self.total - len(self.waiting)
        self.counted, self.fetched_at = -1, 0.0

    def report(self, status: str, finished: int) -> bool:
        """Report the items finished since the last call; whether there were any."""
        while self.cursor < len(self.watched) and self.watched[self.cursor] not in self.waiting:
            self.cursor += 1
        # Read the items only when the run's counter moved (or now and then, to be sure).
        stale = time.monotonic() - self.fetched_at > 2
        look = finished != self.counted or status in Run.FINISHED or stale
        if self.cursor >= len(self.watched) or not look:
            return False
        self.counted, self.fetched_at = finished, time.monotonic()
        ended = finished_item_ids(self.run_id, from_id=self.watched[self.cursor])
        fresh = [i for i in ended if i in self.waiting]
        if not fresh:
            return False
        self.waiting.difference_update(fresh)
        for outcome in item_outcomes(fresh, order=self.order):
            self.done += 1
            if self.reporter is not None and outcome.status != ItemResult.Status.CANCELLED:
                self.reporter.item_finished(outcome, self.done, self.total)
        return True


class Notices:
    """Says once that the run waits for workers (queued), and once per stall (no worker)."""

    def __init__(self, on_notice: Callable[[str], None] | None) -> None:
        self.on_notice = on_notice
        self.began = self.last_progress = self.next_check = time.monotonic()
        self.noticed_queue = self.noticed_stall = False

    def progressed(self) -> None:
        self.last_progress = time.monotonic()
        self.noticed_stall = False

    def check(self, status: str) -> None:
        now = time.monotonic()
        if not self.on_notice or now < self.next_check:
            return
        self.next_check = now + WAIT_NOTICE_AFTER
        if status == Run.Status.QUEUED and not self.noticed_queue:
            if now - self.began >= WAIT_NOTICE_AFTER:
                self.on_notice(waiting_message())
                self.noticed_queue = True
        elif (
            not self.noticed_stall
            and now - self.last_progress >= STALL_NOTICE_AFTER
            and not live_workers()
        ):
            self.on_notice(waiting_message())
            self.noticed_stall = True


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
