"""Start a run in the background and answer at once; cancel a run that is still going.

A started run is the launcher's way in (`launcher.launch`), scheduled on the process's
long-lived event loop, which executes it (or hands it to the workers in team mode and
follows it). The request thread waits only until the run row exists, then answers with its id.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from concurrent.futures import CancelledError as FutureCancelled
from dataclasses import dataclass
from typing import Any

from cobalt.config import Config
from cobalt.errors import CobaltError, ConflictError
from cobalt.experiments import Experiment
from cobalt_app import aio, launcher
from cobalt_app.models import Run
from cobalt_app.selectors import run_get

logger = logging.getLogger("cobalt.api")

START_TIMEOUT = 120.0
CANCEL_TIMEOUT = 30.0
POLL_INTERVAL = 0.05


class StartFailed(CobaltError):
    """The run could not be created; the message says why."""

    field = "file"


class RunAlreadyFinished(ConflictError):
    def __init__(self, run: Run) -> None:
        super().__init__(
            f"run {run.id} is already {run.status}; only a running run can be cancelled"
        )
        self.run = run


@dataclass
class _Running:
    loop: asyncio.AbstractEventLoop
    task: asyncio.Task


_running: dict[str, _Running] = {}
_running_lock = threading.Lock()
_launched: set[concurrent.futures.Future] = set()  # runs started here that have not ended


def in_flight() -> int:
    """How many runs started here are still executing (or following their workers)."""
    with _running_lock:
        return len(_launched)


class _StartSignal:
    """A launcher reporter that tells the request thread the run exists."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.run_id: str | None = None

    def run_started(self, run: Run, experiment: Experiment) -> None:
        self.run_id = run.id
        try:
            # Called on the event loop, inside the task that executes the run: remember it
            # so a cancel request can cancel that task (as Ctrl-C does for the CLI).
            loop = asyncio.get_running_loop()
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        if task is not None:
            with _running_lock:
                _running[run.id] = _Running(loop, task)
        self.started.set()

    def item_finished(self, outcome: Any, done: int, total: int) -> None:
        pass

    def run_finished(self, run: Run) -> None:
        with _running_lock:
            _running.pop(run.id, None)


def start_run(
    experiment: Experiment,
    config: Config,
    *,
    concurrency: int | None = None,
    tags: list[str] | None = None,
    timeout: float = START_TIMEOUT,
    budget: dict[str, Any] | None = None,
) -> str:
    """Start one experiment on the engine's loop; return its run id once the run exists
    (`budget`: the items' budgets as the run stores them, `maxToolCalls`, ...)."""
    signal = _StartSignal()
    failure: list[str] = []

    def ended(future: concurrent.futures.Future) -> None:
        exc = None if future.cancelled() else future.exception()
        if exc is not None and not signal.started.is_set():
            failure.append(f"{type(exc).__name__}: {exc}")
        elif exc is not None and not isinstance(exc, asyncio.CancelledError | FutureCancelled):
            logger.error(
                "run %s of %s ended with an error",
                signal.run_id,
                experiment.name,
                exc_info=(type(exc), exc, exc.__traceback__),
            )
        with _running_lock:
            if signal.run_id:
                _running.pop(signal.run_id, None)
            _launched.discard(future)
        signal.started.set()

    launched = launcher.launch(
        [experiment],
        config,
        reporter=signal,
        overrides={"concurrency": concurrency, **(budget or {})},
        tags=tags or [],
    )
    future = asyncio.run_coroutine_threadsafe(launched, aio.loop_thread().loop)
    with _running_lock:
        _launched.add(future)
    future.add_done_callback(ended)
    deadline = time.monotonic() + timeout
    while not signal.started.wait(POLL_INTERVAL):
        if time.monotonic() > deadline:
            raise StartFailed(f"the run of {experiment.name!r} was not created within {timeout:g}s")
    if signal.run_id is None:
        raise StartFailed(
            f"the run of {experiment.name!r} could not start: "
            + (failure[0] if failure else "it ended before creating a run")
        )
    return signal.run_id


def cancel_run(run_id: str, *, timeout: float = CANCEL_TIMEOUT) -> Run:
    """Cancel a queued or running run; raises `RunAlreadyFinished` when it has ended."""
    run = run_get(run_id)
    if run.is_finished:
        raise RunAlreadyFinished(run)
    with _running_lock:
        running = _running.get(run.id)
    if running is not None:
        running.loop.call_soon_threadsafe(running.task.cancel)
        return _wait_finished(run.id, timeout)
    # Executed by workers or by another process: cancel in the database. Unfinished items
    # become `cancelled`; workers drop them, and the process executing an embedded run
    # notices at its next heartbeat (`runs.embedded.keep_alive`) and stops.
    from cobalt_app.runs import lifecycle

    run, _ = lifecycle.cancel(run.id)
    if run.status != Run.Status.CANCELLED:
        raise RunAlreadyFinished(run)
    return run


def _wait_finished(run_id: str, timeout: float) -> Run:
    deadline = time.monotonic() + timeout
    while True:
        run = run_get(run_id)
        if run.is_finished or time.monotonic() > deadline:
            return run
        time.sleep(POLL_INTERVAL)
