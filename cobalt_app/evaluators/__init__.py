"""Evaluator implementations, one function per `Evaluator.type`.

`evaluate()` is the one entry point: it never raises; a failure becomes an evaluation with
status `error` and a reason, never a silent score of 0. New types register with `@register`
(plugins too).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from cobalt.evaluator import EvalResult, Evaluator


class EvaluationError(Exception):
    """Raised by an implementation for a clear, expected failure (missing field, bad reply)."""

    def __init__(self, message: str, *, tokens: int = 0, cost: float = 0.0) -> None:
        super().__init__(message)
        self.tokens = tokens
        self.cost = cost


@dataclass
class EvalOutcome:
    evaluator: str
    score: float | None
    reason: str = ""
    status: str = "ok"
    error: str = ""
    cached: bool = False
    tokens: int = 0
    cost: float = 0.0

    @classmethod
    def failed(cls, evaluator: str, message: str, *, tokens: int = 0, cost: float = 0.0):
        return cls(evaluator, None, status="error", error=message, tokens=tokens, cost=cost)


@dataclass
class EvalTarget:
    """What is being scored: the item snapshot and what the agent produced."""

    item: dict[str, Any]
    output: Any
    metadata: dict[str, Any] = field(default_factory=dict)
    latency_ms: float | None = None
    cost: float = 0.0


Implementation = Callable[[Evaluator, EvalTarget, Any], Awaitable[EvalOutcome]]
REGISTRY: dict[str, Implementation] = {}


PROVIDER_TYPES: set[str] = set()


def register(
    type_name: str, *, calls_provider: bool = False
) -> Callable[[Implementation], Implementation]:
    """Register an implementation; `calls_provider` when it calls an LLM provider's SDK."""

    def decorator(fn: Implementation) -> Implementation:
        REGISTRY[type_name] = fn
        if calls_provider:
            PROVIDER_TYPES.add(type_name)
        return fn

    return decorator


def calls_provider(type_name: str) -> bool:
    _load_builtins()
    return type_name in PROVIDER_TYPES


def known_types() -> list[str]:
    _load_builtins()
    return sorted(REGISTRY)


async def evaluate(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    """Score one output with one evaluator. Never raises."""
    _load_builtins()
    implementation = REGISTRY.get(evaluator.type)
    if implementation is None:
        return EvalOutcome.failed(
            evaluator.name,
            f"unknown evaluator type {evaluator.type!r}; known types: {', '.join(known_types())}",
        )
    try:
        outcome = await implementation(evaluator, target, env)
    except EvaluationError as exc:
        return EvalOutcome.failed(evaluator.name, str(exc), tokens=exc.tokens, cost=exc.cost)
    except Exception as exc:
        return EvalOutcome.failed(evaluator.name, f"{type(exc).__name__}: {exc}")
    if outcome.status == "ok":
        problem = score_problem(outcome.score)
        if problem:
            return EvalOutcome.failed(
                evaluator.name, problem, tokens=outcome.tokens, cost=outcome.cost
            )
    return outcome


def score_problem(score: Any) -> str | None:
    if isinstance(score, bool) or not isinstance(score, int | float):
        return f"the score must be a number from 0 to 1 (got {score!r})"
    if math.isnan(score) or not 0.0 <= score <= 1.0:
        return f"the score must be between 0 and 1 (got {score!r})"
    return None


def normalise_result(value: Any) -> tuple[Any, str]:
    """A function evaluator's return: dict, EvalResult, number or bool → (score, reason)."""
    if isinstance(value, EvalResult):
        return value.score, value.reason or ""
    if isinstance(value, dict):
        if "score" not in value:
            raise EvaluationError(
                'the function returned a dict without "score"; return {"score": 0..1, '
                '"reason": "..."}, an EvalResult, a float or a bool'
            )
        score = value["score"]
        if isinstance(score, bool):
            score = float(score)
        return score, str(value.get("reason") or "")
    if isinstance(value, bool):
        return float(value), ""
    if isinstance(value, int | float):
        return float(value), ""
    raise EvaluationError(
        f"the function returned {type(value).__name__}; return a dict with a score, "
        "an EvalResult, a float or a bool"
    )


async def maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


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
