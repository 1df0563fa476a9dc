"""A production trace's model answer written as the response to a replayed request, in the API
the request speaks (`trace_recordings.reply`): an OpenAI chat completion, an OpenAI Responses
API response, or an Anthropic message, each plain or streamed as the request asks (`"stream":
true`) with the server-sent events that API sends, so that its SDK's stream readers and helpers
(`messages.stream(...)`, `responses.stream(...)`) rebuild the same answer.

`answer` is `{"text", "toolCalls": [{"id", "name", "arguments"}]}`; `tokens` the call's
(input, output) tokens as the trace reported them.
"""

from __future__ import annotations

import json
from typing import Any

Tokens = tuple[int, int]


def sse(events: list[tuple[str | None, Any]], done: bool = False) -> dict[str, Any]:
    """A 200 response of server-sent events (`event:` lines where the API names its events)."""
    text = "".join(
        (f"event: {name}\n" if name else "") + f"data: {json.dumps(data)}\n\n"
        for name, data in events
    )
    if done:
        text += "data: [DONE]\n\n"
    return {"status": 200, "headers": {"content-type": "text/event-stream"}, "body": text}


def json_response(payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "status": 200,
        "headers": {"content-type": "application/json"},
        "body": json.dumps(payload),
    }


# ------------------------------------------------------------------ OpenAI chat completions


def _openai_calls(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "id": call["id"] or f"call_{n}",
            "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
        }
        for n, call in enumerate(answer["toolCalls"])
    ]


def _openai_usage(tokens: Tokens) -> dict[str, int]:
    return {
        "prompt_tokens": tokens[0],
        "completion_tokens": tokens[1],
        "total_tokens": tokens[0] + tokens[1],
    }


def chat(model: str, answer: dict[str, Any], tokens: Tokens, body: dict[str, Any]) -> dict:
    """A chat completion, or its chunks when the request streams."""
    if body.get("stream"):
        return sse([(None, e) for e in _chat_chunks(model, answer, tokens, body)], done=True)
    message: dict[str, Any] = {"role": "assistant", "content": answer["text"] or None}
    if answer["toolCalls"]:
        message["tool_calls"] = _openai_calls(answer)
    finish = "tool_calls" if answer["toolCalls"] else "stop"
    return json_response(
        {
            "id": "chatcmpl-replayed",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": _openai_usage(tokens),
        }
    )


def _chat_chunks(
    model: str, answer: dict[str, Any], tokens: Tokens, body: dict[str, Any]
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


# ------------------------------------------------------------------ OpenAI Responses API


def responses(model: str, answer: dict[str, Any], tokens: Tokens, body: dict[str, Any]) -> dict:
    """A Responses API response, or its events (`response.created` ... `response.completed`)
    when the request streams."""
    output: list[dict[str, Any]] = []
    if answer["text"]:
        part = {"type": "output_text", "text": answer["text"], "annotations": []}
        output.append(
            {
                "type": "message",
                "id": "msg_replayed",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        )
    for n, call in enumerate(answer["toolCalls"]):
        output.append(
            {
                "type": "function_call",
                "id": f"fc_replayed_{n}",
                "call_id": call["id"] or f"call_{n}",
                "name": call["name"],
                "arguments": json.dumps(call["arguments"]),
                "status": "completed",
            }
        )
    response = {
        "id": "resp_replayed",
        "object": "response",
        "created_at": 0,
        "status": "completed",
        "model": model,
        "output": output,
        "instructions": body.get("instructions"),
        "metadata": {},
        "parallel_tool_calls": True,
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "error": None,
        "incomplete_details": None,
        "usage": {
            "input_tokens": tokens[0],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": tokens[1],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": tokens[0] + tokens[1],
        },
    }
    if not body.get("stream"):
        return json_response(response)
    return sse([(e["type"], e) for e in _response_events(response)])


def _response_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The events the Responses API streams for `response`: each output item added, its text
    or arguments as one delta, done; then the response completed."""
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
    ]
    for index, item in enumerate(response["output"]):
        at = {"output_index": index, "item_id": item["id"]}
        if item["type"] == "message":
            part = item["content"][0]
            events += [
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "content": []},
                },
                {
                    "type": "response.content_part.added",
                    **at,
                    "content_index": 0,
                    "part": {**part, "text": ""},
                },
                {
                    "type": "response.output_text.delta",
                    **at,
                    "content_index": 0,
                    "delta": part["text"],
                    "logprobs": [],
                },
                {
                    "type": "response.output_text.done",
                    **at,
                    "content_index": 0,
                    "text": part["text"],
                    "logprobs": [],
                },
                {"type": "response.content_part.done", **at, "content_index": 0, "part": part},
            ]
        else:
            events += [
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "arguments": ""},
                },
                {
                    "type": "response.function_call_arguments.delta",
                    **at,
                    "delta": item["arguments"],
                },
                {
                    "type": "response.function_call_arguments.done",
                    **at,
                    "name": item["name"],
                    "arguments": item["arguments"],
                },
            ]
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": response})
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]


# ------------------------------------------------------------------ Anthropic messages


def anthropic(model: str, answer: dict[str, Any], tokens: Tokens, body: dict[str, Any]) -> dict:
    """An Anthropic message, or its events (`message_start` ... `message_stop`) when the
    request streams."""
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
    message = {
        "id": "msg_replayed",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if answer["toolCalls"] else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": tokens[0], "output_tokens": tokens[1]},
    }
    if not body.get("stream"):
        return json_response(message)
    return sse([(e["type"], e) for e in _anthropic_events(message)])


def _anthropic_events(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The events Anthropic streams for `message`: each content block started, given as one
    delta (`text_delta`, or `input_json_delta` for a tool call's input), stopped."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None}
    start["usage"] = {"input_tokens": usage["input_tokens"], "output_tokens": 0}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            opened = {**block, "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            opened = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events += [
            {"type": "content_block_start", "index": index, "content_block": opened},
            {"type": "content_block_delta", "index": index, "delta": delta},
            {"type": "content_block_stop", "index": index},
        ]
    stop = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    produced = {"output_tokens": usage["output_tokens"]}
    events += [
        {"type": "message_delta", "delta": stop, "usage": produced},
        {"type": "message_stop"},
    ]
    return events
