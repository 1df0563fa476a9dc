"""A production trace's model calls as the recording of the dataset item it became, so the item
replays offline (`cobalt traces to-dataset`, the traces page's "Add to dataset").

What a trace holds of a model call is not the request the agent sent but what the OpenTelemetry
GenAI conventions say of it: the model, the input messages (`gen_ai.input.messages`) and the
answer (`gen_ai.output.messages`), kept whole on received model-call spans (`otlp`). So such an
exchange (`{"fromTrace": ...}` in the recording) is matched by its *conversation*, not by the
request's bytes: the messages' roles and texts in order (system messages aside: the conventions
keep them in `gen_ai.system_instructions`, apart, or not at all; turns without text left out
and a role's consecutive turns joined, as APIs split an answer and its tool calls differently),
and a model that is the same (or one the other's dated version: `gpt-4o-mini-2024-07-18` for
`gpt-4o-mini`). Parameters such as the temperature are not compared. The reply is written in the
API the request speaks (`trace_replies`): an OpenAI chat completion, an OpenAI Responses API
response or an Anthropic message, streamed as that API streams when the request asks.

Such recordings belong to the item, not to an experiment (`recording_store.SHARED`): every
experiment whose dataset holds the item replays them, until it records its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from cobalt_app import trace_replies, trace_spans

OPENAI_PATH = "/chat/completions"
ANTHROPIC_PATH = "/messages"
RESPONSES_PATH = "/responses"
SYSTEM_ROLES = ("system", "developer")


def exchanges_of(steps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trace's model calls whose messages it holds, as recorded exchanges (in order)."""
    found = []
    for step in trace_spans.model_calls(steps):
        said = step.get("messages") or {}
        conversation = conversation_of(_json(said.get("input")))
        answer = _json(said.get("output"))
        if not conversation or not isinstance(answer, list):
            continue
        found.append(
            {
                "fromTrace": {
                    "model": step.get("model") or "",
                    "conversation": conversation,
                    "reply": _reply_of(answer),
                    "inputTokens": step.get("inputTokens") or 0,
                    "outputTokens": step.get("outputTokens") or 0,
                }
            }
        )
    return found


def openinference_messages(attributes: dict[str, Any], prefix: str) -> list[dict] | None:
    """The messages OpenInference instrumentations flatten into attributes
    (`llm.input_messages.0.message.role`, `....message.content`, `....message.contents.0.
    message_content.text`, `....message.tool_calls.0.tool_call.function.name`), as OpenAI
    chat messages (`role`, `content`, `tool_calls`); None when the span has none."""
    found: dict[int, dict[str, Any]] = {}
    start = prefix + "."
    for key, value in attributes.items():
        if not key.startswith(start):
            continue
        index, _, field = key[len(start) :].partition(".message.")
        if not index.isdigit():
            continue
        message = found.setdefault(int(index), {"texts": {}, "calls": {}})
        if field in ("role", "content"):
            message[field] = value
        elif field.startswith("contents.") and field.endswith(".message_content.text"):
            message["texts"][field.split(".")[1]] = value
        elif field.startswith("tool_calls."):
            n, _, name = field[len("tool_calls.") :].partition(".tool_call.")
            call = message["calls"].setdefault(n, {"function": {}})
            if name == "id":
                call["id"] = value
            elif name in ("function.name", "function.arguments"):
                call["function"][name.split(".")[1]] = value
    if not found:
        return None
    return [_openinference_message(found[n]) for n in sorted(found)]


def _openinference_message(said: dict[str, Any]) -> dict[str, Any]:
    texts = [said["texts"][n] for n in sorted(said["texts"], key=int)]
    message = {"role": said.get("role") or "", "content": said.get("content") or "\n".join(texts)}
    if said["calls"]:
        message["tool_calls"] = [said["calls"][n] for n in sorted(said["calls"], key=int)]
    return message


