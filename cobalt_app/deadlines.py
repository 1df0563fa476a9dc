"""Deadlines of the engine's awaits: an item's timeout, each evaluator's.

`asyncio.timeout` arms a timer of its own for every await (a handle, a heap entry, its
cancellation): about 5 µs, twice an item, a fifth of the engine's own work on quick items.
Here the deadlines of a loop share one timer, set for the earliest of them: arming one that
is due later than that timer (every item's, when they share a timeout) costs a set insert.
An expired deadline cancels its task, as `asyncio.timeout` does, and the await raises
`DeadlineExceeded` — never for a `TimeoutError` the awaited code raised itself.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")
EARLY = 0.001  # seconds: the loop may ring a timer this much before its time


class DeadlineExceeded(Exception):
    """Cobalt's deadline passed (a `TimeoutError` of the awaited code is its own error)."""


async def within(awaitable: Awaitable[T], timeout: float | None) -> T:
    """Await within `timeout` seconds (None: no deadline)."""
    if timeout is None:
        return await awaitable
    loop = asyncio.get_running_loop()
    clock = _last[0]
    if clock is None or clock.loop is not loop:  # another loop than the last one's
        clock = _clocks.get(loop)
        if clock is None:
            clock = _clocks[loop] = _Clock(loop)
        _last[0] = clock
    task = asyncio.current_task()
    deadline = _Deadline(task, loop.time() + timeout)
    clock.arm(deadline)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if deadline.expired and task.uncancel() <= deadline.cancelling:
            raise DeadlineExceeded from None
        raise
    finally:
        clock.armed.discard(deadline)


class _Deadline:
    __slots__ = ("task", "when", "cancelling", "expired")

    def __init__(self, task: asyncio.Task, when: float) -> None:
        self.task = task
        self.when = when
        self.cancelling = task.cancelling()  # cancellations asked before this deadline's
        self.expired = False


class _Clock:
    """The deadlines armed on one loop, and the one timer that rings for the earliest."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.armed: set[_Deadline] = set()
        self.timer: asyncio.TimerHandle | None = None

    def arm(self, deadline: _Deadline) -> None:
        self.armed.add(deadline)
        if self.timer is None or deadline.when < self.timer.when():
            if self.timer is not None:
                self.timer.cancel()
            self.timer = self.loop.call_at(deadline.when, self._ring)

    def _ring(self) -> None:
        self.timer = None
        now = self.loop.time() + EARLY
        due = [deadline for deadline in self.armed if deadline.when <= now]
        for deadline in due:
            self.armed.discard(deadline)
            deadline.expired = True
            deadline.task.cancel()
        if self.armed:
            self.timer = self.loop.call_at(min(d.when for d in self.armed), self._ring)


_clocks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Clock] = weakref.WeakKeyDictionary()
# The clock used last: a process's deadlines are nearly all on its one long-lived loop, and
# a weak dictionary's look-up costs more than the rest of arming a deadline.
_last: list[_Clock | None] = [None]
