"""Deterministic checks of the agent's trace (its captured model and tool calls).

* `steps` — `max_llm_calls=` and/or `max_tool_calls=`: 1 within the budget, else 0;
* `tool-errors` — the share of tool calls that did not fail (1.0 when none failed; with
  `threshold=` a pass/fail 1/0 on that share);
* `loops` — 0 when the same tool is called with the same arguments more than `max_repeats`
  times in a row (default 2), else 1;
* `tool-used` / `tool-not-used` — `tool=` (a name or a list of names) was, or was not, called.

An item with no captured step, or whose trace was not captured (see `traces`), is an
evaluation error (there is nothing to check), never a score.
"""

from __future__ import annotations

import json
from typing import Any

from cobalt.evaluator import Evaluator
from cobalt_app import trace_spans
from cobalt_app.evaluators.base import EvalOutcome, EvalTarget, EvaluationError, register

NO_TRACE = (
    "the trace holds no step: no model or tool call was captured (is `trace.enabled` off, or "
    "does the agent call its model without an instrumented SDK? `cobalt.span` and "
    "`@cobalt.tool` record steps by hand)"
)


def steps_of(target: EvalTarget) -> list[dict[str, Any]]:
    steps = target.read_trace()
    if not steps:
        raise EvaluationError(NO_TRACE)
    return steps


def whole_option(evaluator: Evaluator, name: str) -> int | None:
    value = evaluator.options.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise EvaluationError(f"`{name}` must be a whole number of at least 0 (got {value!r})")
    return value


def tool_names(evaluator: Evaluator) -> list[str]:
    value = evaluator.options.get("tool")
    names = [value] if isinstance(value, str) else value
    if not names or not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise EvaluationError(
            f"the {evaluator.type} evaluator needs `tool=` (a tool name, or a list of names, "
            'e.g. tool="search")'
        )
    return names


@register("steps", options=("max_llm_calls", "max_tool_calls"))
async def steps(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    max_llm = whole_option(evaluator, "max_llm_calls")
    max_tools = whole_option(evaluator, "max_tool_calls")
    if max_llm is None and max_tools is None:
        raise EvaluationError(
            "the steps evaluator needs `max_llm_calls=` and/or `max_tool_calls=` "
            "(for example max_llm_calls=5)"
        )
    trace = steps_of(target)
    llm_calls = len(trace_spans.model_calls(trace))
    tool_calls = len(trace_spans.tool_steps(trace))
    over = []
    if max_llm is not None and llm_calls > max_llm:
        over.append(f"{llm_calls} model calls (at most {max_llm})")
    if max_tools is not None and tool_calls > max_tools:
        over.append(f"{tool_calls} tool calls (at most {max_tools})")
    if over:
        return EvalOutcome(evaluator.name, 0.0, reason="over budget: " + ", ".join(over))
    return EvalOutcome(
        evaluator.name,
        1.0,
        reason=f"{llm_calls} model calls and {tool_calls} tool calls, within budget",
    )


@register("tool-errors", options=("threshold",))
async def tool_errors(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    tools = trace_spans.tool_steps(steps_of(target))
    if not tools:
        return EvalOutcome(evaluator.name, 1.0, reason="no tool was called")
    failed = [t for t in tools if t.get("status") == "error"]
    share = 1.0 - len(failed) / len(tools)
    reason = f"{len(failed)} of {len(tools)} tool calls failed"
    if failed:
        first = failed[0]
        reason += f" (first: {first.get('name')}: {first.get('error') or 'error'})"
    threshold = evaluator.threshold
    if threshold is not None:
        return EvalOutcome(evaluator.name, 1.0 if share >= threshold else 0.0, reason=reason)
    return EvalOutcome(evaluator.name, share, reason=reason)


@register("loops", options=("max_repeats",))
async def loops(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    limit = whole_option(evaluator, "max_repeats")
    limit = 2 if limit is None else limit
    calls = trace_spans.tool_calls(steps_of(target))
    longest, run, previous, worst = 0, 0, None, None
    for call in calls:
        key = (call["name"], json.dumps(call["arguments"], sort_keys=True, default=str))
        run = run + 1 if key == previous else 1
        previous = key
        if run > longest:
            longest, worst = run, call
    if worst is not None and longest > limit:
        return EvalOutcome(
            evaluator.name,
            0.0,
            reason=f"{worst['name']} was called {longest} times in a row with the same "
            f"arguments (at most {limit} allowed)",
        )
    return EvalOutcome(
        evaluator.name,
        1.0,
        reason=f"no tool repeated more than {limit} times in a row ({len(calls)} tool calls)",
    )


def called(target: EvalTarget) -> list[str]:
    return [str(c["name"]) for c in trace_spans.tool_calls(steps_of(target))]


@register("tool-used", options=("tool",))
async def tool_used(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    wanted = tool_names(evaluator)
    names = called(target)
    missing = [n for n in wanted if n not in names]
    if missing:
        seen = ", ".join(sorted(set(names))) or "none"
        return EvalOutcome(
            evaluator.name, 0.0, reason=f"not called: {', '.join(missing)} (called: {seen})"
        )
    return EvalOutcome(evaluator.name, 1.0, reason=f"called: {', '.join(wanted)}")


@register("tool-not-used", options=("tool",))
async def tool_not_used(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    unwanted = tool_names(evaluator)
    names = called(target)
    used = [n for n in unwanted if n in names]
    if used:
        counts = ", ".join(f"{n} ({names.count(n)}×)" for n in used)
        return EvalOutcome(evaluator.name, 0.0, reason=f"called although it should not: {counts}")
    return EvalOutcome(evaluator.name, 1.0, reason=f"not called: {', '.join(unwanted)}")
