"""`cobalt run` in team mode: enqueue each experiment's run, then follow it to the end,
streaming finished items to the reporter as workers announce them, and write the results
file where the run was started.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from cobalt.config import Config
from cobalt.experiments import Experiment
from cobalt_app.engine import Reporter
from cobalt_app.models import ItemResult, Run
from cobalt_app.results import item_outcomes
from cobalt_app.runs import lifecycle
from cobalt_app.runs.claims import item_ids
from cobalt_app.selectors import finished_item_ids, run_get, run_progress
from cobalt_app.team import ensure_schema, queue_name, resume_run, run_info, start_run
from cobalt_app.team_broker import ProgressListener, check_broker, live_workers

if TYPE_CHECKING:
    from cobalt_app.launcher import RunOptions

POLL_INTERVAL = 0.5  # between database reads while no worker announces progress
MIN_POLL_INTERVAL = 0.05  # between reads however often workers announce
WAIT_NOTICE_AFTER = 2.0
STALL_NOTICE_AFTER = 30.0


class Detached(KeyboardInterrupt):
    """Ctrl-C while waiting: the run goes on on the workers."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id


def execute(
    experiments: list[Experiment],
    config: Config,
    options: RunOptions,
    *,
    on_notice: Callable[[str], None] | None = None,
) -> list[Run]:
    """`cobalt run` in team mode: enqueue every experiment's run, then stream each to the end."""
    from cobalt_app.launcher import relative_file

    check_broker()
    ensure_schema()
    on_notice = on_notice or _print_notice
    no_cache = options.get("no_cache", False)
    resume_run_id = options.get("resume_run_id")
    started: list[tuple[Run, Experiment, list[int]]] = []
    for experiment in experiments:
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
    run = run_get(run_id)
    total, order = run.total_items, run.evaluator_names
    done = total - len(waiting)
    began = last_progress = next_check = time.monotonic()
    noticed_queue = noticed_stall = False
    counted, fetched_at = -1, 0.0
    listener = ProgressListener(run_id)
    try:
        while True:
            read_at = time.monotonic()
            status, finished = run_progress(run_id)
            while cursor < len(watched) and watched[cursor] not in waiting:
                cursor += 1
            fresh = []
            # Read the items only when the run's counter moved (or now and then, to be sure).
            stale = time.monotonic() - fetched_at > 2
            look = finished != counted or status in Run.FINISHED or stale
            if cursor < len(watched) and look:
                counted, fetched_at = finished, time.monotonic()
                ended = finished_item_ids(run_id, from_id=watched[cursor])
                fresh = [i for i in ended if i in waiting]
            if fresh:
                waiting.difference_update(fresh)
                last_progress = time.monotonic()
                noticed_stall = False
                for outcome in item_outcomes(fresh, order=order):
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
    run = lifecycle.write_results(run_id, config)
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
