"""What a worker process keeps between tasks, and the per-item path of team mode.

One `Runtime` per worker process holds: the experiment files it imported (cached per path
and modification time), the long-lived event loop of `cobalt_app.aio` on which every async
runner and judge runs (so a module-level `AsyncOpenAI()` client keeps working), one
`EvalEnv` (provider clients, judge cache, a small pool of database threads) and a heartbeat
thread that renews the leases of held items, announces the worker in Redis and sweeps.

A Celery thread handles one lane of a run: claim a few items (one statement) → for each,
execute (the engine's `execute_item`, or the evaluators only for a re-judge) → record
(`services.record_item_outcomes`, through `team.items_record`, batched across threads) →
finalise the run if it was the last item → claim the run's next pending items, to the end.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from cobalt.config import Config, active_config
from cobalt.experiments import Experiment
from cobalt_app import aio, discovery, engine, recordings, team, traces
from cobalt_app.engine import EvalEnv, ItemOutcome
from cobalt_app.models import ItemResult, Run

logger = logging.getLogger("cobalt.worker")
LOOP_STOPPED_EXIT = 70  # EX_SOFTWARE: the worker's event loop stopped under it
SUPERVISOR_ENV = "COBALT_SUPERVISOR_PID"  # set by `cobalt worker --processes N` for its children
T = TypeVar("T")
Work = Callable[..., Coroutine[Any, Any, ItemOutcome]]  # (experiment, claim, info) → outcome


class ExperimentUnavailable(Exception):
    """The run's experiment cannot be loaded on this worker; the message says why."""


