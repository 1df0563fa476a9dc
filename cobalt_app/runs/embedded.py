"""The embedded mode: a run executed by the process that started it (`cobalt run`, the API,
the MCP server, a script or a notebook), as `concurrency` lanes on its long-lived loop over
the same claim and record functions as team workers, on its own database thread.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from cobalt.config import Config
from cobalt.experiments import Experiment
from cobalt.run_settings import RunSettings
from cobalt_app import liveness, recordings, services, traces
from cobalt_app.aio import DatabaseThread, Threads
from cobalt_app.engine import EvalEnv, ItemOutcome, Reporter, make_env
from cobalt_app.models import ItemResult, Run
from cobalt_app.progress import Progress
from cobalt_app.runs import lifecycle
from cobalt_app.runs.claims import Claim, items_claim_next
from cobalt_app.runs.lane import (
    LaneHost,
    RunStatuses,
    run_lane,
    step_for,
    sync_items_for,
    worker_name,
)
from cobalt_app.runs.recorder import Recorder

logger = logging.getLogger("cobalt.engine")

MAX_CLAIM = 250  # items a lane takes at once, at most; the pool claims this many per lane
# Seconds outcomes wait to be committed together: the claims wait behind each commit on the
# one SQLite writer (team workers commit sooner: `cobalt run` shows what they recorded).
LINGER = 0.25
TAKES_PER_LANE = 2  # a lane takes at most 1/(lanes × this) of what is left: lanes end together


async def run_experiment(
    experiment: Experiment,
    config: Config,
    *,
    db: DatabaseThread,
    reporter: Reporter | None = None,
    no_cache: bool = False,
    overrides: dict[str, Any] | None = None,
    tags: list[str] | None = None,
    file: str = "",
    resume_run_id: str | None = None,
    on_start: Callable[[str], None] | None = None,
) -> Run:
    """Create (or resume) a run of an experiment, execute it in this process, finalise it.

    `on_start` gets the run's id as soon as it exists (to name it if the run is interrupted).
    """
    if resume_run_id:
        run = await db(lifecycle.resume, resume_run_id, grace=liveness.grace())
    else:
        run = await db(
            lifecycle.create, experiment, config, overrides=overrides, tags=tags, file=file
        )
    if on_start is not None:
        on_start(run.id)
    env = make_env(config, db, no_cache=no_cache)
    env.replay = recordings.settings_for(config, run.config, run.id)
    return await drive_run(run, experiment, config, env, reporter=reporter)


async def drive_run(
    run: Run,
    experiment: Experiment,
    config: Config,
    env: EvalEnv,
    *,
    reporter: Reporter | None = None,
) -> Run:
    """The life of an embedded run once it exists, the same for a run and a re-judge: start
    it, execute it (`execute_lanes`) while keeping it alive, and finalise it whatever happens
    — `completed`, `cancelled` (Ctrl-C, a client gone, or `cobalt cancel` from elsewhere) or
    `failed` — its finalisation writes its results file — and wait for its webhooks."""
    db = env.db
    status, failure = Run.Status.COMPLETED, ""
    stopped_elsewhere = asyncio.Event()
    try:
        started = await db(services.run_start, run.id)
        run = await db(Run.objects.get, id=run.id)
        if reporter is not None:
            reporter.run_started(run, experiment)
        if not started:  # cancelled from elsewhere between its creation and now
            status = Run.Status.CANCELLED
        else:
            with collector_for_a_run():
                async with keep_alive(run.id, db) as stopped_elsewhere:
                    await execute_lanes(run, experiment, config, env, reporter=reporter)
    except asyncio.CancelledError:
        status = Run.Status.CANCELLED
        await asyncio.shield(db(services.run_cancel_pending, run.id))
        if not stopped_elsewhere.is_set():
            raise  # Ctrl-C, a client gone: the caller is being cancelled too
        asyncio.current_task().uncancel()  # cancelled by another process: a finished run
    except Exception as exc:
        status, failure = Run.Status.FAILED, f"{type(exc).__name__}: {exc}"
        raise
    finally:
        run = await asyncio.shield(_end(run.id, status, failure, config, db))
        await env.hub.aclose()
        if status == Run.Status.FAILED:
            await lifecycle.webhooks_delivered()
    if reporter is not None:
        await db(reporter.run_finished, run)
    await lifecycle.webhooks_delivered()  # never raises; delivery failures are logged
    return run


async def _end(run_id: str, status: str, failure: str, config: Config, db: DatabaseThread) -> Run:
    """Finalise the run (and so write its results file), unless it was finalised already:
    by the lane that recorded its last item, or a cancel from elsewhere."""
    run = await db(lifecycle.finalise, run_id, status=status, failure=failure, config=config)
    return run or await db(Run.objects.get, id=run_id)


async def execute_lanes(
    run: Run,
    experiment: Experiment,
    config: Config,
    env: EvalEnv,
    *,
    reporter: Reporter | None = None,
) -> None:
    """`concurrency` lanes over the run's pending items; each outcome reported as it comes."""
    db = env.db
    concurrency = RunSettings.from_run_config(run.config).concurrency
    pending = await db(
        ItemResult.objects.filter(run_id=run.id, status=ItemResult.Status.PENDING).count
    )
    total = run.total_items
    lanes = min(concurrency, pending) or 1
    done = total - pending
    progress = Progress(experiment.on_progress, experiment.name) if experiment.on_progress else None

    async def finished(outcome: ItemOutcome) -> None:
        nonlocal done
        done += 1
        if reporter is not None:
            reporter.item_finished(outcome, done, total)
        if progress is not None:
            await progress.notify(done, total)

    threads = Threads("cobalt-runner", concurrency)
    recorder = Recorder(config=config, commit_on=db.pool, linger=LINGER)
    # No `make_way` between items: each `time.sleep(0)` handing the GIL to the database
    # thread cost the loop a system call and a hand-over of the GIL there and back (issue 41:
    # 0.6 to 0.8 s of CPU in a 20,000-item run, 12%); the pool's claims made ahead while items
    # run wait for the GIL without a lane waiting for them.
    pool = ClaimPool(run.id, worker_name(), db, lanes=lanes, unclaimed=pending)
    host = LaneHost(
        name=pool.worker,
        db=db,
        recorder=recorder,
        statuses=RunStatuses(db),
        take=pool.take,
        batches=sync_items_for(experiment, run.config, env, threads),
    )
    step = step_for(experiment, run.config, env, threads)
    tasks = [
        asyncio.ensure_future(run_lane(run.id, step, host, size=pool.share, on_outcome=finished))
        for _ in range(lanes)
    ]
    try:
        with traces.enabled(env.trace):
            await asyncio.gather(*tasks)
    finally:
        try:
            for task in tasks:  # one lane failed: the others stop too
                if not task.cancelling():  # a lane already stopping commits what it handed over
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            # Every outcome handed over is committed before the run's pending items are
            # marked cancelled: committed after, a finished item would be lost as cancelled.
            recorder.close()
            threads.shutdown()
            pool.close()


