"""Production traces whose model calls were Anthropic streams or OpenAI Responses API calls
become items that replay offline: the real `anthropic` and `openai` SDKs (their stream readers
and `messages.stream` / `responses.stream` helpers) read the answers written from the trace's
GenAI attributes, with the provider's port closed."""

from __future__ import annotations

import json
import re
import time

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.conftest import free_port
from tests.helpers import run_id_of
from tests.test_services_production import serve


def text(content: str) -> dict:
    return {"type": "text", "content": content}


# Two tool-using conversations as GenAI instrumentations record them (semantic conventions
# 1.37+: `gen_ai.input.messages` / `gen_ai.output.messages` as JSON of role + parts, the system
# prompt apart in `gen_ai.system_instructions`, `gen_ai.provider.name`, streaming flagged).
REFUND_CALL = {"type": "tool_call", "id": "toolu_01", "name": "refund", "arguments": {"order": 7}}
TRACK_CALL = {"type": "tool_call", "id": "call_8", "name": "track", "arguments": {"order": 8}}
ANTHROPIC_CALLS = [
    (
        [{"role": "user", "parts": [text("Refund order 7?")]}],
        [
            {
                "role": "assistant",
                "parts": [text("Checking."), REFUND_CALL],
                "finish_reason": "tool_use",
            }
        ],
    ),
    (
        [
            {"role": "user", "parts": [text("Refund order 7?")]},
            {"role": "assistant", "parts": [text("Checking."), REFUND_CALL]},
            {
                "role": "user",
                "parts": [{"type": "tool_call_response", "id": "toolu_01", "response": "done"}],
            },
        ],
        [{"role": "assistant", "parts": [text("Order 7 is refunded.")], "finish_reason": "stop"}],
    ),
]
RESPONSES_CALLS = [
    (
        [{"role": "user", "parts": [text("Where is order 8?")]}],
        [{"role": "assistant", "parts": [TRACK_CALL], "finish_reason": "tool_call"}],
    ),
    (
        [
            {"role": "user", "parts": [text("Where is order 8?")]},
            {"role": "assistant", "parts": [TRACK_CALL]},
            {
                "role": "tool",
                "parts": [{"type": "tool_call_response", "id": "call_8", "response": "in Lyon"}],
            },
        ],
        [{"role": "assistant", "parts": [text("Order 8 is in Lyon.")], "finish_reason": "stop"}],
    ),
]


def add_trace(request: ExportTraceServiceRequest, n: int, question: str, answer: str, calls, ai):
    """One trace of the service: its agent span, and a model-call span per exchange."""
    resource = request.resource_spans.add()
    kv = resource.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "shop-agent"
    scope = resource.scope_spans.add()
    trace_id = bytes([n]) * 16
    spans = [("invoke_agent shop", {"gen_ai.operation.name": "invoke_agent"})]
    spans[0][1].update({"input.value": question, "output.value": answer})
    for asked, answered in calls:
        attributes = {
            **ai,
            "gen_ai.operation.name": "chat",
            "gen_ai.system_instructions": json.dumps([text("You are terse.")]),
            "gen_ai.input.messages": json.dumps(asked),
            "gen_ai.output.messages": json.dumps(answered),
            "gen_ai.usage.input_tokens": 40,
            "gen_ai.usage.output_tokens": 12,
        }
        spans.append((f"chat {ai['gen_ai.request.model']}", attributes))
    for index, (name, attributes) in enumerate(spans, start=1):
        span = scope.spans.add()
        span.trace_id, span.span_id, span.name = trace_id, index.to_bytes(8, "big"), name
        if index > 1:
            span.parent_span_id = (1).to_bytes(8, "big")
        span.start_time_unix_nano = 1_700_000_000_000_000_000 + index * 1_000_000
        span.end_time_unix_nano = span.start_time_unix_nano + 500_000
        for key, value in attributes.items():
            kv = span.attributes.add()
            kv.key = key
            if isinstance(value, bool):
                kv.value.bool_value = value
            elif isinstance(value, int):
                kv.value.int_value = value
            else:
                kv.value.string_value = value