class Recorder:
    """Records finished items in batches on one thread: one transaction for many items.

    Items hand over their outcome and await the commit (the message is acknowledged only
    after it). Whatever arrives while a batch commits forms the next batch, so a busy worker
    pays for a few transactions per second instead of one per item.
    """

    MAX_BATCH = 200

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="cobalt-recorder", daemon=True)
        self.thread.start()

    def submit(self, claim: team.Claim, outcome: ItemOutcome) -> concurrent.futures.Future:
        """Resolves to (recorded?, the run if this item finalised it) once committed."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self.inbox.put((claim, outcome, done))
        return done

    def _serve(self) -> None:
        while True:
            batch = [self.inbox.get()]
            while len(batch) < self.MAX_BATCH:
                try:
                    batch.append(self.inbox.get_nowait())
                except queue.Empty:
                    break
            try:
                results = self._commit(batch)
            except Exception:
                # One bad outcome must not sink the others: record them one by one.
                for entry in batch:
                    self._commit_alone(*entry)
            else:
                for (*_, done), result in zip(batch, results, strict=True):
                    done.set_result(result)

    def _commit_alone(
        self, claim: team.Claim, outcome: ItemOutcome, done: concurrent.futures.Future
    ) -> None:
        try:
            done.set_result(self._commit([(claim, outcome, done)])[0])
            return
        except Exception as exc:
            logger.exception("could not record item %s", claim.item_id)
            failure = unavailable(claim, f"the result could not be stored: {exc}")
        try:  # an error the item shows, rather than a retry that fails the same way
            done.set_result(self._commit([(claim, failure, done)])[0])
        except Exception as exc:
            done.set_exception(exc)

    def _commit(self, batch: list) -> list[tuple[bool, Any]]:
        pairs = [(claim, outcome) for claim, outcome, _ in batch]
        recorded, due = guarded(team.items_record, pairs)
        finalised = {run_id: guarded(team.finish_if_done, run_id, force=True) for run_id in due}
        team.announce_progress({claim.run_id for claim, _ in pairs})
        results = []
        for claim, _, _ in batch:
            run = finalised.pop(claim.run_id, None) if claim.item_id in recorded else None
            results.append((claim.item_id in recorded, run))
        return results


@dataclass
class Held:
    claim: team.Claim
    task: asyncio.Future | None = None  # on the runtime's loop, while the item executes
    dropped: bool = False  # cancelled, or the lease went to another worker


class Runtime:
    def __init__(self, config: Config, *, concurrency: int = 8, name: str | None = None) -> None:
        self.config = config
        self.concurrency = concurrency
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.queues: list[str] = [team.queue_name()]
        self.loop_thread = aio.loop_thread()
        self.loop = self.loop_thread.loop
        self.db = aio.DatabaseThread()
        self.db.pool = ThreadPoolExecutor(
            max_workers=max(2, min(8, concurrency // 4)), thread_name_prefix="cobalt-db"
        )
        self.env: EvalEnv = engine.make_env(config, self.db)
        self.runners = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="cobalt-run")
        self.recorder = Recorder()
        self.held: dict[int, Held] = {}
        self.lock = threading.Lock()
        self.files: dict[Path, tuple[int, discovery.LoadedFile]] = {}
        self.run_states: dict[str, tuple[float, str | None]] = {}
        self.import_lock = threading.Lock()
        self.started = time.time()
        self.processed = 0
        self._stop = threading.Event()
        self.stopping = threading.Event()  # warm shutdown: claim nothing more
        self._orphaned = False
        self._beat: threading.Thread | None = None

    # -- plumbing

    def _load_plugins(self) -> None:
        """Custom evaluator types (entry points, `plugins = [...]`), as `cobalt run` loads them."""
        from cobalt_app import plugins

        try:
            plugins.load_plugins(self.config)
        except plugins.PluginError as exc:
            raise ExperimentUnavailable(f"worker {self.name}: {exc}") from None

    def call_db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run an ORM function on the database pool (few connections for many items)."""
        return self.db.pool.submit(guarded, fn, *args, **kwargs).result()

    def on_loop(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def experiment(self, info: team.RunInfo) -> Experiment:
        """The run's experiment, imported from this worker's project folder (cached)."""
        if not info.file:
            raise ExperimentUnavailable(f"run {info.id} has no experiment file recorded")
        project = self.config.project_dir
        try:
            path = discovery.confine(info.file, project, what="experiment file")
            mtime = path.stat().st_mtime_ns
        except (discovery.PathOutsideProject, OSError) as exc:
            raise ExperimentUnavailable(
                f"{info.file} is not readable on worker {self.name} (project folder {project}):"
                f" {exc}. Mount the project folder where the worker runs."
            ) from None
        with self.import_lock:
            cached = self.files.get(path)
            if cached is None or cached[0] != mtime:
                self._load_plugins()
                cached = (mtime, discovery.load_file(path, project))
                self.files[path] = cached
        loaded = cached[1]
        if loaded.error:
            raise ExperimentUnavailable(
                f"{info.file} failed to import on worker {self.name}: {loaded.error}"
            )
        for experiment in loaded.experiments:
            if experiment.name == info.name:
                return experiment
        raise ExperimentUnavailable(
            f"{info.file} on worker {self.name} defines no experiment named {info.name!r}"
        )

    def env_for(self, info: team.RunInfo) -> EvalEnv:
        env = self.env
        if info.no_cache and self.env.cache_enabled:
            env = dataclasses.replace(env, cache_enabled=False)
        replay = recordings.settings_for(self.config, info.config, info.id)
        return env if replay is None else dataclasses.replace(env, replay=replay)

    # -- the per-item path

    def execute(self, run_id: str, item_ids: list[int], then: int) -> str:
        """Task body: a lane of the run (see `team.enqueue`)."""
        return self._lane(run_id, item_ids, then, self._execute_item)

    def rejudge(self, run_id: str, item_ids: list[int], then: int) -> str:
        """Task body for a re-judge: the stored outputs scored again, the agent not called."""
        return self._lane(run_id, item_ids, then, self._rejudge_item)

    def _lane(self, run_id: str, item_ids: list[int], then: int, work: Work) -> str:
        """The named items, then the run's next pending ones, `then` at a time, to the end."""
        self.ensure_started()
        done = 0
        # Bounded: the message must be acknowledged before the broker's visibility timeout
        # gives it to another worker as well (which would add a lane to the run).
        deadline = time.monotonic() + lane_budget()
        stopping = self.stopping.is_set()
        claims = [] if stopping else self.call_db(team.items_claim, item_ids, self.name)
        while True:
            done += self._run_claims(claims, work)
            if then < 1 or self.run_stopped(run_id):
                break
            if self.stopping.is_set() or time.monotonic() > deadline:
                # The lane goes on as a new message (here or elsewhere) from the run's next items.
                self.call_db(team.enqueue_lane, run_id, then)
                break
            claims = self.call_db(team.items_claim_next, run_id, self.name, then)
            if not claims:
                break
        return f"{done} items"

    def _run_claims(self, claims: list[team.Claim], work: Work) -> int:
        if not claims:
            return 0
        entries = [Held(claim) for claim in claims]
        with self.lock:
            self.held.update((entry.claim.item_id, entry) for entry in entries)
        try:
            # Imports happen here, on this thread, never on the event loop.
            plans = {claim.run_id: self._plan(claim.run_id) for claim in claims}
            # One hand-over to the loop for the claimed items, not one per item.
            statuses = self.on_loop(self._run_claimed(entries, plans, work)).result()
        finally:
            with self.lock:
                for entry in entries:
                    self.held.pop(entry.claim.item_id, None)
        return sum(status != "dropped" for status in statuses)

    def _plan(self, run_id: str) -> tuple[team.RunInfo, Experiment | str]:
        """The run's settings and its experiment, or why this worker cannot load it."""
        info = team.cached_run_info(run_id) or self.call_db(team.run_info, run_id)
        try:
            return info, self.experiment(info)
        except ExperimentUnavailable as exc:
            return info, str(exc)

    async def _run_claimed(
        self,
        entries: list[Held],
        plans: dict[str, tuple[team.RunInfo, Experiment | str]],
        work: Work,
    ) -> list[str]:
        """The claimed items one after another; the others wait their turn, leased."""
        statuses = []
        for position, held in enumerate(entries):
            run_id = held.claim.run_id
            stopped = bool(position) and await self._run_stopped(run_id)
            if stopped or held.dropped or self.stopping.is_set():  # checked last, on the loop
                statuses.append("dropped")
                continue
            statuses.append(await self._run_one(held, *plans[run_id], work))
            with self.lock:
                self.held.pop(held.claim.item_id, None)
        return statuses

    async def _run_one(
        self, held: Held, info: team.RunInfo, experiment: Experiment | str, work: Work
    ) -> str:
        claim = held.claim
        if isinstance(experiment, str):
            outcome = unavailable(claim, experiment)
        else:
            held.task = asyncio.ensure_future(work(experiment, claim, info))
            try:
                outcome = await held.task
            except asyncio.CancelledError:
                if not held.dropped:
                    raise  # the loop is stopping, not this item
                return "dropped"
        recorded, run = await asyncio.wrap_future(self.recorder.submit(claim, outcome))
        if not recorded:
            return "superseded"
        self.processed += 1
        if run is not None:
            await self._notify(run)
        return outcome.status

    def run_stopped(self, run_id: str) -> bool:
        """Whether the run was cancelled (or finished): read at most once a second per run."""
        known = self._known_stopped(run_id)
        if known is not None:
            return known
        return self._remember(run_id, self.call_db(team.run_status, run_id))

    async def _run_stopped(self, run_id: str) -> bool:
        known = self._known_stopped(run_id)
        if known is not None:
            return known
        status = await asyncio.wrap_future(self.db.pool.submit(guarded, team.run_status, run_id))
        return self._remember(run_id, status)

    def _known_stopped(self, run_id: str) -> bool | None:
        checked = self.run_states.get(run_id)
        if checked is None or time.monotonic() - checked[0] > 1.0:
            return None
        return checked[1] is None or checked[1] in Run.FINISHED

    def _remember(self, run_id: str, status: str | None) -> bool:
        self.run_states[run_id] = (time.monotonic(), status)
        return status is None or status in Run.FINISHED

    async def _execute_item(
        self, experiment: Experiment, claim: team.Claim, info: team.RunInfo
    ) -> ItemOutcome:
        return await engine.execute_item(
            experiment,
            claim.snapshot,
            self.env_for(info),
            timeout=info.timeout,
            pool=self.runners,
        )

    async def _rejudge_item(
        self, experiment: Experiment, claim: team.Claim, info: team.RunInfo
    ) -> ItemOutcome:
        from cobalt_app import rejudge

        return await rejudge.rejudge_outcome(
            experiment, info.config, claim.snapshot, claim.stored, self.env_for(info)
        )

    async def _notify(self, run) -> None:
        from cobalt_app import webhooks

        await webhooks.notify_run(self.config, run)

    # -- warm shutdown

    def begin_shutdown(self, grace: float | None = None) -> None:
        """SIGTERM (Celery's warm shutdown): claim nothing more, hand back at once the claimed
        items not started yet, give the started ones `grace` seconds (`COBALT_SHUTDOWN_GRACE`,
        8 by default: under Docker's 10 s before SIGKILL) and hand back those still running.
        Handed back means pending again, for another worker; each lane that stops is
        re-enqueued (`team.enqueue_lane`), so the run keeps its concurrency."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        grace = shutdown_grace() if grace is None else grace
        threading.Thread(
            target=self._hand_back, args=(grace,), name="cobalt-shutdown", daemon=True
        ).start()

    def _hand_back(self, grace: float) -> None:
        waiting = asyncio.run_coroutine_threadsafe(self._drop(started=False), self.loop)
        self._release(waiting.result(timeout=5))
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            with self.lock:
                if not self.held:
                    return
            time.sleep(0.05)
        running = asyncio.run_coroutine_threadsafe(self._drop(started=True), self.loop)
        self._release(running.result(timeout=5))

    async def _drop(self, *, started: bool) -> list[int]:
        """Drop the held items (started or not yet): on the loop, between two items' steps."""
        with self.lock:
            entries = [e for e in self.held.values() if (e.task is not None) == started]
        for entry in entries:
            entry.dropped = True
            if entry.task is not None:
                entry.task.cancel()
        return [entry.claim.item_id for entry in entries]

    def _release(self, item_ids: list[int]) -> None:
        if not item_ids:
            return
        try:
            released = guarded(team.leases_release, self.name, item_ids)
        except Exception:
            logger.exception(
                "could not hand back %d items; their leases will expire", len(item_ids)
            )
            return
        logger.warning("shutting down: handed back %d items to other workers", released)

    # -- heartbeats

    def ensure_started(self) -> None:
        if self._beat is None:
            with self.lock:
                if self._beat is None:
                    traces.enable_for_process(self.env.trace)
                    self._beat = threading.Thread(
                        target=self._beat_loop, name="cobalt-heartbeat", daemon=True
                    )
                    self._beat.start()

    def _beat_loop(self) -> None:
        interval = team.beat_interval()
        while True:
            try:
                self.beat()
            except Exception:
                logger.exception("worker heartbeat failed; retrying")
            if self._stop.wait(interval):
                return

    def beat(self) -> None:
        """Renew leases (dropping items taken away), announce this worker, sweep in turn.

        Runs on the heartbeat thread with its own connection, never blocking the items.
        """
        self._stop_if_orphaned()
        self._exit_if_loop_stopped()
        with self.lock:
            held = dict(self.held)
        if held:
            still = guarded(team.leases_renew, self.name, list(held))
            for item_id, entry in held.items():
                if item_id not in still:
                    entry.dropped = True
                    if entry.task is not None:
                        self.loop.call_soon_threadsafe(entry.task.cancel)
        team.worker_beat(self.name, self.describe(len(held)), ttl=team.beat_interval() * 3 + 1)
        if team.sweep_turn(self.name):
            report = guarded(team.sweep)
            if report.requeued or report.abandoned or report.redispatched:
                logger.warning("sweeper: %s", report)

    def _stop_if_orphaned(self) -> None:
        """A process of `cobalt worker --processes N` whose supervisor was killed stops too
        (warm shutdown: the items in hand finish first) instead of running on unseen."""
        supervisor = os.environ.get(SUPERVISOR_ENV)
        if supervisor and os.getppid() != int(supervisor) and not self._orphaned:
            self._orphaned = True
            logger.warning("the `cobalt worker` that started this process is gone; stopping")
            os.kill(os.getpid(), signal.SIGTERM)

    def _exit_if_loop_stopped(self) -> None:
        """The event loop every item runs on stopped (user code stopped it, or it crashed):
        nothing this process holds can finish. Renewing its leases would hide that from the
        sweeper, so the process leaves at once; its items go to other workers when their
        leases expire, and `cobalt worker --processes N` starts a new process."""
        if not self.loop_thread.stopped.done():
            return
        failure = self.loop_thread.stopped.exception()
        logger.critical(
            "the worker's event loop stopped (%s): exiting so that its %d items are recovered",
            repr(failure) if failure else "loop.stop() was called",
            len(self.held),
        )
        try:
            team.worker_gone(self.name)
        finally:
            logging.shutdown()
            os._exit(LOOP_STOPPED_EXIT)

    def describe(self, held: int) -> dict[str, Any]:
        return {
            "name": self.name,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "concurrency": self.concurrency,
            "queues": self.queues,
            "held": held,
            "processed": self.processed,
            "started": self.started,
            "beat": time.time(),
        }

    def stop(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        try:
            team.worker_gone(self.name)
        except Exception:
            logger.warning("could not unregister worker %s", self.name)


def lane_budget() -> float:
    """Seconds a lane claims new items for: a third of the broker's visibility timeout."""
    from django.conf import settings

    return max(1.0, float(settings.VISIBILITY_TIMEOUT) / 3)


def shutdown_grace() -> float:
    """Seconds a stopping worker gives the items it is running (`COBALT_SHUTDOWN_GRACE`)."""
    try:
        return max(0.0, float(os.environ.get("COBALT_SHUTDOWN_GRACE") or 8))
    except ValueError:
        return 8.0


def guarded(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call an ORM function on a long-lived thread; drop the connection if it broke."""
    from django.db import DatabaseError, connection

    try:
        return fn(*args, **kwargs)
    except DatabaseError:
        connection.close_if_unusable_or_obsolete()  # the next call reconnects
        raise


def unavailable(claim: team.Claim, message: str) -> ItemOutcome:
    snapshot = claim.snapshot
    return ItemOutcome(
        id=claim.item_id,
        item_index=snapshot.item_index,
        run_index=snapshot.run_index,
        item_key=snapshot.item_key,
        status=ItemResult.Status.ERROR,
        error=message,
        latency_ms=0.0,
    )


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def configure(config: Config, *, concurrency: int, queues: list[str]) -> Runtime:
    """Called by `cobalt worker` before the Celery worker starts."""
    global _runtime
    with _runtime_lock:
        _runtime = Runtime(config, concurrency=concurrency)
        _runtime.queues = queues
    _runtime.ensure_started()
    return _runtime


def current() -> Runtime:
    """This process's runtime (created on first use when Celery was started some other way)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            from cobalt_project.celery import app

            _runtime = Runtime(active_config(), concurrency=app.conf.worker_concurrency or 8)
        return _runtime


def begin_shutdown() -> None:
    """Celery's `worker_shutting_down`: see `Runtime.begin_shutdown`."""
    if _runtime is not None:
        _runtime.begin_shutdown()


def shutdown() -> None:
    if _runtime is not None:
        _runtime.stop()
