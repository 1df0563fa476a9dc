"""Items whose step is all sync, run one after another by a runner thread (issue 41).

Through the loop an item costs a coroutine, a hand-over to a runner thread and back, a
deadline and its scopes: about 80 µs of the loop's CPU, which is most of what a quick item
costs and what keeps one process under 10,000 items/s. When every part of an item's step
is sync (`applies`: a sync runner playing no conversation, evaluators that are built-in
checks calling nothing and at most one sync function, no recording or replay), a lane hands
a runner thread its claimed items at once (`SyncItems.start`): the thread runs each in a
copy of the lane's context as `engine.execute_item` would — its trace captured, its stubs,
state and budget (`intercepts.item_scope`), the runner, the evaluators, the outcome made
storable — and lands the outcomes for the lane to record and report, a wake-up of the loop
for tens of them (`LAND`, `LINGER`).

The loop keeps the deadlines: one timer per batch, set for the running phase's (the runner
call, or one evaluator) end. A runner past its timeout is stopped as `runaway.sync_call`
stops it (its calls refused, its thread interrupted) and its item is a timeout with the same
error; the thread goes on with the next item. A thread that does not stop within the grace
period is left, its item's error saying so, and the lane takes back the items it had not
begun (`Batch.left`). An evaluator past the timeout is timed out and left to its thread, as
on an evaluator thread; the item's other evaluators are scored as usual, and the rest of
the batch taken back. A cancelled lane stops the running agent (`Batch.cancel`); a cancelled
run lets the running item end and begins no other (`Batch.stop`); a team worker dropping
one item (its lease lost, or handed back) skips it, or stops its agent (`Batch.drop`).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import dataclasses
import inspect
import threading
import time
from collections.abc import Coroutine
from typing import Any

from django.utils import timezone

from cobalt.evaluator import Evaluator
from cobalt.experiments import Experiment, RunContext
from cobalt.run_settings import BudgetSettings
from cobalt_app import engine, intercepts, runaway, storable, thread_scoring, traces
from cobalt_app.aio import Threads, stoppable
from cobalt_app.deadlines import EARLY
from cobalt_app.engine import EvalEnv, ItemOutcome
from cobalt_app.evaluators import (
    REGISTRY,
    EvalOutcome,
    EvalTarget,
    checked,
    evaluator_type,
    failure,
    is_coroutine_function,
    settle,
    timed_out,
)
from cobalt_app.evaluators.basic import function_evaluator
from cobalt_app.models import ItemResult

# A thread wakes the loop for what landed once LAND outcomes wait, or LINGER seconds after
# its last wake-up; the loop looks every LINGER × 10 seconds (an item that takes long).
LAND = 64
LINGER = 0.005


def applies(experiment: Experiment, env: EvalEnv) -> bool:
    """Whether every part of this experiment's items is sync (see the module)."""
    if experiment.is_async or experiment.conversation is not None or env.replay is not None:
        return False
    # Several functions run beside each other, each on a thread (they may wait for each
    # other); the built-in checks return at once, in any order.
    functions = sum(evaluator.type == "function" for evaluator in experiment.evaluators)
    return functions <= 1 and all(_sync(evaluator) for evaluator in experiment.evaluators)


def _sync(evaluator: Evaluator) -> bool:
    options = evaluator.options
    registered = evaluator_type(evaluator.type)
    if registered is None or options.get("per_turn") or options.get("timeout") is not None:
        return False
    if evaluator.type == "function":
        return (
            registered.implementation is function_evaluator
            and callable(evaluator.fn)
            and options.get("context") is None
            and not is_coroutine_function(evaluator.fn)
        )
    return registered.calls_nothing


class Phase:
    """What a batch's thread is doing now: an item's runner call or one of its evaluators,
    since `started` (monotonic); `ended` by the thread or `taken` over by the loop, never both
    (under the batch's lock)."""

    __slots__ = (
        "claim",
        "outcome",
        "call",
        "started",
        "evaluator",
        "scored",
        "collector",
        "guard",
        "timed_out",
        "ended",
        "taken",
    )

    def __init__(self, claim: Any, outcome: ItemOutcome, evaluator: int | None = None) -> None:
        self.claim = claim
        self.outcome = outcome
        self.call = runaway.RunningCall()
        self.started = time.monotonic()
        self.evaluator = evaluator  # the evaluator's position; None: the runner
        self.scored: list[EvalOutcome] = []  # the item's evaluators scored before it
        self.collector: Any = None
        self.guard: runaway.ItemGuard | None = None
        self.timed_out = False
        self.ended = False
        self.taken = False


