"""A production trace's model calls become its dataset item's recording ("Add to dataset" on
the traces page): matched by conversation, answered in the API the request speaks (OpenAI plain
and streamed, with tool calls; Anthropic), read by every experiment for every repetition."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import User
from django.test import Client
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from cobalt.config import active_config, load_config, set_active_config
from cobalt_app import otlp, recording_store, recordings
from cobalt_app.models import Recording
from tests.helpers import add_attributes

TRACE = "cd" * 16
ASKED = [
    {"role": "system", "parts": [{"type": "text", "content": "You are terse."}]},
    {"role": "user", "parts": [{"type": "text", "content": "Refund order 7?"}]},
]
ANSWERED = [
    {
        "role": "assistant",
        "parts": [
            {"type": "text", "content": "Checking."},
            {"type": "tool_call", "id": "c1", "name": "refund", "arguments": {"order": 7}},
        ],
    }
]


def export() -> bytes:
    """A service's trace: an agent span and its model call (GenAI parts, usage reported)."""
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    name = resource.resource.attributes.add()
    name.key, name.value.string_value = "service.name", "shop-agent"
    scope = resource.scope_spans.add()
    said = {
        1: {"gen_ai.operation.name": "invoke_agent", "input.value": "Refund order 7?"},
        2: {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.response.model": "gpt-4o-mini-2024-07-18",
            "gen_ai.input.messages": json.dumps(ASKED),
            "gen_ai.output.messages": json.dumps(ANSWERED),
            "gen_ai.usage.input_tokens": 31,
            "gen_ai.usage.output_tokens": 9,
        },
    }
    for n, attributes in said.items():
        span = scope.spans.add()
        span.trace_id, span.span_id = bytes.fromhex(TRACE), n.to_bytes(8, "big")
        if n > 1:
            span.parent_span_id = (1).to_bytes(8, "big")
        span.name = "agent" if n == 1 else "chat gpt-4o-mini"
        span.start_time_unix_nano = 1_700_000_000_000_000_000 + n
        span.end_time_unix_nano = span.start_time_unix_nano + 1_000_000
        add_attributes(span, attributes)
    return request.SerializeToString()


def tape_of(exchanges: list) -> recordings.Tape:
    return recordings.Tape(recordings.ReplaySettings(mode=recordings.REPLAY), exchanges)


def ask(tape: recordings.Tape, url: str, body: dict) -> dict:
    call = tape.call("POST", url, json.dumps(body).encode())
    return tape.answer(call)["response"]


OPENAI = "https://api.openai.com/v1/chat/completions"
MESSAGES = [
    {"role": "system", "content": "A different system prompt: not compared."},
    {"role": "user", "content": [{"type": "text", "text": "Refund order 7?"}]},
]


