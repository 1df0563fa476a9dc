"""`experiment(..., on_progress=callback)`: `callback(done, total)` as items finish.

The embedded executor awaits it after each item (`notify`); in team mode the waiting client
calls it as progress reaches it (`ProgressReporter`). Sync or async callbacks; an async one
runs on the process's long-lived loop, as async runners do. An exception in the callback is
logged once per run and never stops the run.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("cobalt.progress")

ProgressCallback = Callable[[int, int], Any]


class Progress:
    """One run's progress callback, which logs its first failure and then stays quiet."""

    def __init__(self, callback: ProgressCallback, experiment: str) -> None:
        self.callback = callback
        self.experiment = experiment
        self.failed = False

    async def notify(self, done: int, total: int) -> None:
        """From async code (the embedded executor's loop): call, and await what it returns."""
        try:
            value = self.callback(done, total)
            if inspect.isawaitable(value):
                await value
        except Exception:  # noqa: BLE001 - a progress callback never stops a run
            self._failed()

    def notify_sync(self, done: int, total: int) -> None:
        """From synchronous code (team mode's waiting client)."""
        from cobalt_app import aio

        try:
            value = self.callback(done, total)
            if inspect.isawaitable(value):
                aio.run(_awaited(value))
        except Exception:  # noqa: BLE001 - a progress callback never stops a run
            self._failed()

    def _failed(self) -> None:
        if self.failed:
            return
        self.failed = True
        logger.warning(
            "on_progress of experiment %r raised; the run goes on (further errors of this "
            "callback are not logged)",
            self.experiment,
            exc_info=True,
        )


async def _awaited(value: Any) -> Any:
    return await value


class ProgressReporter:
    """A reporter that also calls each experiment's `on_progress` (team mode)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.progress: Progress | None = None

    def run_started(self, run: Any, experiment: Any) -> None:
        callback = getattr(experiment, "on_progress", None)
        self.progress = Progress(callback, experiment.name) if callback else None
        if self.inner is not None:
            self.inner.run_started(run, experiment)

    def item_finished(self, outcome: Any, done: int, total: int) -> None:
        if self.inner is not None:
            self.inner.item_finished(outcome, done, total)
        if self.progress is not None:
            self.progress.notify_sync(done, total)

    def run_finished(self, run: Any) -> None:
        if self.inner is not None:
            self.inner.run_finished(run)
