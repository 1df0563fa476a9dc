"""Evaluator implementations, one function per `Evaluator.type`.

`evaluate()` is the one entry point: it never raises; a failure becomes an evaluation with
status `error` and a reason, never a silent score of 0. New types register with `@register`
(plugins too), declaring the options they read and the provider APIs they call, so that
`cobalt_app.preflight` can refuse a misspelt option or a missing key before a run starts.

The types and helpers the implementations share live in `base` (re-exported here); each
type's module imports `base`, and this package loads them (`_load_builtins`): no circle.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable
from typing import Any

from cobalt.evaluator import Evaluator
from cobalt_app.deadlines import DeadlineExceeded, within
from cobalt_app.evaluators.base import (  # noqa: F401 - the package's API
    COMMON_OPTIONS,
    REGISTRY,
    EvalOutcome,
    EvalTarget,
    EvaluationError,
    EvaluatorType,
    Implementation,
    ProviderUse,
    ProviderUses,
    Validator,
    apply_context,
    call_user_function,
    context_variables,
    is_coroutine_function,
    maybe_await,
    normalise_result,
    register,
    score_problem,
    stopped_by_user_code,
)


def evaluator_type(type_name: str) -> EvaluatorType | None:
    _load_builtins()
    return REGISTRY.get(type_name)


def calls_provider(type_name: str) -> bool:
    registered = evaluator_type(type_name)
    return registered is not None and registered.calls_provider


def known_types() -> list[str]:
    _load_builtins()
    return sorted(REGISTRY)


async def evaluate(
    evaluator: Evaluator, target: EvalTarget, env: Any, *, timeout: float | None = None
) -> EvalOutcome:
    """Score one output with one evaluator, within the evaluator's own `timeout=` (seconds)
    or else `timeout`. Never raises (but for the cancellation of the caller)."""
    _load_builtins()
    registered = REGISTRY.get(evaluator.type)
    if registered is None:
        return EvalOutcome.failed(
            evaluator.name,
            f"unknown evaluator type {evaluator.type!r}; known types: {', '.join(known_types())}",
        )
    own = evaluator.options.get("timeout")
    if own is not None:
        if isinstance(own, bool) or not isinstance(own, int | float) or not 0 < own < math.inf:
            return EvalOutcome.failed(
                evaluator.name, f"`timeout=` must be a number of seconds above 0 (got {own!r})"
            )
        timeout = float(own)
    return await settle(evaluator, registered.implementation(evaluator, target, env), timeout)


async def settle(
    evaluator: Evaluator, scoring: Awaitable[EvalOutcome], timeout: float | None
) -> EvalOutcome:
    """An evaluator's `scoring` awaited within `timeout`, and what it gave made a verdict:
    every failure an evaluation error (`failure`), a score checked (`checked`)."""
    try:
        outcome = await within(scoring, timeout)
    except DeadlineExceeded:
        return timed_out(evaluator, timeout)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt of user code too
        return failure(evaluator, exc)
    return checked(evaluator, outcome)


def timed_out(evaluator: Evaluator, timeout: float | None) -> EvalOutcome:
    return EvalOutcome.failed(
        evaluator.name,
        f"timed out after {timeout:g}s (the evaluator was stopped; give it more time "
        f"with `timeout=` on the Evaluator)",
    )


def failure(evaluator: Evaluator, exc: BaseException) -> EvalOutcome:
    """What an evaluator's exception is recorded as."""
    if isinstance(exc, EvaluationError):
        return EvalOutcome.failed(
            evaluator.name,
            str(exc),
            tokens=exc.tokens,
            cost=exc.cost,
            unpriced_model=exc.unpriced_model,
        )
    if isinstance(exc, Exception):
        return EvalOutcome.failed(evaluator.name, f"{type(exc).__name__}: {exc}")
    # SystemExit, KeyboardInterrupt raised by user code
    return EvalOutcome.failed(evaluator.name, stopped_by_user_code(exc, "the evaluator"))


def checked(evaluator: Evaluator, outcome: EvalOutcome) -> EvalOutcome:
    """An outcome whose score is no number from 0 to 1 is an evaluation error."""
    if outcome.status == "ok":
        problem = score_problem(outcome.score)
        if problem:
            return EvalOutcome.failed(
                evaluator.name,
                problem,
                tokens=outcome.tokens,
                cost=outcome.cost,
                unpriced_model=outcome.unpriced_model,
            )
    return outcome


_builtins_loaded = False


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    import importlib
    import pkgutil

    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
