"""The sync function evaluators of async runners' items, scored on threads in batches.

An async runner's item is scored, as any item, once its agent has ended. Its sync function
evaluator went to an evaluator thread and back alone (`evaluators.call_user_function`): a
queue, a wake-up of the thread, a wake-up of the loop and a chain of six coroutines
(`evaluate`, `settle`, `within`, ...) suspended and resumed — at thousands of quick items a
second, about 14 µs of the loop's CPU per item, a fifth of what such an item cost (issue 41).
Here (`Batches.score`) the items whose verdicts the loop asks for in one of its passes go to
an evaluator thread together: it scores them one after another, each in its item's context,
as `thread_scoring.score_here` does (the same verdicts, errors and score checks,
instrumentation suppressed), and the loop is woken once for what landed meanwhile.

Each batch has one timer (`_Batch.check`) instead of a deadline per item:

- an evaluator past the item's timeout is timed out, as `settle` would, and left to its
  thread (an evaluator thread goes on with it too);
- an evaluator running longer than SLOW has the items of its batch it has not begun moved to
  a batch of their own on another thread: a slow evaluator holds nobody else up for long;
- while the last evaluator ran slower than SLOW, batches hold one item: an evaluator that
  waits on the network gets a thread per item, as before.

It applies (`applies`) where `thread_scoring` applies, but to an async runner's items (a
sync runner's are scored by its own thread: `thread_scoring`, `sync_items`).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from typing import Any

from cobalt.evaluator import Evaluator
from cobalt_app import thread_scoring
from cobalt_app.deadlines import EARLY
from cobalt_app.evaluators import EvalOutcome, EvalTarget, failure, settle, timed_out
from cobalt_app.evaluators.base import USER_THREADS

SLOW = 0.005  # seconds an evaluator may run before the rest of its batch is moved on
BATCH = 64  # items in a batch, at most


def applies(experiment: Any, env: Any) -> bool:
    """Whether this experiment's items are scored here: an async runner playing no
    conversation, one evaluator (a sync function: `thread_scoring.here`), no record/replay."""
    evaluators = experiment.evaluators
    return (
        experiment.is_async
        and experiment.conversation is None
        and getattr(env, "replay", None) is None
        and len(evaluators) == 1
        and thread_scoring.here(evaluators[0])
    )


class _Job:
    """One item's verdict asked for: its evaluator, what it reads, its context; `future`
    (on the loop) gets the verdict."""

    __slots__ = ("evaluator", "target", "context", "future", "due", "begun", "given_up")

    def __init__(
        self,
        evaluator: Evaluator,
        target: EvalTarget,
        future: asyncio.Future,
        due: float | None,
    ) -> None:
        self.evaluator = evaluator
        self.target = target
        self.context = contextvars.copy_context()
        self.future = future
        self.due = due  # the loop's time of its deadline (None: none)
        self.begun: float | None = None  # when its thread began it (monotonic)
        self.given_up = False  # its caller went (cancelled, timed out): it is not to begin


class Batches:
    """A run's verdicts asked for by its items (see the module), each within `timeout`."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.pending: list[_Job] = []  # asked for in this pass of the loop
        self.slow = False  # the evaluator last scored ran longer than SLOW

    async def score(self, evaluator: Evaluator, target: EvalTarget) -> EvalOutcome:
        """The item's verdict (its output is not None), scored on a thread with others."""
        loop = asyncio.get_running_loop()
        due = None if self.timeout is None else loop.time() + self.timeout
        job = _Job(evaluator, target, loop.create_future(), due)
        self.pending.append(job)
        if len(self.pending) == 1:
            loop.call_soon(self._flush)
        try:
            scored = await job.future
        except asyncio.CancelledError:
            job.given_up = True
            raise
        if isinstance(scored, EvalOutcome):
            return scored
        # A sync `fn` that returned an awaitable: awaited here, within its own deadline.
        return await settle(evaluator, thread_scoring.awaited(evaluator, scored), self.timeout)

    def _flush(self) -> None:
        jobs, self.pending = self.pending, []
        size = 1 if self.slow else BATCH
        for start in range(0, len(jobs), size):
            _Batch(self, jobs[start : start + size])


class _Batch:
    """Jobs scored one after another by one evaluator thread; the loop's timer watches it."""

    def __init__(self, owner: Batches, jobs: list[_Job]) -> None:
        self.owner = owner
        self.jobs = jobs  # the thread's: it takes them in order
        self.next = 0  # the first job the thread has not taken
        self.running: _Job | None = None
        self.lock = threading.Lock()
        landing = USER_THREADS.landing()
        self.loop = landing.loop
        USER_THREADS.start(self._work, landing)
        self.timer = self.loop.call_later(SLOW, self.check)

    # The thread's side.

    def _work(self, landing: Any) -> None:
        owner = self.owner
        while True:
            with self.lock:
                if self.next >= len(self.jobs):
                    self.running = None
                    return
                job = self.jobs[self.next]
                self.next += 1
                if job.given_up:
                    continue
                job.begun = time.monotonic()
                self.running = job
            try:
                verdict: Any = job.context.run(
                    thread_scoring.score_untraced, job.evaluator, job.target
                )
            except BaseException as exc:  # noqa: BLE001 - as `settle` records it
                verdict = failure(job.evaluator, exc)
            owner.slow = time.monotonic() - job.begun > SLOW
            landing.land(job.future, True, verdict)

    # The loop's side.

    def check(self) -> None:
        """The batch's timer: a slow evaluator's batch split, overdue verdicts timed out,
        and the next look set (none once every verdict is in)."""
        now = time.monotonic()
        with self.lock:
            running, rest = self.running, []
            if running is not None and now - running.begun >= SLOW and self.next < len(self.jobs):
                rest, self.jobs = self.jobs[self.next :], self.jobs[: self.next]
        if rest:
            self.owner.slow = True
            _Batch(self.owner, rest)
        later = self.loop.time()
        due = None
        for job in self.jobs:
            if job.future.done():
                continue
            if job.due is not None and job.due <= later + EARLY:
                job.given_up = True  # its thread, not there yet, skips it
                job.future.set_result(timed_out(job.evaluator, self.owner.timeout))
            elif job.due is not None:
                due = job.due if due is None else min(due, job.due)
        if self.next < len(self.jobs):  # some not begun: to be moved on if this one is slow
            due = later + SLOW if due is None else min(due, later + SLOW)
        self.timer = self.loop.call_at(due, self.check) if due is not None else None
