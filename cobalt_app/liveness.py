"""Runs whose process vanished are `interrupted`, not `running` forever.

While an embedded run executes, its process touches `Run.heartbeat_at` every few seconds
(`runs.embedded.keep_alive`, on the database thread). A run still `running` whose heartbeat is older
than the grace period (`COBALT_RUN_GRACE` seconds, default 60) lost its process: SIGKILL, a
crash, a closed laptop. The doors that show runs (`cobalt history`, the pages, the API, MCP)
pass them through `settle()`, which stores such a run as `interrupted` the first time it is
read; they all show the same status. `cobalt run --resume RUN` executes its missing items.

Team runs are left alone: their workers hold leases and the sweeper recovers their items.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import datetime

from django.utils import timezone

from cobalt_app import services
from cobalt_app.models import Run

DEFAULT_GRACE = 60.0


def grace() -> float:
    """Seconds without a heartbeat after which a running embedded run counts as interrupted."""
    try:
        return max(0.5, float(os.environ.get("COBALT_RUN_GRACE") or DEFAULT_GRACE))
    except ValueError:
        return DEFAULT_GRACE


def beat_interval() -> float:
    """How often the executing process touches its run (and notices it was cancelled
    elsewhere): every 2 s, or a few beats per grace period when it is shorter."""
    return min(2.0, grace() / 4)


def is_interrupted(run: Run, now: datetime) -> bool:
    """The rule: an embedded run still `running` whose process gave no sign of life lately."""
    if run.status != Run.Status.RUNNING or run.mode != Run.Mode.EMBEDDED:
        return False
    last = run.heartbeat_at or run.started_at or run.created_at
    return (now - last).total_seconds() > grace()


def settle(runs: Iterable[Run]) -> list[Run]:
    """The runs, with those whose process vanished stored and shown as `interrupted`.

    No query unless one is found (rare): then one conditional UPDATE for it.
    """
    runs = list(runs)
    now = timezone.now()
    for run in runs:
        if is_interrupted(run, now) and services.run_interrupt(run.id, run.heartbeat_at):
            run.status = Run.Status.INTERRUPTED
    return runs


def settled(run: Run) -> Run:
    """One run, as `settle()` shows it."""
    return settle([run])[0]


def sweep() -> None:
    """Settle every running embedded run (before acting on finished runs, e.g. `clean`)."""
    settle(Run.objects.filter(status=Run.Status.RUNNING, mode=Run.Mode.EMBEDDED))
