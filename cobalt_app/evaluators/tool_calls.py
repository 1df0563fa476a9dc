"""Agent checks: `tool-calls` compares the tools an agent called; `trajectory` grades them.

The calls are read from `metadata["tool_calls"]` when the runner reports them, else from the
item's trace (its tool steps, see `trace_spans`). Reported calls are a list of
`{"name", "arguments"}`,
OpenAI-shaped calls (`{"type": "function", "function": {"name", "arguments": "<json>"}}`,
Responses-API `function_call` items) or Anthropic `tool_use` blocks (text blocks in an Anthropic
content list are skipped). The expected calls come from `item["expected_tool_calls"]` (`field=`
for another field; a JSON string is parsed, so CSV datasets work). An expected call without
`arguments` matches any arguments.

Modes (as in LangChain's agentevals):

* `strict` — the same calls in the same order;
* `unordered` — the same calls in any order;
* `subset` — the agent made no call that is not expected (it may skip some);
* `superset` — the agent made every expected call (it may make more).

`match_arguments="exact"` (default) compares arguments as JSON values; `"ignore"` (or False)
compares tool names only.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from cobalt.evaluator import Evaluator
from cobalt_app import trace_spans
from cobalt_app.evaluators.base import EvalOutcome, EvalTarget, EvaluationError, register
from cobalt_app.evaluators.basic import output_text
from cobalt_app.evaluators.llm_judge import JUDGE_OPTIONS, ask_judge, judge_provider

MODES = ("strict", "unordered", "subset", "superset")
ANY = object()  # the arguments of an expected call that did not say
SKIPPED_BLOCKS = ("text", "thinking", "redacted_thinking")


@dataclass(frozen=True)
class Call:
    name: str
    arguments: Any = ANY

    def show(self) -> str:
        if self.arguments is ANY:
            return f"{self.name}(…)"
        shown = json.dumps(self.arguments, ensure_ascii=False, sort_keys=True, default=str)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        return f"{self.name}({shown})"


def normalise_calls(value: Any, where: str) -> list[Call]:
    """A list of tool calls in any supported shape → `Call`s; a clear error for anything else."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise EvaluationError(f"{where} is a string that is not JSON ({exc.msg})") from None
    if isinstance(value, dict):  # a whole assistant message (OpenAI or Anthropic), or one call
        if "tool_calls" in value:
            value = value["tool_calls"] or []
        elif isinstance(value.get("content"), list):
            value = value["content"]
        else:
            value = [value]
    if not isinstance(value, list | tuple):
        raise EvaluationError(
            f'{where} must be a list of tool calls like {{"name": ..., "arguments": {{...}}}} '
            f"(got {type(value).__name__})"
        )
    calls = []
    for index, raw in enumerate(value):
        if hasattr(raw, "model_dump"):  # SDK objects (openai/anthropic pydantic models)
            raw = raw.model_dump()
        if not isinstance(raw, dict):
            raise EvaluationError(f"{where}[{index}] is {type(raw).__name__}, not a tool call")
        if raw.get("type") in SKIPPED_BLOCKS:
            continue
        calls.append(_call(raw, f"{where}[{index}]"))
    return calls


def _call(raw: dict[str, Any], where: str) -> Call:
    spec = raw.get("function") if isinstance(raw.get("function"), dict) else raw
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise EvaluationError(f"{where} has no tool `name`")
    if "arguments" in spec:
        arguments = spec["arguments"]
    elif "input" in spec:  # Anthropic tool_use
        arguments = spec["input"]
    elif "args" in spec:
        arguments = spec["args"]
    else:
        return Call(name)
    if isinstance(arguments, str):
        # A string that is not JSON stays a string: it then only equals the same string.
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments) if arguments.strip() else {}
    return Call(name, arguments)


def calls_match(expected: Call, actual: Call, match_arguments: bool) -> bool:
    if expected.name != actual.name:
        return False
    return (
        not match_arguments or expected.arguments is ANY or expected.arguments == actual.arguments
    )


def argument_difference(expected: Call, actual: Call) -> str:
    """The first argument that differs, for a reason."""
    want, got = expected.arguments, actual.arguments
    if isinstance(want, dict) and isinstance(got, dict):
        for key in sorted(set(want) | set(got)):
            if key not in got:
                return f"argument {key!r} is missing (expected {want[key]!r})"
            if key not in want:
                return f"unexpected argument {key!r}={got[key]!r}"
            if want[key] != got[key]:
                return f"argument {key!r} is {got[key]!r}, expected {want[key]!r}"
    return f"arguments are {got!r}, expected {want!r}"


def match_pairs(expected: list[Call], actual: list[Call], match_arguments: bool) -> dict[int, int]:
    """A maximum matching expected index → actual index (Kuhn's augmenting paths)."""
    owner: dict[int, int] = {}

    def assign(e: int, seen: set[int]) -> bool:
        for a, call in enumerate(actual):
            if a in seen or not calls_match(expected[e], call, match_arguments):
                continue
            seen.add(a)
            if a not in owner or assign(owner[a], seen):
                owner[a] = e
                return True
        return False

    for e in range(len(expected)):
        assign(e, set())
    return {e: a for a, e in owner.items()}


def compare(
    expected: list[Call], actual: list[Call], mode: str, match_arguments: bool
) -> str | None:
    """None when the calls satisfy the mode, else the first difference."""
    if mode == "strict":
        return strict_difference(expected, actual, match_arguments)
    pairs = match_pairs(expected, actual, match_arguments)
    used = set(pairs.values())
    if mode in ("unordered", "superset"):
        missing = missing_call(expected, actual, pairs, used)
        if missing is not None:
            return missing
    if mode in ("unordered", "subset"):
        for a, got in enumerate(actual):
            if a not in used:
                return f"unexpected call {got.show()} (not among the expected calls)"
    return None


