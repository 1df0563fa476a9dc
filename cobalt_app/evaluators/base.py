"""What every evaluator type is built from: the outcome and target types, `register`, and the
helpers implementations share. The package (`cobalt_app.evaluators`) re-exports them and loads
the built-in types; a type's module imports this one, never the package.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cobalt.evaluator import CONTEXT_KEYS, EvalContext, EvalResult, Evaluator
from cobalt_app.aio import Threads

logger = logging.getLogger("cobalt.evaluators")


class EvaluationError(Exception):
    """Raised by an implementation for a clear, expected failure (missing field, bad reply)."""

    def __init__(
        self, message: str, *, tokens: int = 0, cost: float = 0.0, unpriced_model: str = ""
    ) -> None:
        super().__init__(message)
        self.tokens = tokens
        self.cost = cost
        self.unpriced_model = unpriced_model


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
    chain_of_thought: str = ""  # a judge's reasoning, with `chain_of_thought=True`
    unpriced_model: str = ""  # spent tokens of a model that has no price
    judge_call: dict[str, Any] | None = None  # an LLM judge's prompt and reply (`JudgeCall`)

    @classmethod
    def failed(
        cls,
        evaluator: str,
        message: str,
        *,
        tokens: int = 0,
        cost: float = 0.0,
        unpriced_model: str = "",
    ):
        return cls(
            evaluator,
            None,
            status="error",
            error=message,
            tokens=tokens,
            cost=cost,
            unpriced_model=unpriced_model,
        )


@dataclass
class EvalTarget:
    """What is being scored: the item snapshot and what the agent produced."""

    item: dict[str, Any]
    output: Any
    metadata: dict[str, Any] = field(default_factory=dict)
    latency_ms: float | None = None
    cost: float = 0.0
    trace: list[dict[str, Any]] = field(default_factory=list)  # steps (see `trace_spans`)
    trace_missing: str = ""  # why the trace was not captured ("" when it was; see `traces`)

    def read_trace(self) -> list[dict[str, Any]]:
        """The trace's steps, for an evaluator that reads them: an evaluation error when it was
        not captured (an agent Cobalt could not see must never pass a check of its steps)."""
        if self.trace_missing:
            raise EvaluationError(f"the trace was not captured: {self.trace_missing}")
        return self.trace


Implementation = Callable[[Evaluator, EvalTarget, Any], Awaitable[EvalOutcome]]


@dataclass(frozen=True)
class ProviderUse:
    """A provider API an evaluator will call: what `providers.resolve_api_key` needs."""

    provider: str
    base_url: str | None = None
    api_key_env: str | None = None
    purpose: str = "the llm-judge"


# (evaluator, the [judge] configuration) → the provider APIs that evaluator will call.
ProviderUses = Callable[[Evaluator, dict[str, Any]], list[ProviderUse]]
# An evaluator → the problems of its definition (an empty list when it can run).
Validator = Callable[[Evaluator], list[str]]


@dataclass(frozen=True)
class EvaluatorType:
    """A registered type: its implementation, the options it reads, the providers it calls."""

    name: str
    implementation: Implementation
    options: frozenset[str] = frozenset()
    # False: registered without `options=` (a plugin written for the original): every
    # option the user gives reaches it, none is refused.
    options_declared: bool = True
    calls_provider: bool = False
    # A built-in check that reads the output and calls nothing: its coroutine never waits, so
    # `sync_items` may run it on a runner thread.
    calls_nothing: bool = False
    provider_uses: ProviderUses | None = None
    validate: Validator | None = None

    @property
    def accepted(self) -> list[str]:
        """Every keyword `Evaluator(...)` accepts for this type, in a stable order."""
        return [*COMMON_OPTIONS, *sorted(self.options - set(COMMON_OPTIONS))]


COMMON_OPTIONS = ("name", "type", "timeout", "pass_threshold", "per_turn")
REGISTRY: dict[str, EvaluatorType] = {}


def register(
    type_name: str,
    *,
    options: Iterable[str] | None = None,
    calls_provider: bool = False,
    calls_nothing: bool = False,
    providers: ProviderUses | None = None,
    validate: Validator | None = None,
) -> Callable[[Implementation], Implementation]:
    """Register the implementation of an evaluator type.

    `options`: the keywords of `Evaluator(...)` this type reads besides `name` and `type`
    (`prompt`, `field`, `threshold` ... included); an evaluator given any other is refused
    before its run starts. Without `options` (the original's plugins declare none), the
    type takes whatever options it is given, unchecked; `options=()` declares it reads none.
    `calls_provider`: it calls an LLM provider's SDK; `calls_nothing`: it reads the output and
    awaits nothing (a built-in check).
    `providers(evaluator, judge_config)`: the provider APIs an evaluator of this type will
    call, so that a missing API key stops the run before the first item.
    `validate(evaluator)`: the problems of a definition (as messages), found before the run
    starts; a type that has it checks its options itself (a library metric's own parameters
    are known only once the metric is named), `options` then lists the fixed ones.
    """
    if not isinstance(type_name, str) or not type_name.strip():
        raise ValueError(
            f"register() needs the type's name, a non-empty string (got {type_name!r}): "
            '@register("my-type", options=[...])'
        )
    names = frozenset((options,) if isinstance(options, str) else options or ())

    def decorator(fn: Implementation) -> Implementation:
        previous = REGISTRY.get(type_name)
        if previous is not None and previous.implementation is not fn:
            logger.warning(
                "evaluator type %r is registered twice (%s, then %s); the last one is used",
                type_name,
                _origin(previous.implementation),
                _origin(fn),
            )
        REGISTRY[type_name] = EvaluatorType(
            type_name,
            fn,
            names,
            options_declared=options is not None,
            calls_provider=calls_provider or providers is not None,
            calls_nothing=calls_nothing,
            provider_uses=providers,
            validate=validate,
        )
        return fn

    return decorator


def _origin(fn: Any) -> str:
    """`module.function`, the way a duplicate registration is named."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def stopped_by_user_code(exc: BaseException, who: str) -> str:
    """Why an item (or evaluation) whose user code raised SystemExit or KeyboardInterrupt is
    an error: left alone, it would stop the event loop every other item shares."""
    raised = f"{type(exc).__name__}({', '.join(map(repr, exc.args))})"
    return (
        f"{raised}: {who} raised it (`sys.exit()`, `exit()` or a KeyboardInterrupt of its "
        "own); it cannot stop Cobalt, so this is an error. Raise an ordinary exception instead."
    )


CONTEXT_HELP = (
    "`context` must be a function of the item, output and metadata (an EvalContext, also a "
    "mapping) that returns a dict of extra variables or the whole context changed "
    '({**ctx, "item": {...}}), or a dict of variable → field path ({"question": "input.q"})'
)


async def context_variables(evaluator: Evaluator, target: EvalTarget) -> dict[str, Any]:
    """The extra variables of an evaluator's `context=` (the original's context mapper)."""
    return (await apply_context(evaluator, target))[1]


async def apply_context(
    evaluator: Evaluator, target: EvalTarget
) -> tuple[EvalTarget, dict[str, Any]]:
    """An evaluator's `context=` applied: what it scores, and the extra variables. A function
    may return extra variables, or (the original's mapper) the whole context with its item,
    output or metadata changed, for this evaluator only; a dict maps names to field paths."""
    from cobalt_app.templating import TemplateError, _lookup, template_context

    mapper = evaluator.options.get("context")
    if mapper is None:
        return target, {}
    if callable(mapper):
        seen = EvalContext(target.item, target.output, target.metadata, target.latency_ms)
        try:
            value = await maybe_await(mapper(seen))
        except Exception as exc:
            raise EvaluationError(f"`context` raised {type(exc).__name__}: {exc}") from exc
        if isinstance(value, EvalContext):
            value = dict(value)
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise EvaluationError(f"{CONTEXT_HELP}; it returned {type(value).__name__}")
        return changed_context(target, value)
    if isinstance(mapper, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in mapper.items()
    ):
        fields = template_context(target.item, target.output, target.metadata)
        try:
            return target, {name: _lookup(fields, path) for name, path in mapper.items()}
        except TemplateError as exc:
            raise EvaluationError(f"`context`: {exc}") from None
    raise EvaluationError(f"{CONTEXT_HELP}; got {type(mapper).__name__}")


def changed_context(target: EvalTarget, value: dict[str, Any]) -> tuple[EvalTarget, dict]:
    """A mapper's return: extra variables, or a whole context (it has `item` and `output`):
    its item, output and metadata are scored, its other keys are extra variables."""
    if not ("item" in value and "output" in value):
        return target, value
    item, metadata = value["item"], value.get("metadata") or {}
    if not isinstance(item, dict) or not isinstance(metadata, dict):
        raise EvaluationError(
            "`context` returned a context whose item or metadata is not a dict; return "
            '{**ctx, "item": {**ctx["item"], ...}} or a dict of extra variables'
        )
    extra = {k: v for k, v in value.items() if k not in CONTEXT_KEYS}
    extra.update(value.get("context") or {})
    return dataclasses.replace(target, item=item, output=value["output"], metadata=metadata), extra


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


USER_THREADS = Threads("cobalt-eval", 256)  # sync evaluator functions


async def call_user_function(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a user's evaluator function: a coroutine function on the event loop, any other in
    a thread (a slow sync evaluator must not hold up every other item), awaiting what it
    returns. Threads are started on demand, up to many: they mostly wait on I/O."""
    if is_coroutine_function(fn):
        return await fn(*args)
    return await maybe_await(await USER_THREADS.call(fn, *args))


def is_coroutine_function(fn: Callable[..., Any]) -> bool:
    """`async def`, or an instance with `async def __call__` (asked once per function)."""
    try:
        return _is_coroutine_function(fn)
    except TypeError:  # an unhashable callable: asked every time
        return _is_coroutine_function.__wrapped__(fn)


@functools.lru_cache(maxsize=1024)
def _is_coroutine_function(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an instance with `async def __call__`
    )
