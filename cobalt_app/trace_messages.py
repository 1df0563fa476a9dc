"""A trace step's stored input and output as a person reads them: a model call's messages with
their roles, the tool calls they ask for as `name(args)`, the tools the call offered (folded
by the page), a tool call's own `name(args)`; any other value indented, never one line of JSON.

Steps are stored cut to `[trace] max_chars` (`trace_spans.shown` ends a cut text with "…"), so
a model call's JSON is often cut mid-message: `loads_cut` closes what the cut left open and
the page shows the messages up to the cut.

The request and reply shapes read: OpenAI chat (`messages`, `tools`, `choices`), Anthropic
messages (`system`, content blocks, `tool_use`/`tool_result`, `content` replies), the
OpenTelemetry GenAI messages (`parts`), LangChain's serialised messages (`kwargs`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

CUT = "…"  # how `trace_spans.shown` ends a cut text
REPAIR_TRIES = 12  # cut points tried, from the end, before giving up on a cut JSON text
INLINE_ARGS = 80  # arguments longer than this are written one per line
ROLES = {"human": "user", "ai": "assistant", "model": "assistant", "developer": "system"}
ROLES |= {"tool-response": "tool", "function": "tool", "system": "system"}


@dataclass
class Message:
    role: str  # system, user, assistant, tool (or what the provider called it)
    text: str = ""
    calls: list[str] = field(default_factory=list)  # `name(args)` of the tool calls it asks
    name: str = ""  # the tool a `tool` message answers, when known


@dataclass
class Tool:
    name: str
    description: str = ""
    schema: str = ""  # its parameters, indented JSON


@dataclass
class StepView:
    """What the page shows of one step: messages (a model call), a call (a tool), or plain
    indented texts; `cut` when the stored text was cut."""

    messages: list[Message] = field(default_factory=list)
    reply: list[Message] = field(default_factory=list)
    tools: list[Tool] = field(default_factory=list)
    call: str = ""
    input_text: str = ""
    output_text: str = ""
    cut: bool = False


def loads(text: Any) -> Any:
    """The JSON value of `text` (None when it is not JSON, or not text)."""
    if not isinstance(text, str) or text[:1] not in ("{", "["):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return loads_cut(text)


def loads_cut(text: str) -> Any:
    """The JSON value of a text cut short: open strings, lists and objects closed at the
    latest point where that gives JSON (a cut string keeps its start). None if none does."""
    body = text[:-1] if text.endswith(CUT) else text
    stack: list[str] = []
    in_string = escaped = False
    points: list[tuple[int, tuple[str, ...]]] = []  # (prefix length, closers) that may parse
    for i, char in enumerate(body):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
                points.append((i + 1, tuple(stack)))
            continue
        if char == '"':
            in_string = True
        elif char in "{[":
            stack.append("}" if char == "{" else "]")
            points.append((i + 1, tuple(stack)))
        elif char in "}]" and stack:
            stack.pop()
            points.append((i + 1, tuple(stack)))
        elif char == ",":
            points.append((i, tuple(stack)))
    tries = []
    if in_string:
        tail = body[:-1] if escaped else body
        tries.append(tail + '"' + "".join(reversed(stack)))
    tries += [body[:n] + "".join(reversed(s)) for n, s in reversed(points[-REPAIR_TRIES:])]
    for attempt in tries:
        try:
            return json.loads(attempt)
        except ValueError:
            continue
    return None


def indented(text: Any) -> str:
    """A stored value for a block: JSON indented (a cut one as far as it goes), else text."""
    if text is None:
        return ""
    value = loads(text)
    if value is None or isinstance(value, str):
        return str(text)
    return json.dumps(value, ensure_ascii=False, indent=2)


def call_text(name: str, arguments: Any) -> str:
    """`name(city="Paris", days=3)`: keyword arguments of an object, else the value; long
    arguments one per line."""
    if isinstance(arguments, str):
        parsed = loads(arguments)
        arguments = parsed if parsed is not None else arguments
    if isinstance(arguments, dict):
        parts = [f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items()]
    elif arguments is None or arguments == "":
        parts = []
    else:
        parts = [arguments if isinstance(arguments, str) else json.dumps(arguments)]
    inline = ", ".join(parts)
    if len(inline) <= INLINE_ARGS and "\n" not in inline:
        return f"{name}({inline})"
    return f"{name}(\n" + "".join(f"    {p},\n" for p in parts) + ")"


def view(step: dict[str, Any]) -> StepView:
    """How the page shows `step`'s input and output (both as stored, cut or not)."""
    raw_in, raw_out = step.get("input"), step.get("output")
    cut = any(isinstance(t, str) and t.endswith(CUT) for t in (raw_in, raw_out))
    shown = StepView(cut=cut)
    if step.get("kind") == "llm":
        request, reply = loads(raw_in), loads(raw_out)
        shown.messages, shown.tools = request_messages(request)
        shown.reply = reply_messages(reply)
        if not shown.messages and raw_in is not None:
            shown.input_text = indented(raw_in)
        if not shown.reply and raw_out is not None:
            shown.output_text = indented(raw_out)
        return shown
    if step.get("kind") == "tool":
        shown.call = call_text(str(step.get("name") or "tool"), raw_in)
    elif raw_in is not None:
        shown.input_text = indented(raw_in)
    shown.output_text = indented(raw_out)
    return shown


