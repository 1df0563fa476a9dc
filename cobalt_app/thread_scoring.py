"""An item's sync function evaluator, scored by the thread that ran its sync runner.

A sync runner runs on a runner thread (`aio.Threads`), and a sync function evaluator on an
evaluator thread: two hand-overs to a thread and back per item, each a queue, a wake-up of
the thread, a future and a wake-up of the loop — at thousands of quick items a second, a
large part of a run's CPU (issue 41). Here the runner's thread scores the item right after
its runner returned (`aio.Then`): one hand-over per item. It applies (`applies`) when nothing
happens between the agent and its scoring that an evaluator could see:

- the runner is sync and plays no conversation; the run neither records nor replays;
- it has one evaluator (several run beside each other, each on a thread of its own), of
  the built-in `function` type, with a sync `fn`, no `context=`, no `per_turn`, no
  `timeout=` of its own;
- the item has no stub, state or budget (`intercepts.item_scope` has nothing to do: the
  engine then passes no `Scoring` to the runner's call).

The evaluator sees what it sees otherwise (the item, the output, the metadata and the item's
latency, measured when the runner returned), in the item's context as it was before its
agent ran, with instrumentation suppressed (`traces.untraced`), within the item's timeout
from the runner's return: still running when it passes, it is timed out (its thread goes on
with it, as an evaluator thread would). The engine then decides, as for any item, whether
the outcome can be stored (`storable.prepare` drops the evaluations of one that cannot):
the one difference is that the evaluator was called for an output that then could not be.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cobalt.evaluator import Evaluator
from cobalt_app import traces
from cobalt_app.aio import Then
from cobalt_app.deadlines import DeadlineExceeded, within
from cobalt_app.evaluators import (
    REGISTRY,
    EvalOutcome,
    EvalTarget,
    EvaluationError,
    checked,
    evaluator_type,
    failure,
    is_coroutine_function,
    settle,
    timed_out,
)
from cobalt_app.evaluators.basic import (
    function_context,
    function_evaluator,
    function_raised,
    function_verdict,
)

Rest = Callable[[list[Evaluator]], Awaitable[list[EvalOutcome]]]  # evaluators scored as usual


def applies(experiment: Any, env: Any) -> bool:
    """Whether this experiment's items can be scored by their runner's thread (the module's
    conditions, but for the item's own stubs, state and budget); asked once per experiment
    and evaluator list."""
    evaluators = experiment.evaluators
    known = _plans.get(id(experiment))
    if known is not None and known[0] is experiment and known[1] is evaluators:
        answer = known[2]
    else:
        answer = len(evaluators) == 1 and here(evaluators[0])
        answer = answer and experiment.conversation is None and not experiment.is_async
        if len(_plans) > 256:
            _plans.clear()
        _plans[id(experiment)] = (experiment, evaluators, answer)  # kept: the id stays its own
    return answer and getattr(env, "replay", None) is None


_plans: dict[int, tuple[Any, Any, bool]] = {}


def here(evaluator: Evaluator) -> bool:
    """Whether the evaluator is a sync function `score_here` scores (the module's terms)."""
    registered = evaluator_type(evaluator.type)
    options = evaluator.options
    return (
        evaluator.type == "function"
        and registered is REGISTRY.get("function")
        and registered is not None
        and registered.implementation is function_evaluator
        and callable(evaluator.fn)
        and options.get("context") is None
        and not options.get("per_turn")
        and options.get("timeout") is None
        and not is_coroutine_function(evaluator.fn)
    )


class Scoring:
    """An item's evaluator scored by its runner's thread: `then` goes with the runner's
    call; `outcomes` (on the loop) waits for the verdict."""

    def __init__(
        self,
        evaluators: list[Evaluator],
        item: dict[str, Any],
        started: float,
        split: Callable[[Any], tuple[Any, dict[str, Any]]],
    ) -> None:
        (self.evaluator,) = evaluators
        self.item = item
        self.started = started  # `time.perf_counter()` when the item started
        self.split = split  # the runner's value → (output, metadata)
        self.context = contextvars.copy_context()  # the item's, before its agent's scopes
        self.then = Then(asyncio.get_running_loop().create_future(), self._follow)
        self.latency_ms: float | None = None  # when the runner returned
        self.lock = threading.Lock()
        self.begun = False
        self.given_up = False

    def _follow(self, value: Any) -> EvalOutcome | Awaitable[Any] | None:
        """On the runner's thread: score the runner's value; None when it is not scored
        here (no output, or an awaitable the loop awaits first)."""
        if inspect.isawaitable(value):
            return None  # awaited on the loop: the item's latency is measured there
        self.latency_ms = (time.perf_counter() - self.started) * 1000
        output, metadata = self.split(value)
        if output is None:
            return None
        with self.lock:
            if self.given_up:
                return None
            self.begun = True
        target = EvalTarget(
            item=self.item, output=output, metadata=metadata, latency_ms=self.latency_ms
        )
        return self.context.run(score_untraced, self.evaluator, target)

    def abandon(self) -> None:
        """The evaluator is not to begin (the item ended otherwise, or time is up)."""
        with self.lock:
            self.given_up = True

    async def outcomes(self, timeout: float | None, rest: Rest) -> list[EvalOutcome] | None:
        """The evaluator's outcome within `timeout` from now; None when the runner's value
        was not scored here (the caller scores it as usual)."""
        try:
            scored = await within(self.then.future, timeout)
        except DeadlineExceeded:
            self.abandon()
            if self.begun:
                return [timed_out(self.evaluator, timeout)]
            return await rest([self.evaluator])  # it never began: scored as usual
        except asyncio.CancelledError:
            self.abandon()
            raise
        if scored is None:
            return None
        if isinstance(scored, EvalOutcome):
            return [scored]
        # A sync `fn` that returned an awaitable: awaited here.
        return [await settle(self.evaluator, awaited(self.evaluator, scored), timeout)]


def score_untraced(evaluator: Evaluator, target: EvalTarget) -> EvalOutcome | Awaitable[Any]:
    with traces.untraced():
        return score_here(evaluator, target)


def score_here(evaluator: Evaluator, target: EvalTarget) -> EvalOutcome | Awaitable[Any]:
    """`evaluate()` of a sync function evaluator, on this thread (the same rules: `failure`,
    `checked`); an awaitable its `fn` returned is left for the loop."""
    try:
        try:
            value = evaluator.fn(function_context(target, {}))
        except EvaluationError:
            raise
        except Exception as exc:
            raise function_raised(exc) from exc
        if inspect.isawaitable(value):
            return value
        outcome = function_verdict(evaluator, value)
    except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt of user code too
        return failure(evaluator, exc)
    return checked(evaluator, outcome)


async def awaited(evaluator: Evaluator, awaitable: Awaitable[Any]) -> EvalOutcome:
    try:
        value = await awaitable
    except EvaluationError:
        raise
    except Exception as exc:
        raise function_raised(exc) from exc
    return function_verdict(evaluator, value)
