"""A production trace's model calls as the recording of the dataset item it became, so the item
replays offline (`cobalt traces to-dataset`, the traces page's "Add to dataset").

What a trace holds of a model call is not the request the agent sent but what the OpenTelemetry
GenAI conventions say of it: the model, the input messages (`gen_ai.input.messages`) and the
answer (`gen_ai.output.messages`), kept whole on received model-call spans (`otlp`). So such an
exchange (`{"fromTrace": ...}` in the recording) is matched by its *conversation*, not by the
request's bytes: the messages' roles and texts in order (system messages aside: the conventions
keep them in `gen_ai.system_instructions`, apart, or not at all), and a model that is the same
(or one the other's dated version: `gpt-4o-mini-2024-07-18` for `gpt-4o-mini`). Parameters such
as the temperature are not compared. The reply is written in the API the request speaks: an
OpenAI chat completion (streamed as server-sent events when the request asks for a stream) or
an Anthropic message.

Such recordings belong to the item, not to an experiment (`recording_store.SHARED`): every
experiment whose dataset holds the item replays them, until it records its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from cobalt_app import trace_spans

OPENAI_PATH = "/chat/completions"
ANTHROPIC_PATH = "/messages"
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
    messages left out; None when they are not a list of messages."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return None
    said = []
    for message in messages:
        role = str(message.get("role") or "")
        if role in SYSTEM_ROLES:
            continue
        said.append([role, _text_of(message.get("parts", message.get("content")))])
    return said


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
    """(model, conversation) of a chat request to an OpenAI or Anthropic API, else None."""
    path = urlsplit(url).path.rstrip("/")
    if not isinstance(body, dict) or not path.endswith((OPENAI_PATH, ANTHROPIC_PATH)):
        return None
    conversation = conversation_of(body.get("messages"))
    if conversation is None:
        return None
    return str(body.get("model") or ""), conversation


def same_model(asked: str, recorded: str) -> bool:
    """The model asked for is the recorded one, or the recorded one is its dated version
    (providers answer with it: `gpt-4o-mini-2024-07-18`, `claude-3-5-haiku-20241022`)."""
    if not recorded or asked == recorded:
        return True
    return re.fullmatch(re.escape(asked) + r"-\d{4}-?\d{2}-?\d{2}", recorded) is not None


def reply(url: str, body: dict[str, Any], recorded: dict[str, Any]) -> dict[str, Any]:
    """The recorded answer as the response (status, headers, body) to this request."""
    path = urlsplit(url).path.rstrip("/")
    model = recorded["model"] or str(body.get("model") or "")
    answer = recorded["reply"]
    tokens = (recorded["inputTokens"], recorded["outputTokens"])
    if path.endswith(ANTHROPIC_PATH):
        return _json_response(_anthropic(model, answer, tokens))
    if body.get("stream"):
        events = _openai_chunks(model, answer, tokens, body)
        text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return {"status": 200, "headers": {"content-type": "text/event-stream"}, "body": text}
    return _json_response(_openai(model, answer, tokens))


def _json_response(payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "status": 200,
        "headers": {"content-type": "application/json"},
        "body": json.dumps(payload),
    }


def _openai_calls(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "id": call["id"] or f"call_{n}",
            "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
        }
        for n, call in enumerate(answer["toolCalls"])
    ]


def _openai(model: str, answer: dict[str, Any], tokens: tuple[int, int]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer["text"] or None}
    if answer["toolCalls"]:
        message["tool_calls"] = _openai_calls(answer)
    return {
        "id": "chatcmpl-replayed",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if answer["toolCalls"] else "stop",
            }
        ],
        "usage": _openai_usage(tokens),
    }


def _openai_usage(tokens: tuple[int, int]) -> dict[str, int]:
    return {
        "prompt_tokens": tokens[0],
        "completion_tokens": tokens[1],
        "total_tokens": tokens[0] + tokens[1],
    }


def _openai_chunks(
    model: str, answer: dict[str, Any], tokens: tuple[int, int], body: dict[str, Any]
) -> list[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-replayed",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    delta: dict[str, Any] = {"role": "assistant", "content": answer["text"] or None}
    if answer["toolCalls"]:
        delta["tool_calls"] = [{"index": n, **call} for n, call in enumerate(_openai_calls(answer))]
    events = [chunk(delta, None), chunk({}, "tool_calls" if answer["toolCalls"] else "stop")]
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append({**chunk({}, None), "choices": [], "usage": _openai_usage(tokens)})
    return events


def _anthropic(model: str, answer: dict[str, Any], tokens: tuple[int, int]) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if answer["text"]:
        content.append({"type": "text", "text": answer["text"]})
    for n, call in enumerate(answer["toolCalls"]):
        content.append(
            {
                "type": "tool_use",
                "id": call["id"] or f"toolu_{n}",
                "name": call["name"],
                "input": call["arguments"] or {},
            }
        )
    return {
        "id": "msg_replayed",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if answer["toolCalls"] else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": tokens[0], "output_tokens": tokens[1]},
    }