def request_messages(request: Any) -> tuple[list[Message], list[Tool]]:
    """The messages and the offered tools of a model call's request (empty when its shape is
    not one of those known)."""
    if isinstance(request, list):
        return _messages(request), []
    if not isinstance(request, dict):
        return [], []
    found: list[Message] = []
    system = request.get("system") or request.get("instructions")
    if system:
        found.append(Message("system", _text(system)))
    raw = request.get("messages") or request.get("input")
    if isinstance(raw, list) and raw and isinstance(raw[0], list):
        raw = [m for batch in raw for m in batch]  # LangChain: a batch of message lists
    if isinstance(raw, str):
        found.append(Message("user", raw))
    elif isinstance(raw, list):
        found += _messages(raw)
    tools = [t for t in (_tool(x) for x in request.get("tools") or []) if t is not None]
    return found, tools


def reply_messages(reply: Any) -> list[Message]:
    """The assistant messages of a model call's reply."""
    if isinstance(reply, list):
        return _messages(reply)
    if not isinstance(reply, dict):
        return []
    if isinstance(reply.get("choices"), list):  # OpenAI chat
        return _messages(
            [
                c.get("message") or c.get("delta") or {}
                for c in reply["choices"]
                if isinstance(c, dict)
            ]
        )
    if isinstance(reply.get("content"), list | str) and "role" in reply:  # Anthropic
        return _messages([reply])
    if isinstance(reply.get("output"), list):  # OpenAI responses
        return _messages(reply["output"])
    generations = reply.get("generations")  # LangChain
    if isinstance(generations, list):
        flat = [g for batch in generations for g in (batch if isinstance(batch, list) else [batch])]
        return _messages(
            [
                g.get("message") or {"role": "assistant", "content": g.get("text")}
                for g in flat
                if isinstance(g, dict)
            ]
        )
    return []


def _messages(raw: list[Any]) -> list[Message]:
    found = []
    for entry in raw:
        message = _message(entry)
        if message is not None:
            found.append(message)
    return found


def _message(entry: Any) -> Message | None:
    if not isinstance(entry, dict):
        return Message("user", str(entry)) if isinstance(entry, str) else None
    if isinstance(entry.get("kwargs"), dict):  # LangChain's serialised message
        entry = {**entry["kwargs"], "role": entry["kwargs"].get("type") or entry.get("type")}
    role = str(entry.get("role") or entry.get("type") or "message")
    role = ROLES.get(role, role)
    if entry.get("type") == "function_call":  # OpenAI responses: a tool call item
        return Message(
            "assistant", calls=[call_text(str(entry.get("name")), entry.get("arguments"))]
        )
    if entry.get("type") == "function_call_output":
        return Message("tool", _text(entry.get("output")))
    message = Message(role, name=str(entry.get("name") or ""))
    texts: list[str] = []
    content = entry.get("content") if "content" in entry else entry.get("parts")
    for block in content if isinstance(content, list) else [content]:
        _read_block(block, message, texts)
    for call in entry.get("tool_calls") or []:
        if isinstance(call, dict):
            function = call.get("function") if isinstance(call.get("function"), dict) else call
            message.calls.append(
                call_text(
                    str(function.get("name")), function.get("arguments", function.get("args"))
                )
            )
    message.text = "\n".join(t for t in texts if t)
    if role == "tool" and not message.name and entry.get("tool_call_id"):
        message.name = str(entry["tool_call_id"])
    return message


def _read_block(block: Any, message: Message, texts: list[str]) -> None:
    """One content block (or part) of a message: text, a tool call, a tool result."""
    if block is None:
        return
    if not isinstance(block, dict):
        texts.append(block if isinstance(block, str) else json.dumps(block, ensure_ascii=False))
        return
    kind = block.get("type")
    if kind in ("tool_use", "tool_call", "function_call"):
        message.calls.append(
            call_text(str(block.get("name")), block.get("input", block.get("arguments")))
        )
    elif kind in ("tool_result", "tool_call_response"):
        message.role = "tool"
        texts.append(_text(block.get("content", block.get("response"))))
    else:
        text = block.get("text", block.get("content"))
        texts.append(_text(text) if text is not None else json.dumps(block, ensure_ascii=False))


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_text(v.get("text", v) if isinstance(v, dict) else v) for v in value)
    return json.dumps(value, ensure_ascii=False, indent=2)


def _tool(raw: Any) -> Tool | None:
    if not isinstance(raw, dict):
        return None
    spec = raw.get("function") if isinstance(raw.get("function"), dict) else raw
    name = spec.get("name")
    if not name:
        return None
    schema = spec.get("parameters") or spec.get("input_schema") or spec.get("inputSchema")
    return Tool(
        name=str(name),
        description=str(spec.get("description") or ""),
        schema=json.dumps(schema, ensure_ascii=False, indent=2) if schema else "",
    )