def export() -> bytes:
    request = ExportTraceServiceRequest()
    anthropic_said = {
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "claude-haiku-4-5",
        "gen_ai.response.model": "claude-haiku-4-5-20251001",
        "gen_ai.request.stream": True,
    }
    openai_said = {
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.response.model": "gpt-4o-mini-2024-07-18",
        "gen_ai.response.id": "resp_0001",
    }
    refunded = "refund {'order': 7}: Order 7 is refunded."
    add_trace(request, 1, "Refund order 7?", refunded, ANTHROPIC_CALLS, anthropic_said)
    tracked = "track {'order': 8}: Order 8 is in Lyon."
    add_trace(request, 2, "Where is order 8?", tracked, RESPONSES_CALLS, openai_said)
    return request.SerializeToString()


REPLAYED = """
import json

import anthropic
from openai import OpenAI

from cobalt import Dataset, Evaluator, experiment


def refund(question):
    client = anthropic.Anthropic()
    asked = [{"role": "user", "content": question}]
    with client.messages.stream(
        model="claude-haiku-4-5", max_tokens=200, system="You are terse.", messages=asked
    ) as stream:
        first = stream.get_final_message()
    call = next(block for block in first.content if block.type == "tool_use")
    asked += [
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call.id, "content": "done"}]},
    ]
    events = client.messages.create(
        model="claude-haiku-4-5", max_tokens=200, system="You are terse.", messages=asked,
        stream=True,
    )
    answer = "".join(
        e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    return f"{call.name} {call.input}: {answer}"


def track(question):
    client = OpenAI()
    first = client.responses.create(model="gpt-4o-mini", instructions="Be brief.", input=question)
    call = next(item for item in first.output if item.type == "function_call")
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": question}]},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "in Lyon"},
    ]
    with client.responses.stream(model="gpt-4o-mini", input=items) as stream:
        final = stream.get_final_response()
    events = client.responses.create(model="gpt-4o-mini", input=items, stream=True)
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == final.output_text, (streamed, final.output_text)
    assert final.usage.input_tokens == 40
    return f"{call.name} {json.loads(call.arguments)}: {final.output_text}"


@experiment(
    "shop-from-production",
    Dataset.from_file("datasets/production.jsonl"),
    evaluators=[Evaluator(name="same", type="exact-match", field="expected_output")],
)
def run(ctx):
    question = ctx.item["input"]
    return refund(question) if "Refund" in question else track(question)
"""


def test_anthropic_streams_and_responses_api_calls_of_production_traces_replay_offline(
    project, cobalt_cli
):
    port = free_port()
    server = serve(project, port)
    try:
        sent = httpx.post(
            f"http://127.0.0.1:{port}/v1/traces",
            content=export(),
            headers={"Content-Type": "application/x-protobuf"},
            timeout=30,
        )
        assert sent.status_code == 200, sent.text
    finally:
        server.terminate()
        server.wait(timeout=10)
    deadline, ids = time.monotonic() + 120, []  # a loaded machine
    while time.monotonic() < deadline and len(ids) < 2:
        listed = cobalt_cli(project, "traces", "list", "--service", "shop-agent")
        ids = re.findall(r"^\s*([0-9a-f]{16})\s", listed.stdout, re.MULTILINE)
    added = cobalt_cli(project, "traces", "to-dataset", *ids)
    assert "2 of them hold their model calls: they replay offline" in added.stdout, added.stdout
    project.write("experiments/prod.cobalt.py", REPLAYED)
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens: no provider to reach
    replayed = cobalt_cli(
        project,
        "run",
        "experiments/prod.cobalt.py",
        "--replay",
        env={
            "OPENAI_BASE_URL": f"{closed}/v1",
            "ANTHROPIC_BASE_URL": closed,
            "OPENAI_API_KEY": "",
            "ANTHROPIC_API_KEY": "",
        },
    )
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    exported = cobalt_cli(project, "export", run_id_of(replayed), "--format", "json")
    items = {i["output"]["output"]: i for i in json.loads(exported.stdout)["items"]}
    assert set(items) == {
        "refund {'order': 7}: Order 7 is refunded.",
        "track {'order': 8}: Order 8 is in Lyon.",
    }, [i.get("error") for i in json.loads(exported.stdout)["items"]]
    for item in items.values():
        assert item["status"] == "ok" and item["evaluations"]["same"]["score"] == 1.0
