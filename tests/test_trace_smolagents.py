"""A real smolagents ToolCallingAgent: its run, steps, model calls and tools as a tree; the
tool, which answers through an `Observation:` message, with its result, duration and status;
`final_answer` the answer, not a tool call (a strict tool-calls evaluator passes); replayed."""

from __future__ import annotations

import json
import time

import pytest

from cobalt import Dataset, Evaluator
from cobalt_app import trace_spans
from cobalt_app.models import Evaluation
from cobalt_app.selectors import item_trace
from tests.helpers import define
from tests.trace_agents import city_items, record_then_replay, smolagents_agent, tree

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_smolagents_agent_shows_its_steps_and_its_answer_is_no_tool_call(project, fake_provider):
    agent = smolagents_agent()

    def runner(ctx):
        return agent(ctx.item["input"])

    strict = Evaluator("tools", "tool-calls", mode="strict")
    definition = define("smolagents", Dataset(items=city_items()), runner, evaluators=[strict])
    recorded, replayed = record_then_replay(project, fake_provider, definition)
    for key, item in recorded.items():
        city = item.input["input"]
        assert item.output == f"tool said: sunny in {city}"
        steps = item_trace(item.id)
        assert tree(steps) == [
            ("agent", "ToolCallingAgent.run", None),
            ("other", "Step 1", "agent"),
            ("llm", "OpenAIModel.generate", "other"),
            ("tool", "get_weather", "other"),
            ("other", "Step 2", "agent"),
            ("llm", "OpenAIModel.generate", "other"),
            ("other", "final_answer", "other"),
        ]
        (tool,) = trace_spans.tool_steps(steps)
        assert json.loads(tool["input"]) == {"city": city}
        assert (tool["output"], tool["status"]) == (f"sunny in {city}", "ok")
        assert tool["durationMs"] is not None
        calls = trace_spans.model_calls(steps)
        assert len(calls) == 2 and all(c["inputTokens"] > 0 for c in calls)
        assert item.tokens == sum(c["inputTokens"] + c["outputTokens"] for c in calls)
        assert replayed[key].tokens == item.tokens
    scores = Evaluation.objects.filter(item__in=recorded.values()).values_list("score", flat=True)
    assert list(scores) == [1.0] * 3


def test_without_its_instrumentation_the_observations_still_answer_the_tool_calls(
    fake_provider,
):
    """As the OpenAI SDK's spans alone show the agent (smolagents' extra not installed): the
    tool steps are inferred from the model's calls, each answered by the next `Observation:`
    message; `final_answer` is the answer."""
    from openinference.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = OpenAIInstrumentor()
    assert not instrumentor.is_instrumented_by_opentelemetry  # no run is enabling it
    instrumentor.instrument(tracer_provider=provider)
    try:
        origin = time.time_ns()
        assert smolagents_agent()("Paris") == "tool said: sunny in Paris"
    finally:
        instrumentor.uninstrument()
    steps = trace_spans.steps_of(exporter.get_finished_spans(), origin)
    assert [(s["kind"], s["name"]) for s in steps] == [
        ("llm", "ChatCompletion"),
        ("tool", "get_weather"),
        ("llm", "ChatCompletion"),
        ("other", "final_answer"),
    ]
    tool = steps[1]
    assert (tool["output"], tool["status"]) == ("sunny in Paris", "ok")
    assert tool["durationMs"] >= 0 and tool["startMs"] >= steps[0]["startMs"]
    assert trace_spans.tool_calls(steps) == [
        {"name": "get_weather", "arguments": {"city": "Paris"}}
    ]
