"""One model call described by several spans is one step (see `trace_spans.steps_of`):
a framework's span and the SDK's underneath, two instrumentations of one SDK, a user's own
instrumentation beside Cobalt's. Steps are the stored-step dicts of `trace_spans`, each with
its span's attributes beside it."""

from __future__ import annotations

import json
import re
from typing import Any

MERGED = ("model", "inputTokens", "outputTokens", "cost", "input", "output")


def nested_calls(
    steps: list[dict[str, Any]], attributes: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One model call seen by two spans (a framework's span around the SDK's, an
    instrumentation's two spans for one async call) is one step: the outer keeps its place
    and takes from the inner what it lacks."""
    children: dict[int, list[int]] = {}
    for i, step in enumerate(steps):
        if step["parent"] is not None:
            children.setdefault(step["parent"], []).append(i)
    into: dict[int, int] = {}
    for i, step in enumerate(steps):
        kids = children.get(i, [])
        if step["kind"] != "llm" or len(kids) != 1 or i in into:
            continue
        inner = steps[kids[0]]
        if inner["kind"] != "llm" or children.get(kids[0]):
            continue
        _absorb(steps, attributes, i, kids[0])
        into[kids[0]] = i
    return _without(steps, attributes, into)


def _absorb(
    steps: list[dict[str, Any]], attributes: list[dict[str, Any]], keep: int, drop: int
) -> None:
    """Step `keep` takes from step `drop` (the same model call) what it lacks."""
    step, other = steps[keep], steps[drop]
    end = max(_end(step), _end(other))  # a stream's span may end before its request does
    step["startMs"] = min(step["startMs"], other["startMs"])
    step["durationMs"] = round(end - step["startMs"], 3)
    for key in MERGED:
        if step[key] is None:
            step[key] = other[key]
    if other.get("replayed"):
        step["replayed"] = True
    if other.get("intercepted") and not step.get("intercepted"):
        step["intercepted"] = other["intercepted"]
    if other["status"] == "error":
        step["status"], step["error"] = "error", step["error"] or other["error"]
    attributes[keep] = {**attributes[drop], **attributes[keep]}


def one_tool_call(
    steps: list[dict[str, Any]], attributes: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One tool call seen by two spans (a framework's own, OpenInference's LangChain tool
    span, and Cobalt's, which answered or recorded the call) is one step: the first keeps its
    place and takes the other's mark and what it lacks. The two have the tool's name, the
    second lies within the first's time, under it, or beside it (or at the root: a thread
    the framework started without the context) with the same arguments."""
    into: dict[int, int] = {}
    for i, step in enumerate(steps):
        if step["kind"] != "tool" or i in into:
            continue
        for j in range(i + 1, len(steps)):
            other = steps[j]
            if j in into or other["kind"] != "tool" or other["name"] != step["name"]:
                continue
            if not _within(other, step):  # first: a time comparison, where inputs are parsed
                continue
            beside = other["parent"] in (step["parent"], None) and _same_input(other, step)
            if other["parent"] == i or beside:
                _absorb(steps, attributes, i, j)
                into[j] = i
                break
    return _without(steps, attributes, into)


def _same_input(one: dict[str, Any], other: dict[str, Any]) -> bool:
    """The same arguments (two calls of one tool at once are two steps); LangChain's span
    shows a one-argument tool's input bare (`word0` for `{"query": "word0"}`)."""
    a, b = _parsed(one["input"]), _parsed(other["input"])
    return a == b or _bare(a) == b or a == _bare(b)


def _bare(value: Any) -> Any:
    return next(iter(value.values())) if isinstance(value, dict) and len(value) == 1 else value


def _parsed(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return text


def _within(inner: dict[str, Any], outer: dict[str, Any]) -> bool:
    return outer["startMs"] <= inner["startMs"] and _end(inner) <= _end(outer) + 0.001


def _end(step: dict[str, Any]) -> float:
    return step["startMs"] + (step["durationMs"] or 0)


def _without(
    steps: list[dict[str, Any]], attributes: list[dict[str, Any]], into: dict[int, int]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The steps without those merged into another (`into`: dropped -> kept); a dropped
    step's children become the kept one's."""
    if not into:
        return steps, attributes
    keep = [i for i in range(len(steps)) if i not in into]
    new_index = {old: new for new, old in enumerate(keep)}
    for i in keep:
        parent = steps[i]["parent"]
        for _ in range(len(steps)):
            if parent is None or parent not in into:
                break
            parent = into[parent]
        steps[i]["parent"] = new_index.get(parent) if parent is not None else None
    return [steps[i] for i in keep], [attributes[i] for i in keep]


def same_requests(
    steps: list[dict[str, Any]], attributes: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Model-call steps that describe the same HTTP request are one step, nested or not: a
    framework's span and the SDK's (LangChain's and OpenAI's), two instrumentations of one
    SDK (the Anthropic SDK's own span and OpenInference's around `messages.stream`), or a
    user's own OpenInference instrumentation beside Cobalt's. The same request: a provider
    response id both carry; else, when one carries none, the same model and last input
    message at overlapping times (or one right after the other under the same parent). The
    one that encloses the other (else the first started) keeps its place and takes what it
    lacks; the other's children become its children."""
    calls = [i for i, step in enumerate(steps) if step["kind"] == "llm"]
    if len(calls) < 2:
        return steps, attributes
    keys = {i: _request_key(steps[i], attributes[i]) for i in calls}
    sharing: dict[Any, list[int]] = {}  # a response id or last message -> calls' positions
    for n, i in enumerate(calls):
        ids, last = keys[i]
        for token in {*ids, ("last", last)} if last is not None else ids:
            sharing.setdefault(token, []).append(n)
    into: dict[int, int] = {}
    for n, i in enumerate(calls):
        if i in into:
            continue
        ids, last = keys[i]
        tokens = {*ids, ("last", last)} if last is not None else ids
        later = sorted({m for t in tokens for m in sharing[t] if m > n})
        for m in later:
            j = calls[m]
            # A streaming call's span may end when the stream is handed over, before the
            # request underneath starts: the next call beside it is as good as overlapping.
            beside = m == n + 1 and steps[i]["parent"] == steps[j]["parent"]
            if j in into or not _same_request(steps[i], steps[j], keys[i], keys[j], beside):
                continue
            keep, drop = (j, i) if _is_ancestor(steps, j, i) else (i, j)
            _absorb(steps, attributes, keep, drop)
            into[drop] = keep
            if drop == i:
                break
    return _without(steps, attributes, into)


# An input message's role or content, at index 0 to 999 written as Python writes numbers.
_INPUT_MESSAGE = re.compile(r"llm\.input_messages\.(0|[1-9]\d{0,2})\.message\.(?:role|content)")
_RESPONSE_ID = re.compile(r'"id"\s*:\s*"((?:chatcmpl|msg|resp|gen|cmpl)[-_][\w-]{4,})"')


def _request_key(step: dict[str, Any], a: dict[str, Any]) -> tuple[set[str], str | None]:
    """(the provider response ids the call's span carries, its last input message's text)."""
    ids = {str(a["gen_ai.response.id"])} if a.get("gen_ai.response.id") else set()
    output = a.get("output.value")
    if isinstance(output, str):
        ids.update(_RESPONSE_ID.findall(output[:100_000]))
    last = None
    # The highest message index with a role or a content, found in one pass over the keys
    # (asking for each of 1,000 indexes cost more than the rest of an item's trace).
    numbers = (
        int(match[1])
        for key in a
        if key.startswith("llm.input_messages.") and (match := _INPUT_MESSAGE.fullmatch(key))
    )
    if (n := max(numbers, default=None)) is not None:
        prefix = f"llm.input_messages.{n}.message."
        last = a.get(f"{prefix}content") or a.get(f"{prefix}contents.0.message_content.text")
    return ids, (str(last).strip() or None) if last is not None else None


def _same_request(
    one: dict[str, Any], two: dict[str, Any], key_one: tuple, key_two: tuple, beside: bool
) -> bool:
    (ids_one, last_one), (ids_two, last_two) = key_one, key_two
    if ids_one and ids_two:
        return bool(ids_one & ids_two)
    if last_one is None or last_one != last_two:
        return False
    model_one, model_two = one.get("model") or "", two.get("model") or ""
    if not (model_one.startswith(model_two) or model_two.startswith(model_one)):
        return False
    end_one = one["startMs"] + (one["durationMs"] or 0)
    end_two = two["startMs"] + (two["durationMs"] or 0)
    return beside or (one["startMs"] <= end_two and two["startMs"] <= end_one)


def _is_ancestor(steps: list[dict[str, Any]], ancestor: int, step: int) -> bool:
    parent = steps[step]["parent"]
    for _ in range(len(steps)):
        if parent is None:
            return False
        if parent == ancestor:
            return True
        parent = steps[parent]["parent"]
    return False
