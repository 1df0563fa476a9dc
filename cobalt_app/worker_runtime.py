"""What a worker process keeps between tasks, and its lanes (team mode).

One `Runtime` per worker process holds: the experiment files it imported (cached per path
and modification time), the long-lived event loop of `cobalt_app.aio` on which every async
runner and judge runs (so a module-level `AsyncOpenAI()` client keeps working), one
`EvalEnv` (provider clients, judge cache, a small pool of database threads) and a heartbeat
thread that renews the leases of held items, announces the worker in Redis and sweeps.

A Celery message is one lane of a run (`runs.lane.run_lane`, the embedded mode's loop too),
executing while it holds one of the run's slots (`team_lanes`: never more lanes than the
run's `concurrency`), for at most a third of the broker's visibility timeout; then its
continuation is enqueued.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from cobalt.config import Config, active_config
from cobalt.errors import CobaltError
from cobalt.experiments import Experiment
from cobalt_app import (
    aio,
    discovery,
    engine,
    recordings,
    sync_items,
    team,
    team_broker,
    team_cursor,
    team_lanes,
    traces,
)
from cobalt_app.engine import EvalEnv
from cobalt_app.runs import claims, lifecycle
from cobalt_app.runs.lane import (
    Held,
    LaneHost,
    RunStatuses,
    Step,
    failing_step,
    run_lane,
    step_for,
    sync_items_for,
)
from cobalt_app.runs.recorder import Recorder

logger = logging.getLogger("cobalt.worker")
LOOP_STOPPED_EXIT = 70  # EX_SOFTWARE: the worker's event loop stopped under it
SUPERVISOR_ENV = "COBALT_SUPERVISOR_PID"  # set by `cobalt worker --processes N` for its children
T = TypeVar("T")


class ExperimentUnavailable(CobaltError):
    """The run's experiment cannot be loaded on this worker; the message says why."""