@pytest.mark.django_db
def test_adding_a_trace_to_a_dataset_records_its_model_calls_for_any_experiment(project):
    previous = active_config()
    set_active_config(load_config(project.path))
    try:
        otlp.receive(export(), "application/x-protobuf", "")
        client = Client()
        client.force_login(User.objects.create_user("ann", password="pw-ann-1234"))
        page = client.post("/traces/dataset/", {"trace": TRACE[:8]}, follow=True)
    finally:
        set_active_config(previous)
    text = page.content.decode()
    assert "Added 1 items to datasets/production.jsonl. 1 of them replay offline" in text
    (item,) = [json.loads(line) for line in (project.path / "datasets/production.jsonl").open()]
    assert item["input"] == "Refund order 7?"
    assert "messages" not in item["trace"][1]  # the dataset keeps the steps as shown
    assert Recording.objects.get().experiment == recording_store.SHARED
    loaded = recording_store.load_experiment("any-experiment")
    tape = tape_of(loaded[(item["id"], recording_store.ANY)])
    plain = json.loads(ask(tape, OPENAI, {"model": "gpt-4o-mini", "messages": MESSAGES})["body"])
    message = plain["choices"][0]["message"]
    assert (
        message["content"] == "Checking." and plain["choices"][0]["finish_reason"] == "tool_calls"
    )
    assert message["tool_calls"][0]["function"] == {"name": "refund", "arguments": '{"order": 7}'}
    assert plain["usage"] == {"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40}
    streamed = ask(
        tape,
        OPENAI,
        {"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True, "temperature": 0.5},
    )
    assert streamed["headers"]["content-type"] == "text/event-stream"
    events = [line[6:] for line in streamed["body"].splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[0])["choices"][0]["delta"]["content"]
    anthropic = ask(
        tape,
        "https://api.anthropic.com/v1/messages",
        {
            "model": "gpt-4o-mini",
            "system": "terse",
            "max_tokens": 50,
            "messages": [{"role": "user", "content": "Refund order 7?"}],
        },
    )
    assert [b["type"] for b in json.loads(anthropic["body"])["content"]] == ["text", "tool_use"]
    assert tape.replayed == 3


@pytest.mark.django_db
def test_an_anonymous_visitor_is_asked_to_log_in_and_keeps_the_traces_chosen(project):
    otlp.receive(export(), "application/x-protobuf", "")
    client = Client()
    listing = client.get("/traces/").content.decode()
    assert "Log in to add to dataset" in listing and ">Add to dataset<" not in listing
    chosen = {"trace": [TRACE], "path": "datasets/prod.jsonl", "back": "/traces/?status=ok"}
    answer = client.post("/traces/dataset/", chosen)
    back = f"/traces/?status=ok&trace={TRACE}&path=datasets%2Fprod.jsonl"
    assert answer.status_code == 302 and answer["Location"] == "/login/?" + urlencode(
        {"next": back}
    )
    again = client.get(back).content.decode()
    assert f'value="{TRACE}" checked' in again and 'value="datasets/prod.jsonl"' in again
    client.force_login(User.objects.create_user("ann", password="pw-ann-1234"))
    assert ">Add to dataset<" in client.get(back).content.decode()
    assert not (project.path / "datasets/prod.jsonl").exists()  # nothing written before


def test_another_conversation_or_model_is_not_answered_and_says_what_differs():
    exchange = {
        "fromTrace": {
            "model": "gpt-4o-mini-2024-07-18",
            "conversation": [["user", "Refund order 7?"]],
            "reply": {"text": "Done.", "toolCalls": []},
            "inputTokens": 3,
            "outputTokens": 1,
        }
    }
    tape = tape_of([exchange])
    other = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Refund 8?"}]}
    with pytest.raises(recordings.NoRecordedResponse) as missed:
        ask(tape, OPENAI, other)
    assert 'differs in messages.0.content: "Refund [-order 7?-] {+8?+}"' in str(missed.value)
    with pytest.raises(recordings.NoRecordedResponse):
        ask(
            tape,
            OPENAI,
            {"model": "gpt-4o", "messages": [{"role": "user", "content": "Refund order 7?"}]},
        )


def test_a_model_call_traced_by_openinference_becomes_a_recording():
    """OpenInference's instrumentations (the ones Cobalt installs: `openai`, `anthropic`) flatten
    the messages into attributes instead of the GenAI conventions' JSON; the names here are
    the installed semantic-conventions package's."""
    from openinference.semconv.trace import MessageAttributes as M
    from openinference.semconv.trace import MessageContentAttributes as C
    from openinference.semconv.trace import SpanAttributes as S
    from openinference.semconv.trace import ToolCallAttributes as T

    from cobalt_app import trace_recordings

    asked, answered = (
        f"{S.LLM_INPUT_MESSAGES}.",
        f"{S.LLM_OUTPUT_MESSAGES}.0.{M.MESSAGE_TOOL_CALLS}",
    )
    attributes = {
        "openinference.span.kind": "LLM",
        S.LLM_MODEL_NAME: "gpt-4o-mini-2024-07-18",
        f"{asked}0.{M.MESSAGE_ROLE}": "system",
        f"{asked}0.{M.MESSAGE_CONTENT}": "You are terse.",
        f"{asked}1.{M.MESSAGE_ROLE}": "user",
        f"{asked}1.{M.MESSAGE_CONTENTS}.0.{C.MESSAGE_CONTENT_TYPE}": "text",
        f"{asked}1.{M.MESSAGE_CONTENTS}.0.{C.MESSAGE_CONTENT_TEXT}": "Refund order 7?",
        f"{S.LLM_OUTPUT_MESSAGES}.0.{M.MESSAGE_ROLE}": "assistant",
        f"{S.LLM_OUTPUT_MESSAGES}.0.{M.MESSAGE_CONTENT}": "Checking.",
        f"{answered}.0.{T.TOOL_CALL_ID}": "c1",
        f"{answered}.0.{T.TOOL_CALL_FUNCTION_NAME}": "refund",
        f"{answered}.0.{T.TOOL_CALL_FUNCTION_ARGUMENTS_JSON}": '{"order": 7}',
        S.LLM_TOKEN_COUNT_PROMPT: 31,
        S.LLM_TOKEN_COUNT_COMPLETION: 9,
    }
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = bytes.fromhex(TRACE), (2).to_bytes(8, "big"), "Chat"
    span.start_time_unix_nano, span.end_time_unix_nano = 1, 2
    add_attributes(span, attributes)
    (received,), _ = otlp.spans_of(request)
    (exchange,) = trace_recordings.exchanges_of([received.step])
    assert exchange["fromTrace"]["conversation"] == [["user", "Refund order 7?"]]
    assert exchange["fromTrace"]["reply"] == {
        "text": "Checking.",
        "toolCalls": [{"id": "c1", "name": "refund", "arguments": {"order": 7}}],
    }
    answer = json.loads(
        ask(tape_of([exchange]), OPENAI, {"model": "gpt-4o-mini", "messages": MESSAGES})["body"]
    )
    assert answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "refund"
    assert answer["usage"]["total_tokens"] == 40