def strict_difference(
    expected: list[Call], actual: list[Call], match_arguments: bool
) -> str | None:
    """`strict`: the same calls in the same order; the first call that differs, else the
    first call missing or extra."""
    for position, (want, got) in enumerate(zip(expected, actual, strict=False), start=1):
        if want.name != got.name:
            return f"call {position}: expected {want.show()}, got {got.show()}"
        if not calls_match(want, got, match_arguments):
            return f"call {position} {got.name}: {argument_difference(want, got)}"
    if len(actual) < len(expected):
        missing = expected[len(actual)]
        return (
            f"expected {len(expected)} tool calls, got {len(actual)}: "
            f"call {len(actual) + 1} {missing.show()} was not made"
        )
    if len(actual) > len(expected):
        extra = actual[len(expected)]
        return (
            f"expected {len(expected)} tool calls, got {len(actual)}: "
            f"unexpected call {len(expected) + 1} {extra.show()}"
        )
    return None


def missing_call(
    expected: list[Call], actual: list[Call], pairs: dict[int, int], used: set[int]
) -> str | None:
    """The first expected call no actual call matched: how the nearest unmatched call of the
    same name differs, else that it was not made."""
    for e, want in enumerate(expected):
        if e not in pairs:
            near = next(
                (c for a, c in enumerate(actual) if a not in used and c.name == want.name), None
            )
            if near is not None:
                return f"expected call {want.show()}: {argument_difference(want, near)}"
            return f"expected call {want.show()} was not made"
    return None


def options(evaluator: Evaluator) -> tuple[str, bool]:
    mode = evaluator.options.get("mode", "strict")
    if mode not in MODES:
        raise EvaluationError(f"`mode` must be one of {', '.join(MODES)} (got {mode!r})")
    match_arguments = evaluator.options.get("match_arguments", "exact")
    if match_arguments in ("exact", True):
        return mode, True
    if match_arguments in ("ignore", False):
        return mode, False
    raise EvaluationError(
        f"`match_arguments` must be 'exact' or 'ignore' (got {match_arguments!r})"
    )


def reported_calls(target: EvalTarget) -> list[Call]:
    """The calls in `metadata["tool_calls"]`, else the tool steps of the trace."""
    if "tool_calls" in target.metadata:
        return normalise_calls(target.metadata["tool_calls"], 'metadata["tool_calls"]')
    steps = target.read_trace()
    if steps:
        return normalise_calls(trace_spans.tool_calls(steps), "the trace's tool calls")
    raise EvaluationError(
        "no tool calls to read: the trace holds no step (is `trace.enabled` off, or does the "
        "agent call its model without an instrumented SDK?) and the runner reported none: "
        'return {"output": ..., "metadata": {"tool_calls": [{"name": ..., "arguments": {...}}]}}'
    )


@register("tool-calls", options=("field", "mode", "match_arguments"))
async def tool_calls(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    mode, match_arguments = options(evaluator)
    name = evaluator.field or "expected_tool_calls"
    if target.item.get(name) is None:
        raise EvaluationError(
            f"the item has no {name!r} to compare the tool calls with "
            '(a list like [{"name": "search", "arguments": {"query": "..."}}])'
        )
    expected = normalise_calls(target.item[name], f"the item's {name!r}")
    actual = reported_calls(target)
    difference = compare(expected, actual, mode, match_arguments)
    if difference:
        return EvalOutcome(evaluator.name, 0.0, reason=difference)
    how = "" if match_arguments else ", arguments ignored"
    return EvalOutcome(
        evaluator.name,
        1.0,
        reason=f"{len(actual)} tool call(s) match the {len(expected)} expected ({mode}{how})",
    )


# ---------------------------------------------------------------------- trajectory judge

TRAJECTORY_CRITERIA = (
    "Grade the trajectory: did the agent call the right tools, with sensible arguments, in a "
    "sensible order, without unnecessary or repeated calls, and does its final answer follow "
    "from what the tools returned?"
)


def trajectory_prompt(evaluator: Evaluator, target: EvalTarget) -> str:
    calls = reported_calls(target)
    steps = "\n".join(f"{i}. {c.show()}" for i, c in enumerate(calls, start=1)) or "(none)"
    question = target.item.get("input", target.item)
    parts = [
        "You are grading an AI agent's trajectory: the sequence of tool calls it made to "
        "answer a request, and its final answer.",
        f"Request:\n{output_text(question)}",
        f"Tool calls, in order:\n{steps}",
    ]
    field = evaluator.field or "expected_tool_calls"
    if target.item.get(field) is not None:
        reference = normalise_calls(target.item[field], f"the item's {field!r}")
        shown = "\n".join(f"{i}. {c.show()}" for i, c in enumerate(reference, start=1))
        parts.append(f"A reference trajectory (a good one, not the only one):\n{shown}")
    parts.append(f"Final answer:\n{output_text(target.output)}")
    criteria = evaluator.options.get("criteria") or TRAJECTORY_CRITERIA
    parts.append(str(criteria))
    return "\n\n".join(parts)


@register("trajectory", options=("field", "criteria", *JUDGE_OPTIONS), providers=judge_provider)
async def trajectory(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    return await ask_judge(evaluator, trajectory_prompt(evaluator, target), env)