def _json(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return None


def conversation_of(messages: Any) -> list[list[str]] | None:
    """[[role, text], ...] of messages in any of the shapes they come in (the GenAI
    conventions' `parts`, OpenAI's `content` text or parts, Anthropic's content blocks), system
    messages left out, a message of tool results alone a `tool` turn; None when they are not a
    list of messages."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return None
    said = []
    for message in messages:
        role = str(message.get("role") or "")
        if role in SYSTEM_ROLES:
            continue
        content = message.get("parts", message.get("content"))
        if _only_tool_results(content):  # Anthropic's are a user's message; OpenAI's a tool's
            role = "tool"
        said.append([role, _text_of(content)])
    return said


def _only_tool_results(content: Any) -> bool:
    return (
        isinstance(content, list)
        and bool(content)
        and all(
            isinstance(p, dict) and p.get("type") in ("tool_call_response", "tool_result")
            for p in content
        )
    )


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict):
            kind = part.get("type")
            if kind in ("text", "input_text", "output_text", None):
                texts.append(str(part.get("content") or part.get("text") or ""))
            elif kind in ("tool_call_response", "tool_result"):
                texts.append(_text_of(part.get("response", part.get("content"))))
    return "\n".join(t for t in texts if t)


def _reply_of(answer: list[Any]) -> dict[str, Any]:
    """The answer's text and tool calls (`{"id", "name", "arguments"}`)."""
    texts, calls = [], []
    for message in answer:
        if not isinstance(message, dict):
            continue
        parts = message.get("parts")
        if parts is None:
            texts.append(_text_of(message.get("content")))
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                calls.append(
                    {
                        "id": call.get("id") or "",
                        "name": function.get("name") or "",
                        "arguments": _json(function.get("arguments")) or {},
                    }
                )
            continue
        texts.append(_text_of(parts))
        for part in parts:
            if isinstance(part, dict) and part.get("type") == "tool_call":
                arguments = part.get("arguments")
                calls.append(
                    {
                        "id": part.get("id") or "",
                        "name": part.get("name") or "",
                        "arguments": _json(arguments) if isinstance(arguments, str) else arguments,
                    }
                )
    return {"text": "\n".join(t for t in texts if t), "toolCalls": calls}


def request_conversation(url: str, body: Any) -> tuple[str, list[list[str]]] | None:
    """(model, conversation) of a chat request to an OpenAI (chat completions or Responses) or
    Anthropic API, else None."""
    path = urlsplit(url).path.rstrip("/")
    if not isinstance(body, dict):
        return None
    if path.endswith(RESPONSES_PATH):
        conversation = _responses_conversation(body.get("input"))
    elif path.endswith((OPENAI_PATH, ANTHROPIC_PATH)):
        conversation = conversation_of(body.get("messages"))
    else:
        return None
    if conversation is None:
        return None
    return str(body.get("model") or ""), conversation


def _responses_conversation(given: Any) -> list[list[str]] | None:
    """The conversation of a Responses API request's `input`: a text (the user's), or items:
    messages (`instructions` and system messages aside, as in a trace), the model's function
    calls (an assistant turn without text) and their outputs (a `tool` turn), as the GenAI
    conventions write them."""
    if isinstance(given, str):
        return [["user", given]]
    if not isinstance(given, list) or not all(isinstance(i, dict) for i in given):
        return None
    said = []
    for item in given:
        kind = item.get("type") or "message"
        if kind == "message" and item.get("role") not in SYSTEM_ROLES:
            said.append([str(item.get("role") or ""), _text_of(item.get("content"))])
        elif kind == "function_call":
            said.append(["assistant", ""])
        elif kind == "function_call_output":
            said.append(["tool", _text_of(item.get("output"))])
    return said


def same_conversation(asked: list[list[str]], recorded: list[list[str]]) -> bool:
    """The same turns, however each API splits them: an assistant's text and its tool calls are
    one message in a chat request and the GenAI conventions, several items in a Responses API
    request; so turns without text are left out and a role's consecutive turns joined."""
    return _turns(asked) == _turns(recorded)


def _turns(conversation: list[list[str]]) -> list[tuple[str, str]]:
    turns: list[tuple[str, str]] = []
    for role, text in conversation:
        if not text:
            continue
        if turns and turns[-1][0] == role:
            turns[-1] = (role, turns[-1][1] + "\n" + text)
        else:
            turns.append((role, text))
    return turns


def same_model(asked: str, recorded: str) -> bool:
    """The model asked for is the recorded one, or the recorded one is its dated version
    (providers answer with it: `gpt-4o-mini-2024-07-18`, `claude-3-5-haiku-20241022`)."""
    if not recorded or asked == recorded:
        return True
    return re.fullmatch(re.escape(asked) + r"-\d{4}-?\d{2}-?\d{2}", recorded) is not None


def reply(url: str, body: dict[str, Any], recorded: dict[str, Any]) -> dict[str, Any]:
    """The recorded answer as the response (status, headers, body) to this request, in the API
    it speaks, streamed when it asks (`trace_replies`)."""
    path = urlsplit(url).path.rstrip("/")
    model = recorded["model"] or str(body.get("model") or "")
    tokens = (recorded["inputTokens"], recorded["outputTokens"])
    if path.endswith(ANTHROPIC_PATH):
        write = trace_replies.anthropic
    elif path.endswith(RESPONSES_PATH):
        write = trace_replies.responses
    else:
        write = trace_replies.chat
    return write(model, recorded["reply"], tokens, body)