class ClaimPool:
    """The run's claimed items, one queue for all its embedded lanes (as a script's
    semaphore over `asyncio.gather` would share them).

    The pool claims from the database ahead, MAX_CLAIM items per lane at a time, while the
    lanes run; a lane takes from it what it executes next: at most 1/(lanes × TAKES_PER_LANE)
    of what is left, so one item at a time towards the end and no lane holds an item that
    another, idle, could run. (Each lane claiming for itself, a lane's last claims held half a
    second of its work: 400 items of 100 ms ran 0.2–0.4 s past their 4 s, lanes idle.)"""

    def __init__(
        self,
        run_id: str,
        worker: str,
        db: DatabaseThread,
        *,
        lanes: int,
        unclaimed: int,
    ) -> None:
        self.run_id = run_id
        self.worker = worker
        self.db = db
        self.lanes = lanes
        self.unclaimed = unclaimed  # pending in the database, not claimed yet
        self.claims: collections.deque[Claim] = collections.deque()
        self.claiming: asyncio.Future | None = None

    def share(self) -> int:
        """How many items a lane takes now."""
        left = len(self.claims) + self.unclaimed
        return max(1, min(MAX_CLAIM, left // (self.lanes * TAKES_PER_LANE)))

    async def take(self, count: int) -> list[Claim]:
        """Up to `count` claimed items, in order; [] once the run has none left."""
        while not self.claims:
            if self.claiming is None:
                if self.unclaimed <= 0:
                    return []
                self._claim_ahead()
            await asyncio.shield(self.claiming)
        taken = [self.claims.popleft() for _ in range(min(count, len(self.claims)))]
        if len(self.claims) < self.lanes * MAX_CLAIM // 2 and self.unclaimed > 0:
            self._claim_ahead()
        return taken

    def _claim_ahead(self) -> None:
        if self.claiming is None:
            self.claiming = asyncio.ensure_future(self._claim())

    async def _claim(self) -> None:
        try:
            count = min(self.unclaimed, self.lanes * MAX_CLAIM)
            claims = await self.db(items_claim_next, self.run_id, self.worker, count)
            # Fewer than asked: the others were taken (a cancel): none left to claim.
            self.unclaimed = self.unclaimed - len(claims) if len(claims) == count else 0
            self.claims.extend(claims)
        finally:
            self.claiming = None

    def close(self) -> None:
        """Stop a claim under way (the lanes are gone; a cancelled run's claimed items are
        marked cancelled with its pending ones)."""
        if self.claiming is not None:
            self.claiming.cancel()


@contextlib.contextmanager
def collector_for_a_run() -> Iterator[None]:
    """Python's cyclic garbage collector tuned for a run, and put back afterwards.

    A run makes a few objects per item, by the hundred thousand; at the default thresholds
    the collector would walk everything the process holds (Django, the SDKs, the dataset) a
    dozen times over: 15% of a 50,000-item no-op run. What exists when the run starts is
    left out of its passes (`gc.freeze`), new objects are collected ten times less often.
    """
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(threshold[0] * 10, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


@contextlib.asynccontextmanager
async def keep_alive(run_id: str, db: DatabaseThread) -> AsyncIterator[asyncio.Event]:
    """Touch the run every few seconds while this process executes it: a run whose heartbeat
    stops (the process was killed) reads as `interrupted` (see `liveness`). A beat that finds
    the run ended — cancelled from another process (`cobalt cancel`, the API, the dashboard)
    — cancels the execution here; the yielded event says that is why it was cancelled."""
    executing = asyncio.current_task()
    stopped_elsewhere = asyncio.Event()

    async def beat() -> None:
        while True:
            await asyncio.sleep(liveness.beat_interval())
            try:
                alive = await db(services.run_heartbeat, run_id)
            except Exception as exc:  # noqa: BLE001 - a missed beat is not worth a failed run
                logger.warning("could not record the heartbeat of run %s: %s", run_id, exc)
                continue
            if not alive and executing is not None:
                stopped_elsewhere.set()
                executing.cancel()
                return

    task = asyncio.get_running_loop().create_task(beat())
    try:
        yield stopped_elsewhere
    finally:
        task.cancel()
