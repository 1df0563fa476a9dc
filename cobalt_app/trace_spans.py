"""An item's captured OpenTelemetry spans as stored steps, and what is read from them.

A step is a small dict in the results-file shape (`name`, `kind`, `parent`, `startMs`,
`durationMs`, `model`, `inputTokens`, `outputTokens`, `cost`, `status`, `error`, `input`,
`output`; null where unknown), `parent` being the index of the parent step in the same list.
A step of kind "http" (a plain HTTP request, `cobalt_app.http_intercept`) also has `method`,
`url`, `statusCode` and `mark` (`http_fields`).
Attributes are read in the vocabularies the instrumentations use: OpenInference
(`openinference.span.kind`, `llm.*`, `input.value`), the OpenTelemetry GenAI conventions
(`gen_ai.*`, PydanticAI) and Cobalt's own (`cobalt.kind`, `cobalt.input`, `cobalt.output`).

Inputs, outputs and errors are cut to `max_chars` and secrets are taken out before anything
is kept (`cobalt.redaction`, with the process's secret environment values): tool arguments
and attributes under secret-looking names, credentials in URLs, key shapes.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from cobalt.redaction import may_hold, redact, redact_text
from cobalt.run_settings import RUN_DEFAULTS
from cobalt.wording import plural
from cobalt_app import trace_merge
from cobalt_app.pricing import estimate_cost
from cobalt_app.storable import clean_text, process_secrets
from cobalt_app.token_counts import count_without_usage, unanswered

KINDS = ("llm", "tool", "agent", "retrieval", "http", "other")
DEFAULT_MAX_CHARS = RUN_DEFAULTS.trace.max_chars
FINAL_ANSWER = "final_answer"  # smolagents' last "tool call": the agent's answer
SMOLAGENTS_SCOPE = "openinference.instrumentation.smolagents"
CREWAI_SCOPE = "openinference.instrumentation.crewai"
# CrewAI's instrumentation names a crew that has no name of its own after its random id
# (`Crew_<uuid>.kickoff`): every item's and run's crew step would be named differently.
UNNAMED_CREW = re.compile(r"Crew_[0-9a-fA-F-]{32,36}\.kickoff")
PREPARING = "._prepare_chat_with_tools"  # an LLM-kind span of LlamaIndex that calls nothing
OBSERVATION = "#observation:"  # a tool result known by its place, not by a call id
OPENINFERENCE_KINDS = {
    "LLM": "llm",
    "EMBEDDING": "llm",
    "TOOL": "tool",
    "AGENT": "agent",
    "RETRIEVER": "retrieval",
    "RERANKER": "retrieval",
}
GENAI_OPERATIONS = {
    "chat": "llm",
    "text_completion": "llm",
    "generate_content": "llm",
    "embeddings": "llm",
    "execute_tool": "tool",
    "invoke_agent": "agent",
    "create_agent": "agent",
}


def shown(value: Any, max_chars: int, secrets: Sequence[str] = ()) -> str | None:
    """Text to store for an input or output: redacted, then cut to `max_chars`."""
    if value is None:
        return None
    if isinstance(value, str):
        if not may_hold(value, secrets):  # most texts: scanned once, kept as they are
            text = value
        else:
            try:
                parsed = json.loads(value) if value[:1] in ("{", "[") else None
            except ValueError:
                parsed = None
            text = (
                json.dumps(redact(parsed, secrets=secrets), ensure_ascii=False)
                if parsed is not None
                else redact_text(value, secrets)
            )
    else:
        try:
            text = json.dumps(redact(value, secrets=secrets), ensure_ascii=False, default=str)
        except (TypeError, ValueError, RecursionError):
            text = redact_text(repr(value), secrets)
    text = clean_text(text)
    if len(text) > max_chars:
        text = text[: max(max_chars - 1, 0)] + "…"
    return text


def kind_of(attributes: Any) -> str:
    kind = attributes.get("cobalt.kind")
    if kind in KINDS:
        return kind
    kind = OPENINFERENCE_KINDS.get(str(attributes.get("openinference.span.kind", "")).upper())
    if kind:
        return kind
    return GENAI_OPERATIONS.get(str(attributes.get("gen_ai.operation.name", "")), "other")


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None
    return max(int(value), 0)


def _first(attributes: Any, *keys: str) -> Any:
    for key in keys:
        value = attributes.get(key)
        if value is not None and value != "":
            return value
    return None


@functools.lru_cache(maxsize=4096)
def _stored_name(name: str, secrets: tuple[str, ...]) -> str:
    """A span's name as stored: redacted, cleaned. Remembered: a service's spans have a handful
    of names, received thousands of times (the OTLP receiver's cost per span)."""
    return clean_text(redact_text(name, secrets))


def step_of(
    span: Any, a: dict[str, Any], origin_ns: int, max_chars: int, secrets: Sequence[str]
) -> dict[str, Any]:
    """One finished OpenTelemetry span (`ReadableSpan`, its attributes `a` as a dict) as a
    stored step (parent not set)."""
    kind = kind_of(a)
    model = _first(a, "llm.model_name", "gen_ai.response.model", "gen_ai.request.model")
    input_tokens = _int(
        _first(a, "llm.token_count.prompt", "gen_ai.usage.input_tokens", "cobalt.input_tokens")
    )
    output_tokens = _int(
        _first(
            a, "llm.token_count.completion", "gen_ai.usage.output_tokens", "cobalt.output_tokens"
        )
    )
    status_code = getattr(span.status.status_code, "name", "UNSET")
    estimated = None
    no_usage = kind == "llm" and input_tokens is None and output_tokens is None
    if no_usage and not unanswered(status_code == "ERROR", a):
        input_tokens, output_tokens, estimated = count_without_usage(model, a)
    cost = None
    if kind == "llm" and (input_tokens is not None or output_tokens is not None):
        cost = estimate_cost(model, input_tokens or 0, output_tokens or 0)
    error = span.status.description if status_code == "ERROR" else None
    if status_code == "ERROR" and not error:
        error = next(
            (
                f"{e.attributes.get('exception.type')}: {e.attributes.get('exception.message')}"
                for e in span.events or ()
                if e.name == "exception"
            ),
            "error",
        )
    name = span.name
    scope = getattr(getattr(span, "instrumentation_scope", None), "name", "") or ""
    if kind == "tool":
        name = str(_first(a, "tool.name", "gen_ai.tool.name", "cobalt.name") or name)
        if name == FINAL_ANSWER and scope.startswith(SMOLAGENTS_SCOPE):
            kind = "other"  # smolagents ends its loop through this "tool": it is the answer
    elif kind == "llm" and name.endswith(PREPARING):
        kind = "other"  # LlamaIndex's span around building a request: no model call
    elif scope.startswith(CREWAI_SCOPE) and UNNAMED_CREW.fullmatch(name):
        name = "Crew.kickoff"
    tool_input = _first(
        a, "cobalt.input", "input.value", "gen_ai.tool.call.arguments", "tool_arguments"
    )
    tool_output = _first(
        a, "cobalt.output", "output.value", "gen_ai.tool.call.result", "tool_response"
    )
    if kind == "llm" and tool_input is None:
        tool_input = _first(a, "gen_ai.input.messages", "gen_ai.prompt")
    if kind == "llm" and tool_output is None:
        tool_output = _first(a, "gen_ai.output.messages", "gen_ai.completion")
    step = {
        "name": _stored_name(str(name), tuple(secrets)),
        "kind": kind,
        "parent": None,
        "startMs": round((span.start_time - origin_ns) / 1e6, 3),
        "durationMs": round(((span.end_time or span.start_time) - span.start_time) / 1e6, 3),
        "model": clean_text(str(model)) if model is not None else None,
        "inputTokens": input_tokens,
        "outputTokens": output_tokens,
        "cost": cost,
        "status": "error" if status_code == "ERROR" else "ok",
        "error": redact_text(clean_text(str(error)), secrets)[:max_chars] if error else None,
        "input": shown(tool_input, max_chars, secrets),
        "output": shown(tool_output, max_chars, secrets),
    }
    if estimated:  # "tiktoken", "chars" or "unknown" (`token_counts`)
        step["tokensEstimated"] = estimated
    return _marked(step, span, a)


def _marked(step: dict[str, Any], span: Any, a: dict[str, Any]) -> dict[str, Any]:
    """The step with what Cobalt's own layers said of its span: replayed, intercepted, an
    HTTP target's trace ids, an HTTP request's fields."""
    if a.get("cobalt.replayed"):  # answered from a recording (`cobalt_app.recordings`)
        step["replayed"] = True
    if a.get("cobalt.trace_id"):  # an HTTP target's request: its service's spans join here
        step["traceId"] = str(a["cobalt.trace_id"])
        step["spanId"] = str(a.get("cobalt.span_id", ""))
        step["startUnixMs"] = round(span.start_time / 1e6, 3)
    mark = a.get("cobalt.intercepted")  # stubbed, injected, replayed (`cobalt_app.intercepts`)
    if mark:
        step["intercepted"] = str(mark)
    if step["kind"] == "http":  # a plain HTTP request of the agent (`http_intercept`)
        step.update(http_fields(a))
    return step


def http_fields(a: dict[str, Any]) -> dict[str, Any]:
    """An HTTP step's own fields: `method`, `url` (redacted), `statusCode` (null: no reply)
    and `mark`: live, recorded, replayed, stubbed, fault (injected) or refused (replay)."""
    status = _int(a.get("http.response.status_code"))
    return {
        "method": str(a.get("http.request.method") or ""),
        "url": str(a.get("url.full") or ""),
        "statusCode": status,
        "mark": str(a.get("cobalt.http.mark") or "live"),
    }


def attributes_of(span: Any) -> dict[str, Any]:
    """A span's attributes as a dict of its own. The SDK's span keeps them in a dict inside
    a `BoundedAttributes` that its `attributes` property wraps again: copied from that dict
    in one step, where copying through the two wrappers read each key in Python."""
    inner = getattr(getattr(span, "_attributes", None), "_dict", None)
    if type(inner) is dict:
        return inner.copy()
    return dict(span.attributes or {})


def steps_of(
    spans: Iterable[Any], origin_ns: int, *, max_chars: int = DEFAULT_MAX_CHARS
) -> list[dict[str, Any]]:
    """An item's finished spans as steps in start order, each `parent` an index or null.

    A model call whose tool calls no tool span shows (an agent that runs its tools in plain
    Python) gets them as inferred tool steps: from the end of that call to the start of the
    next call that carries their results, with the arguments as input and results as output.
    """
    spans = sorted(spans, key=lambda s: (s.start_time, s.end_time or 0))
    if not spans:
        return []
    secrets = process_secrets()
    index_of = {s.context.span_id: i for i, s in enumerate(spans)}
    attributes = [attributes_of(span) for span in spans]
    steps = [
        step_of(s, a, origin_ns, max_chars, secrets) for s, a in zip(spans, attributes, strict=True)
    ]
    for step, span in zip(steps, spans, strict=True):
        parent = span.parent.span_id if span.parent is not None else None
        step["parent"] = index_of.get(parent)
    steps, attributes = trace_merge.same_requests(steps, attributes)
    steps, attributes = trace_merge.nested_calls(steps, attributes)
    steps, attributes = trace_merge.one_tool_call(steps, attributes)
    if not any(s["kind"] == "tool" for s in steps):
        return _with_inferred_tools(steps, attributes, max_chars, secrets)
    _with_requested_arguments(steps, attributes, max_chars, secrets)
    return steps


def _with_requested_arguments(
    steps: list[dict[str, Any]],
    attributes: list[dict[str, Any]],
    max_chars: int,
    secrets: Sequence[str],
) -> None:
    """A tool span that records its input in its framework's shape (LangChain's bare value,
    smolagents' `{"args", "kwargs", ...}`) gets the arguments its model call asked for: the
    latest earlier call that requested a tool of that name, each request used once."""
    pending: list[tuple[float, str, Any]] = []  # (requested at, tool name, arguments)
    for step, a in sorted(zip(steps, attributes, strict=True), key=lambda t: t[0]["startMs"]):
        if step["kind"] == "llm":
            end = step["startMs"] + (step["durationMs"] or 0)
            pending += [(end, name, arguments) for _, name, arguments in _requested_calls(a)]
            continue
        if step["kind"] != "tool":
            continue
        found = next((n for n, p in enumerate(pending) if p[1] == step["name"]), None)
        if found is None:
            continue
        asked, current = _parsed(pending.pop(found)[2]), _parsed(step["input"])
        if isinstance(asked, dict) and not (
            isinstance(current, dict) and current.keys() == asked.keys()
        ):
            step["input"] = shown(asked, max_chars, secrets)


def _parsed(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _with_inferred_tools(
    steps: list[dict[str, Any]],
    attributes: list[dict[str, Any]],
    max_chars: int,
    secrets: Sequence[str],
) -> list[dict[str, Any]]:
    calls = [(i, _requested_calls(a)) for i, a in enumerate(attributes)]
    if not any(requested for _, requested in calls):
        return steps
    results: dict[str, tuple[int, Any]] = {}  # call id -> (step answering it, result text)
    for i, a in enumerate(attributes):
        for call_id, text in _tool_results(a):
            results.setdefault(call_id, (i, text))
    extra: list[dict[str, Any]] = []
    for i, requested in calls:
        caller = steps[i]
        start = caller["startMs"] + caller["durationMs"]
        for call_id, name, arguments in requested:
            answered = results.get(call_id) or _observed(i, start, steps, results)
            end = steps[answered[0]]["startMs"] if answered else None
            # smolagents ends its loop by "calling" final_answer, which nothing answers
            answer = name == FINAL_ANSWER and not answered
            extra.append(
                {
                    "name": clean_text(redact_text(name, secrets)),
                    "kind": "other" if answer else "tool",
                    "parent": caller["parent"],
                    "startMs": round(start, 3),
                    "durationMs": round(end - start, 3) if end is not None else None,
                    "model": None,
                    "inputTokens": None,
                    "outputTokens": None,
                    "cost": None,
                    "status": "ok" if answered else None,
                    "error": None,
                    "input": shown(arguments, max_chars, secrets),
                    "output": shown(answered[1], max_chars, secrets) if answered else None,
                }
            )
    merged = sorted(
        [(s["startMs"], 0, i, s) for i, s in enumerate(steps)]
        + [(s["startMs"], 1, i, s) for i, s in enumerate(extra)],
        key=lambda t: (t[0], t[1], t[2]),
    )
    new_index = {i: n for n, (_, is_extra, i, _) in enumerate(merged) if not is_extra}
    result = []
    for _, _, _, step in merged:
        parent = step["parent"]
        result.append({**step, "parent": new_index.get(parent) if parent is not None else None})
    return result


def _observed(
    caller: int, after: float, steps: list[dict[str, Any]], results: dict[str, tuple[int, Any]]
) -> tuple[int, Any] | None:
    """The result of a tool call that names no call id (smolagents answers through an
    `Observation:` message): the observation of the next model call after it."""
    for call_id, (answering, text) in results.items():
        later = answering > caller and steps[answering]["startMs"] >= after - 0.01
        if later and call_id.startswith(OBSERVATION):
            return answering, text
    return None


def _requested_calls(attributes: Any) -> list[tuple[str, str, Any]]:
    """(id, tool name, arguments) of the tool calls a model call's output asks for."""
    prefix = "llm.output_messages.0.message.tool_calls."
    calls = []
    for j in range(64):
        name = attributes.get(f"{prefix}{j}.tool_call.function.name")
        if name is None:
            break
        call_id = str(attributes.get(f"{prefix}{j}.tool_call.id") or f"{name}#{j}")
        arguments = attributes.get(f"{prefix}{j}.tool_call.function.arguments")
        calls.append((call_id, str(name), arguments))
    return calls


def _tool_results(attributes: Any) -> list[tuple[str, Any]]:
    """(call id, result) of the tool results a model call's request carries (chat `tool`
    messages, Anthropic `tool_result` blocks, smolagents' `Observation:` messages, known by
    their place), read from its JSON input."""
    raw = attributes.get("input.value")
    if not isinstance(raw, str) or ("tool" not in raw and "Observation:" not in raw):
        return []
    try:
        request = json.loads(raw)
    except ValueError:
        return []
    found = []
    messages = request.get("messages") or [] if isinstance(request, dict) else []
    for n, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        text = _text_of(message.get("content"))
        if message.get("role") in ("user", "tool-response") and text.startswith("Observation:"):
            found.append((f"{OBSERVATION}{n}", text[len("Observation:") :].strip()))
        if message.get("role") == "tool" and message.get("tool_call_id"):
            found.append((str(message["tool_call_id"]), message.get("content")))
        content = message.get("content")
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    found.append((str(block.get("tool_use_id")), block.get("content")))
    return found


def _text_of(content: Any) -> str:
    """A message's text (a string, or its text blocks joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(b.get("text")) for b in content if isinstance(b, dict) and b.get("text")
        )
    return ""


def model_calls(steps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The model calls of a trace, each counted once: an `llm` step that wraps another (a
    framework's span around the SDK's) is not a call of its own."""
    return [steps[i] for i in _model_call_indexes(steps)]


def _model_call_indexes(steps: Sequence[dict[str, Any]]) -> list[int]:
    wrappers = set()
    for step in steps:
        parent = step.get("parent")
        while parent is not None and 0 <= parent < len(steps):
            if steps[parent].get("kind") == "llm":
                wrappers.add(parent)
            parent = steps[parent].get("parent")
    return [i for i, s in enumerate(steps) if s.get("kind") == "llm" and i not in wrappers]


def _ancestors(steps: Sequence[dict[str, Any]], index: int) -> Iterable[int]:
    """The indexes of a step's parent, its parent's, … (at most 20 levels)."""
    parent, depth = steps[index].get("parent"), 0
    while parent is not None and 0 <= parent < len(steps) and depth < 20:
        yield parent
        parent, depth = steps[parent].get("parent"), depth + 1


def branch_usage(steps: Sequence[dict[str, Any]]) -> list[tuple[int | None, float | None]]:
    """Per step, (tokens, cost) of the model calls in its branch (itself and the steps under
    it), each call counted once; (None, None) for a branch without model calls."""
    tokens: list[int | None] = [None] * len(steps)
    costs: list[float | None] = [None] * len(steps)
    for i in _model_call_indexes(steps):
        call = steps[i]
        used = (call.get("inputTokens") or 0) + (call.get("outputTokens") or 0)
        for j in (i, *_ancestors(steps, i)):
            tokens[j] = (tokens[j] or 0) + used
            costs[j] = (costs[j] or 0.0) + (call.get("cost") or 0.0)
    return list(zip(tokens, costs, strict=True))


def failing_step(steps: Sequence[dict[str, Any]], item_error: str = "") -> int | None:
    """The index of the step where the item failed: the first step with an error status
    that has no failed step under it (an exception marks every span it crosses) or the
    unanswered tool call under it, else, when the item ended in an error, its last step;
    None when nothing failed."""
    failed = [i for i, s in enumerate(steps) if s.get("status") == "error"]
    if not failed:
        return len(steps) - 1 if item_error and steps else None
    crossed = {a for i in failed for a in _ancestors(steps, i)}
    found = next((i for i in failed if i not in crossed), failed[0])
    # A tool call under it that was never answered (inferred from its model call's request,
    # `_with_inferred_tools`) is where a plain-Python tool raised.
    unanswered = [
        i
        for i, s in enumerate(steps)
        if s.get("kind") == "tool" and s.get("status") is None and found in _ancestors(steps, i)
    ]
    return unanswered[-1] if unanswered else found


def total_ms(steps: Sequence[dict[str, Any]]) -> float:
    """From the item's start to the end of its last step (0 without steps)."""
    return max((s["startMs"] + (s.get("durationMs") or 0) for s in steps), default=0.0)


def estimated_usage(steps: Sequence[dict[str, Any]]) -> str:
    """The model calls of a trace whose tokens were counted without usage, as stored with it
    (JSON: `[{"model", "method", "calls"}]`; "" when every call reported its usage)."""
    found: dict[tuple[str, str], int] = {}
    for call in model_calls(steps):
        method = call.get("tokensEstimated")
        if method:
            key = (call.get("model") or "unknown model", method)
            found[key] = found.get(key, 0) + 1
    if not found:
        return ""
    return json.dumps([{"model": m, "method": how, "calls": n} for (m, how), n in found.items()])


def tool_steps(steps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in steps if s.get("kind") == "tool"]


def usage(steps: Sequence[dict[str, Any]]) -> tuple[int, int, float]:
    """(input tokens, output tokens, cost) summed over the trace's model calls."""
    calls = model_calls(steps)
    return (
        sum(c.get("inputTokens") or 0 for c in calls),
        sum(c.get("outputTokens") or 0 for c in calls),
        sum(c.get("cost") or 0.0 for c in calls),
    )


def tool_calls(steps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trace's tool calls as `{"name", "arguments"}` (arguments parsed when JSON)."""
    calls = []
    for step in tool_steps(steps):
        arguments: Any = step.get("input")
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):
                arguments = json.loads(arguments)
        calls.append({"name": step.get("name"), "arguments": arguments})
    return calls


def render(steps: Sequence[dict[str, Any]], *, max_chars: int = 200) -> str:
    """A compact text rendering for judge prompts, one line per step, indented by depth."""
    lines = []
    for step in steps:
        depth, parent = 0, step.get("parent")
        while parent is not None and depth < 20 and 0 <= parent < len(steps):
            depth, parent = depth + 1, steps[parent].get("parent")
        parts = [f"{'  ' * depth}[{step.get('kind')}] {step.get('name')}"]
        if step.get("model"):
            parts.append(f"model={step['model']}")
        if step.get("kind") == "http":
            parts.append(f"status={step.get('statusCode')} {step.get('mark')}")
        for key in ("input", "output"):
            if step.get(key):
                text = str(step[key])
                parts.append(f"{key}={text[:max_chars]}{'…' if len(text) > max_chars else ''}")
        if step.get("status") == "error":
            parts.append(f"error={step.get('error')}")
        lines.append(" ".join(parts))
    return "\n".join(lines)


def timeline(
    steps: Sequence[dict[str, Any]], start: int = 0, stop: int | None = None
) -> list[dict[str, Any]]:
    """Rows of the item panel's waterfall: each step of `steps[start:stop]` with its number
    (from 1), its depth and its bar's offset and width in thousandths of the whole trace's
    span (an SVG draws them; no script needed)."""
    if not steps:
        return []
    ends = [s["startMs"] + (s.get("durationMs") or 0) for s in steps]
    origin = min(s["startMs"] for s in steps)
    total = max(max(ends) - origin, 0.001)
    rows = []
    for number, step in enumerate(steps[start:stop], start + 1):
        depth, parent = 0, step.get("parent")
        while parent is not None and depth < 20 and 0 <= parent < len(steps):
            depth, parent = depth + 1, steps[parent].get("parent")
        offset = round((step["startMs"] - origin) / total * 1000)
        width = max(round((step.get("durationMs") or 0) / total * 1000), 2)
        tokens = (step.get("inputTokens") or 0) + (step.get("outputTokens") or 0)
        rows.append(
            {
                **step,
                "number": number,
                "depth": depth,
                # nested steps under their parent: "  ↳ name" per level
                "indent": "\u00a0\u00a0" * (depth - 1) + "↳\u00a0" if depth else "",
                "offset": min(offset, 998),
                "width": min(width, 1000 - min(offset, 998)),
                "tokens": tokens if step.get("inputTokens") is not None else None,
            }
        )
    return rows


def http_steps(steps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in steps if s.get("kind") == "http"]


def summary(steps: Sequence[dict[str, Any]]) -> str:
    """`3 steps: 2 model calls, 1 tool call` (the terminal's and the panel's one-liner)."""
    calls, tools = len(model_calls(steps)), len(tool_steps(steps))
    failed = sum(1 for s in tool_steps(steps) if s.get("status") == "error")
    text = f"{plural(len(steps), 'step')}: {plural(calls, 'model call')}, "
    text += plural(tools, "tool call")
    text += f" ({failed} failed)" if failed else ""
    requests = len(http_steps(steps))
    text += f", {plural(requests, 'HTTP request')}" if requests else ""
    marks: dict[str, int] = {}
    for step in steps:
        if step.get("intercepted"):
            marks[step["intercepted"]] = marks.get(step["intercepted"], 0) + 1
    return text + "".join(f", {n} {mark}" for mark, n in sorted(marks.items()))
