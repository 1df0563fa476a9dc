"""Checks of what the agent did to its world (`cobalt_app.intercepts`):

* `state` — the item's final state (`experiment(..., state=...)`, its tools changed it through
  `cobalt.state()`) equals the item's `expected_state` (`field=` another), 1 or 0 with the
  differences as the reason; `mode="subset"`: only what the expected state names is compared.
* `intercepted` — a tool (`tool="search"`) or an HTTP route (`route="GET https://host/*"`)
  was called, with `arguments` matching (a dict: each named argument equal, a string with `*`
  wildcards matched as a pattern), `times=` exactly, or between `min=` (default 1) and `max=`.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from cobalt.errors import ConfigError
from cobalt.evaluator import Evaluator
from cobalt.intercept import Stub, stub
from cobalt_app import trace_spans
from cobalt_app.evaluators.base import EvalOutcome, EvalTarget, EvaluationError, register
from cobalt_app.evaluators.trace_checks import steps_of, whole_option

MAX_DIFFERENCES = 8


@register("state", options=("field", "mode"))
async def state(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    field = evaluator.options.get("field") or "expected_state"
    mode = evaluator.options.get("mode") or "exact"
    if mode not in ("exact", "subset"):
        raise EvaluationError(f'`mode` is "exact" or "subset" (got {mode!r})')
    if field not in target.item:
        raise EvaluationError(
            f"the item has no `{field}` field: the state the agent should leave (or name "
            "another field with `field=`)"
        )
    if not isinstance(target.metadata, dict) or "state" not in target.metadata:
        raise EvaluationError(
            "no final state: declare the experiment's state "
            "(cobalt.experiment(..., state=lambda item: {...})) and change it in the tools "
            "through cobalt.state()"
        )
    expected, final = target.item[field], target.metadata["state"]
    found: list[str] = []
    differences(expected, final, "state", found, subset=mode == "subset")
    if not found:
        return EvalOutcome(evaluator.name, 1.0, reason=f"the final state matches `{field}`")
    shown = "; ".join(found[:MAX_DIFFERENCES])
    more = f" (and {len(found) - MAX_DIFFERENCES} more)" if len(found) > MAX_DIFFERENCES else ""
    return EvalOutcome(
        evaluator.name,
        0.0,
        reason=f"{len(found)} difference(s) from `{field}`: {shown}{more}",
    )


def differences(expected: Any, actual: Any, path: str, found: list[str], *, subset: bool) -> None:
    """Each place where `actual` differs from `expected`, as `path: expected X, got Y`."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in expected:
            if key not in actual:
                found.append(f"{path}.{key}: missing (expected {_short(expected[key])})")
            else:
                differences(expected[key], actual[key], f"{path}.{key}", found, subset=subset)
        if not subset:
            for key in actual:
                if key not in expected:
                    found.append(f"{path}.{key}: not expected (got {_short(actual[key])})")
        return
    if isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        for n, (e, a) in enumerate(zip(expected, actual, strict=True)):
            differences(e, a, f"{path}[{n}]", found, subset=subset)
        return
    if expected != actual:
        found.append(f"{path}: expected {_short(expected)}, got {_short(actual)}")


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 80 else text[:79] + "…"


def _declared(evaluator: Evaluator) -> Stub:
    tool, route = evaluator.options.get("tool"), evaluator.options.get("route")
    if (tool is None) == (route is None):
        raise EvaluationError(
            'the intercepted evaluator needs `tool=` (e.g. tool="search") or `route=` '
            '(e.g. route="GET https://api.example.com/search*"), one of them'
        )
    try:
        return stub(f"tool:{tool}" if tool is not None else str(route), where=evaluator.name)
    except ConfigError as exc:
        raise EvaluationError(str(exc)) from None


def _calls(declared: Stub, steps: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """(what was called, its arguments) of each matching step."""
    found = []
    if declared.kind == "tool":
        for call in trace_spans.tool_calls(steps):
            if declared.matches_tool(str(call["name"])):
                found.append((str(call["name"]), call["arguments"]))
        return found
    for step in steps:
        if step.get("kind") != "http":
            continue
        method, url = step.get("method"), step.get("url")
        if not method or not url:
            method, _, url = str(step.get("name") or "").partition(" ")
        if declared.matches_route(str(method), str(url)):
            body: Any = step.get("input")
            if isinstance(body, str):
                with contextlib.suppress(ValueError):
                    body = json.loads(body)
            found.append((f"{method} {url}", body))
    return found


def matches(pattern: Any, value: Any) -> bool:
    """`value` matches `pattern`: a dict's named keys match (others ignored), a string
    pattern with `*` wildcards matches the value's text, anything else is equal."""
    if isinstance(pattern, dict):
        return isinstance(value, dict) and all(
            key in value and matches(expected, value[key]) for key, expected in pattern.items()
        )
    if isinstance(pattern, str) and "*" in pattern:
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        return stub(f"tool:{pattern}").matches_tool(text)
    return pattern == value


@register("intercepted", options=("tool", "route", "arguments", "times", "min", "max"))
async def intercepted(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    declared = _declared(evaluator)
    times = whole_option(evaluator, "times")
    low = whole_option(evaluator, "min")
    high = whole_option(evaluator, "max")
    if times is not None:
        low = high = times
    low = 1 if low is None else low
    pattern = evaluator.options.get("arguments")
    calls = _calls(declared, steps_of(target))
    chosen = [c for c in calls if pattern is None or matches(pattern, c[1])]
    what = declared.target if declared.kind == "route" else f"tool {declared.pattern}"
    if pattern is not None:
        what += f" with arguments matching {_short(pattern)}"
    wanted = (
        f"exactly {low}"
        if low == high
        else f"at least {low}" + (f" and at most {high}" if high is not None else "")
    )
    counted = f"{what} was called {len(chosen)} time(s) (wanted {wanted})"
    if len(chosen) != len(calls):
        counted += f"; {len(calls)} call(s) of it in all"
    if not calls:
        counted += "; no call of it in the trace"
    elif len(chosen) < low or (high is not None and len(chosen) > high):
        seen = ", ".join(f"{name}({_short(args)})" for name, args in calls[:3])
        counted += f"; seen: {seen}"
    ok = len(chosen) >= low and (high is None or len(chosen) <= high)
    return EvalOutcome(evaluator.name, 1.0 if ok else 0.0, reason=counted)