class Runtime:
    def __init__(self, config: Config, *, concurrency: int = 8, name: str | None = None) -> None:
        self.config = config
        self.concurrency = concurrency
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.queues: list[str] = [team.queue_name()]
        self.loop_thread = aio.loop_thread()
        self.loop = self.loop_thread.loop
        self.db = aio.DatabaseThread(threads=max(2, min(8, concurrency // 4)))
        self.env: EvalEnv = engine.make_env(config, self.db)
        self.runners = aio.Threads("cobalt-run", concurrency)
        self.recorder = Recorder(config=config, announce=team_broker.announce_progress)
        self.held: dict[int, Held] = {}
        self.slots = team_lanes.Slots(self.name)
        self.lock = threading.Lock()
        self.files: dict[Path, tuple[int, discovery.LoadedFile]] = {}
        self.import_lock = threading.Lock()
        self.started = time.time()
        self.processed = 0
        self._stop = threading.Event()
        self.stopping = threading.Event()  # warm shutdown: claim nothing more
        self.host = LaneHost(
            name=self.name,
            db=self._db,
            recorder=self.recorder,
            statuses=RunStatuses(self._db),
            stopping=self.stopping.is_set,
            drops_items=True,
            records_before_claims=True,
            hold=self._hold,
            release=self._unhold,
            make_way=self.db.make_way,
            claim_next=team_cursor.claim_next,
        )
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
        return self.db.pool.submit(aio.guarded, fn, *args, **kwargs).result()

    async def _db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.wrap_future(self.db.pool.submit(aio.guarded, fn, *args, **kwargs))

    def on_loop(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def experiment(self, info: team.RunInfo) -> Experiment:
        """The run's experiment, imported from this worker's project folder (cached)."""
        if not info.file:
            raise ExperimentUnavailable(f"run {info.id} has no experiment file recorded")
        project = self.config.project_dir
        try:
            path = discovery.runnable_file(info.file, self.config, what="experiment file")
            mtime = path.stat().st_mtime_ns
        except (discovery.FileRefused, OSError) as exc:
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

    # -- the lanes

    def lane(self, run_id: str, item_ids: list[int], then: int) -> str:
        """Task body: a lane of the run (see `team.enqueue`), if one of the run's slots is
        free (else `concurrency` lanes execute already: this message was delivered twice, or
        sent again by the sweeper), bounded in time: the message must be acknowledged before
        the broker's visibility timeout gives it to another worker as well; its continuation
        goes on, here or elsewhere, from the run's next items."""
        self.ensure_started()
        info = team.cached_run_info(run_id) or self.call_db(team.run_info, run_id)
        slot = self.slots.take(run_id, info.concurrency)
        if slot is None:
            return "the run's lanes are all executing"
        try:
            # Imports happen here, on this thread, never on the loop.
            step, batches = self._step(info)
            size = team.SYNC_CHUNK if batches is not None and then >= team.MAX_CHUNK else then
            end = self.on_loop(
                run_lane(
                    run_id,
                    step,
                    dataclasses.replace(self._lane_host(slot), batches=batches),
                    size=lambda: size,
                    first=item_ids,
                    deadline=time.monotonic() + lane_budget(),
                )
            ).result()
        finally:
            self.slots.release(slot)  # before the continuation: it takes a free slot
        self.processed += end.recorded
        if end.more:
            self.call_db(team.enqueue_lane, run_id, then)
        return f"{end.executed} items"

    def _lane_host(self, slot: team_lanes.Slot) -> LaneHost:
        """The worker's host, for a lane holding `slot`: it stops when it loses the slot."""
        return dataclasses.replace(
            self.host,
            stopping=lambda: slot.lost or self.stopping.is_set(),
            hold=functools.partial(self._hold, slot=slot),
            release=functools.partial(self._unhold, slot=slot),
        )

    def _step(self, info: team.RunInfo) -> tuple[Step, sync_items.SyncItems | None]:
        """The run's per-item step, and its items' batches when the step is all sync
        (`sync_items`); or an error for each item saying why this worker cannot load the
        run's experiment."""
        try:
            experiment = self.experiment(info)
        except CobaltError as exc:  # the worker's one catch: each item fails saying why
            return failing_step(str(exc)), None
        env = self.env_for(info)
        return (
            step_for(experiment, info.config, env, self.runners),
            sync_items_for(experiment, info.config, env, self.runners),
        )

    def _hold(self, entries: list[Held], slot: team_lanes.Slot | None = None) -> None:
        with self.lock:
            self.held.update((entry.claim.item_id, entry) for entry in entries)
            if slot is not None:
                slot.items.update(entry.claim.item_id for entry in entries)

    def _unhold(self, entries: list[Held], slot: team_lanes.Slot | None = None) -> None:
        with self.lock:
            for entry in entries:
                self.held.pop(entry.claim.item_id, None)
                if slot is not None:
                    slot.items.discard(entry.claim.item_id)

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
            entries = list(self.held.values())
        return [entry.claim.item_id for entry in entries if entry.drop(started=started)]

    def _release(self, item_ids: list[int]) -> None:
        if not item_ids:
            return
        try:
            released = aio.guarded(claims.leases_release, self.name, item_ids)
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
        interval = team_broker.beat_interval()
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
        for slot in self.slots.renew():  # before the leases: a dead lane's slot expires first
            self._lost(slot)
        with self.lock:
            held = dict(self.held)
        if held:
            still = aio.guarded(claims.leases_renew, self.name, list(held))
            for item_id, entry in held.items():
                if item_id not in still:
                    self._drop_entry(entry)
        team_broker.worker_beat(
            self.name, self.describe(len(held)), ttl=team_broker.beat_interval() * 3 + 1
        )
        if team_broker.sweep_turn(self.name):
            report = aio.guarded(team.sweep, self.config)
            if report.requeued or report.abandoned or report.redispatched:
                logger.warning("sweeper: %s", report)

    def _drop_entry(self, entry: Held) -> None:
        entry.dropped = True
        self.loop.call_soon_threadsafe(entry.drop)

    def _lost(self, slot: team_lanes.Slot) -> None:
        """Another lane took this lane's slot (this worker was silent for a whole grace
        period): the lane stops, its items dropped. Their leases ran out with the slot (the
        heartbeat renews both), so the sweeper gives them to the lanes executing now."""
        slot.lost = True
        with self.lock:
            entries = [self.held[i] for i in slot.items if i in self.held]
        for entry in entries:
            self._drop_entry(entry)
        logger.warning(
            "a lane of run %s lost its slot to another lane: it stops, dropping %d items",
            slot.run_id,
            len(entries),
        )

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
            team_broker.worker_gone(self.name)
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
        self.recorder.close()
        if self._beat is not None:
            self._beat.join(timeout=5)
        try:
            team_broker.worker_gone(self.name)
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
    lifecycle.webhooks_sent(timeout=10)