@dataclasses.dataclass
class SyncItems:
    """A run's all-sync step (`applies`): its batches run on `threads`."""

    experiment: Experiment
    env: EvalEnv
    threads: Threads
    timeout: float
    grace: float
    budget: BudgetSettings | None = None

    def start(self, claims: list[Any]) -> Batch:
        """The claimed items, begun on a runner thread."""
        return Batch(self, claims)


class Batch:
    """A lane's claimed items on one runner thread (see the module)."""

    def __init__(self, items: SyncItems, claims: list[Any]) -> None:
        self.items = items
        self.claims = claims
        self.loop = asyncio.get_running_loop()
        self.lock = threading.Lock()
        self.begun = 0  # items the thread has begun
        self.closed = False  # no item begins any more
        self.left: list[Any] = []  # the items taken back: the thread was left
        self.skipped: set[int] = set()  # positions of the items dropped before they began
        self.phase: Phase | None = None
        self.landed: collections.deque[tuple[Any, ItemOutcome]] = collections.deque()
        self.woken = False
        self.told = 0.0  # when the thread last woke the loop (monotonic)
        self.waiter: asyncio.Future | None = None
        self.taking = False  # the loop took an item over: it lands it, the thread no more
        self.over = False  # ... and it has landed
        self.expiring: asyncio.Task | None = None
        self.waiting: Any = None  # a coroutine of the thread's, on the loop
        self.job = items.threads.start_with_slot(self._work)
        self.job.add_done_callback(self._wake)
        self.timer: asyncio.TimerHandle | None = self.loop.call_at(
            self.loop.time() + items.timeout, self._check
        )
        self.looking = self.loop.call_later(LINGER * 10, self._look)

    # The loop's side.

    async def outcomes(self) -> list[tuple[Any, ItemOutcome]] | None:
        """The (claim, outcome) pairs landed since the last call; None once the batch ended."""
        while not self.landed:
            if self.over or (self.job.done() and not self.taking):
                self._end(cancelled=False)
                if self.landed:
                    break
                if self.job.done():
                    self.job.result()  # a failure of the engine's own, not of an item
                return None
            self.waiter = self.loop.create_future()
            await self.waiter
        return self._taken()

    def _taken(self) -> list[tuple[Any, ItemOutcome]]:
        """What landed, taken one by one (the thread may be adding more meanwhile)."""
        landed = self.landed
        return [landed.popleft() for _ in range(len(landed))]

    def stop(self) -> None:
        """No item begins any more; the running one ends as it would."""
        with self.lock:
            self.closed = True

    def cancel(self) -> list[tuple[Any, ItemOutcome]]:
        """The lane is cancelled: no item begins any more, the running agent is stopped;
        returns the outcomes that landed and were not taken yet."""
        self.stop()
        self._end(cancelled=True)
        if self.waiting is not None:
            self.waiting.cancel()
        phase = self.phase
        if phase is not None and phase.evaluator is None and phase.guard is not None:
            phase.guard.stopped = "the item was cancelled"
            self.items.threads.interrupt(phase.call)
        return self._taken()

    def drop(self, claim: Any, *, started: bool | None = None) -> bool:
        """One item is dropped (team: its lease went to another worker, or the worker hands it
        back): the thread does not begin it, or its running agent is stopped; `started` given:
        only if it has (not) begun. Whether it was dropped (what lands of it is the lane's to
        let go)."""
        with self.lock:
            position = next(i for i, held in enumerate(self.claims) if held is claim)
            begun = position < self.begun
            if started is not None and begun != started:
                return False
            if not begun:
                self.skipped.add(position)
                return True
            phase = self.phase
        if phase is not None and phase.claim is claim and phase.evaluator is None:
            if phase.guard is not None:
                phase.guard.stopped = "the item was cancelled"
            self.items.threads.interrupt(phase.call)
        return True

    def _end(self, *, cancelled: bool) -> None:
        self.looking.cancel()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        expiring = self.expiring
        if expiring is not None and not expiring.done() and (cancelled or not self.taking):
            expiring.cancel()  # stopping a runner that ended since: nothing left to stop

    def _look(self) -> None:
        """What landed while the thread went on with a long item, taken."""
        self.looking = self.loop.call_later(LINGER * 10, self._look)
        if self.landed:
            self._wake()

    def _wake(self, _: Any = None) -> None:
        self.woken = False  # before taking: an outcome landing from now on wakes the loop again
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _check(self) -> None:
        """The timer: the running phase past its time is timed out; else the next check."""
        self.timer = None
        phase, now, timeout = self.phase, self.loop.time(), self.items.timeout
        if phase is None or phase.ended or now + EARLY < phase.started + timeout:
            due = now + timeout if phase is None or phase.ended else phase.started + timeout
            self.timer = self.loop.call_at(due, self._check)
            return
        self.expiring = asyncio.ensure_future(self._expire(phase))

    async def _expire(self, phase: Phase) -> None:
        if phase.evaluator is None:
            await self._runner_expired(phase)
        else:
            await self._evaluator_expired(phase)
        if not self.over and not self.job.done():
            self.timer = self.loop.call_soon(self._check)

    async def _runner_expired(self, phase: Phase) -> None:
        """Stop the runner as `runaway.sync_call` would: the thread records its timeout;
        if it does not stop, its item is a timeout here and the rest taken back."""
        timeout, grace = self.items.timeout, self.items.grace
        with self.lock:
            if phase.ended:
                return
            phase.timed_out = True
        if phase.guard is not None:
            phase.guard.stopped = f"the item timed out after {timeout:g}s"
        if await runaway.thread_stopped(self.items.threads, phase.call, grace):
            return
        if not self._take_over(phase):
            return  # it ended meanwhile: its thread records the timeout
        outcome = _copied(phase.outcome)
        what = f"its thread {phase.call.thread_name}"
        engine.runner_failed(outcome, runaway.NotStopped(what), timeout, grace)
        outcome.latency_ms = (time.monotonic() - phase.started) * 1000
        outcome.finished_at = timezone.now()
        captured = traces.captured(phase.collector, self.items.env.trace)
        engine.agent_done(self.items.experiment, outcome, captured)
        self._deliver(phase.claim, outcome)

    async def _evaluator_expired(self, phase: Phase) -> None:
        """A verdict past the timeout: timed out, left to its thread (as an evaluator thread
        would be); the item's later evaluators scored as usual."""
        if not self._take_over(phase):
            return
        self.items.threads.abandon(phase.call)
        items = self.items
        evaluators = items.experiment.evaluators
        outcome = _copied(phase.outcome)
        verdicts = [*phase.scored, timed_out(evaluators[phase.evaluator], items.timeout)]
        rest = evaluators[phase.evaluator + 1 :]
        if rest:
            scoped = dataclasses.replace(items.experiment, evaluators=rest)
            with traces.untraced():
                verdicts += await engine.evaluate_item(
                    scoped, phase.claim.snapshot, outcome, items.env, timeout=items.timeout
                )
        for verdict in verdicts:
            storable.clean_evaluation(verdict)
        outcome.evaluations = verdicts
        self._deliver(phase.claim, outcome)

    def _take_over(self, phase: Phase) -> bool:
        """The loop ends the phase's item (False: its thread ended the phase first); the
        items not begun are taken back."""
        with self.lock:
            if phase.ended:
                return False
            phase.taken = True
            self.taking = self.closed = True
            self.left = self.claims[self.begun :]
        return True

    def _deliver(self, claim: Any, outcome: ItemOutcome) -> None:
        self.landed.append((claim, outcome))
        self.over = True
        self._wake()

    # The thread's side.

    def _work(self, slot: Any) -> None:
        """On a runner thread: the items one after another, each in a copy of the context."""
        base = contextvars.copy_context()
        while True:
            with self.lock:
                while self.begun in self.skipped:
                    self.begun += 1
                if self.closed or self.begun >= len(self.claims):
                    return
                claim = self.claims[self.begun]
                self.begun += 1
            outcome = base.copy().run(self._item, slot, claim)
            if outcome is None:
                return  # the loop took its item over
            self.landed.append((claim, outcome))
            now = time.monotonic()
            if not self.woken and (len(self.landed) >= LAND or now - self.told >= LINGER):
                self.woken = True
                self.told = now
                self.loop.call_soon_threadsafe(self._wake)

    def _end_phase(self, phase: Phase) -> bool:
        with self.lock:
            if phase.taken:
                return False
            phase.ended = True
            return True

    def _item(self, slot: Any, claim: Any) -> ItemOutcome | None:
        """`engine.execute_item` of one item, here (None: the loop took it over)."""
        items, snapshot = self.items, claim.snapshot
        outcome = ItemOutcome.of(snapshot, started_at=timezone.now())
        started = time.perf_counter()
        with (
            traces.capture_item(items.env.trace) as collector,
            intercepts.item_scope(
                items.env, items.experiment, snapshot.item, outcome, items.budget
            ),
        ):
            if outcome.status == ItemResult.Status.OK:
                phase = Phase(claim, outcome)
                phase.collector = collector
                if not self._runner(slot, phase):
                    return None
        outcome.latency_ms = (time.perf_counter() - started) * 1000
        outcome.finished_at = timezone.now()
        engine.agent_done(items.experiment, outcome, traces.captured(collector, items.env.trace))
        if outcome.status == ItemResult.Status.OK and items.experiment.evaluators:
            with traces.untraced():
                verdicts = self._evaluations(slot, claim, outcome)
            if verdicts is None:
                return None
            for verdict in verdicts:
                storable.clean_evaluation(verdict)
            outcome.evaluations = verdicts
        return outcome

    def _runner(self, slot: Any, phase: Phase) -> bool:
        """The runner's call (False: the loop took the item over); its value or how it
        failed on the outcome."""
        items, outcome = self.items, phase.outcome
        snapshot = phase.claim.snapshot
        context = RunContext(
            item=snapshot.item,
            index=snapshot.item_index,
            run_index=snapshot.run_index,
            item_key=snapshot.item_key,
            dataset=items.experiment.dataset,
        )
        with runaway.item_guard() as guard:
            phase.guard = guard
            self.phase = phase
            ok, value = stoppable(slot, phase.call, items.experiment.runner, context)
        if slot.abandoned or not self._end_phase(phase):
            return False
        if phase.timed_out:
            outcome.status = ItemResult.Status.TIMEOUT
            outcome.error = engine.timed_out(items.timeout)
            return True
        if ok and inspect.isawaitable(value):  # awaited on the loop, as `call_runner` does
            awaited = runaway.async_call(value, timeout=items.timeout, grace=items.grace)
            ok, value = self._on_loop(awaited)
        if ok:
            outcome.output, outcome.metadata = engine.split_result(value)
        else:
            engine.runner_failed(outcome, value, items.timeout, items.grace)
        return True

    def _evaluations(self, slot: Any, claim: Any, outcome: ItemOutcome) -> list[EvalOutcome] | None:
        """`engine.evaluate_item`, one evaluator after another (None: the loop took over)."""
        evaluators = self.items.experiment.evaluators
        if outcome.output is None:
            return [EvalOutcome.failed(e.name, engine.NOTHING_RETURNED) for e in evaluators]
        target = engine.eval_target(claim.snapshot.item, outcome)
        scored: list[EvalOutcome] = []
        for position, evaluator in enumerate(evaluators):
            phase = Phase(claim, outcome, position)
            phase.scored = list(scored)
            self.phase = phase
            ok, verdict = stoppable(slot, phase.call, self._verdict, evaluator, target)
            if slot.abandoned or not self._end_phase(phase):
                return None
            scored.append(verdict if ok else failure(evaluator, verdict))
        return scored

    def _verdict(self, evaluator: Evaluator, target: EvalTarget) -> EvalOutcome:
        """`evaluators.evaluate` of a sync evaluator (see `_sync`), on this thread."""
        if evaluator.type == "function":
            verdict = thread_scoring.score_here(evaluator, target)
            if isinstance(verdict, EvalOutcome):
                return verdict
            # A sync `fn` that returned an awaitable: awaited on the loop, without the
            # batch's deadline (`settle` sets its own).
            self.phase = None
            scoring = settle(
                evaluator, thread_scoring.awaited(evaluator, verdict), self.items.timeout
            )
            ok, value = self._on_loop(scoring)
            return value if ok else failure(evaluator, value)
        scoring = REGISTRY[evaluator.type].implementation(evaluator, target, self.items.env)
        try:
            scoring.send(None)
        except StopIteration as returned:
            return checked(evaluator, returned.value)
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt of user code too
            return failure(evaluator, exc)
        scoring.close()
        raise RuntimeError(f"the built-in {evaluator.type!r} evaluator waited for something")

    def _on_loop(self, coro: Coroutine[Any, Any, Any]) -> tuple[bool, Any]:
        """A coroutine run on the loop, this thread waiting for it: (ok, value or exception)."""
        self.phase = None
        future = self.waiting = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return True, future.result()
        except BaseException as exc:  # noqa: BLE001 - the item's, whatever it is
            return False, exc
        finally:
            self.waiting = None


def _copied(outcome: ItemOutcome) -> ItemOutcome:
    """An outcome the loop completes while its thread may still change the original."""
    metadata = outcome.metadata
    return dataclasses.replace(
        outcome, metadata=dict(metadata) if isinstance(metadata, dict) else metadata
    )
