"""`function` and `exact-match` evaluators."""

from __future__ import annotations

from typing import Any

from cobalt.evaluator import EvalContext, Evaluator
from cobalt_app.evaluators.base import (
    EvalOutcome,
    EvalTarget,
    EvaluationError,
    apply_context,
    call_user_function,
    normalise_result,
    register,
)


@register("function", options=("fn", "context"))
async def function_evaluator(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    target, extra = await apply_context(evaluator, target)
    try:
        value = await call_user_function(evaluator.fn, function_context(target, extra))
    except EvaluationError:
        raise
    except Exception as exc:
        raise function_raised(exc) from exc
    return function_verdict(evaluator, value)


def function_context(target: EvalTarget, extra: dict[str, Any]) -> EvalContext:
    """What a function evaluator's `fn` receives."""
    return EvalContext(
        item=target.item,
        output=target.output,
        metadata=target.metadata,
        latency_ms=target.latency_ms,
        context=extra,
    )


def function_raised(exc: Exception) -> EvaluationError:
    return EvaluationError(f"the function raised {type(exc).__name__}: {exc}")


def function_verdict(evaluator: Evaluator, value: Any) -> EvalOutcome:
    """A function evaluator's outcome from what its `fn` returned."""
    score, reason = normalise_result(value)
    return EvalOutcome(evaluator.name, score, reason=reason)


def field_value(evaluator: Evaluator, target: EvalTarget, default: str) -> Any:
    name = evaluator.field or default
    if name not in target.item:
        fields = [str(key) for key in target.item]
        shown = ", ".join(fields[:12]) + (", …" if len(fields) > 12 else "")
        raise EvaluationError(
            f"the item has no field {name!r} to compare with (its fields: {shown or 'none'}); "
            f"set the evaluator's `field=` to one of them"
        )
    return target.item[name]


def output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    import json

    return json.dumps(output, ensure_ascii=False, sort_keys=True, default=str)


@register("exact-match", options=("field", "case_sensitive"), calls_nothing=True)
async def exact_match(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    expected = field_value(evaluator, target, "expected_output")
    actual_text = output_text(target.output).strip()
    expected_text = output_text(expected).strip()
    if evaluator.options.get("case_sensitive", True) is False:
        actual_text, expected_text = actual_text.lower(), expected_text.lower()
    if actual_text == expected_text:
        return EvalOutcome(evaluator.name, 1.0, reason="output equals the expected value")
    shown = expected_text if len(expected_text) <= 80 else expected_text[:77] + "..."
    return EvalOutcome(evaluator.name, 0.0, reason=f"output differs from expected {shown!r}")
