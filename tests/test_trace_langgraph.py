"""A real LangGraph ReAct agent (LangChain's `create_agent`), traced as its own tree — the
graph, its model and tools nodes, the model call under each model node, the tool under the
tools node — each model call counted once (LangChain's span and the OpenAI SDK's are one
step), tool calls scored from the trace, and replayed."""

from __future__ import annotations

import json

import pytest

from cobalt import Dataset, Evaluator
from cobalt_app import trace_spans
from cobalt_app.models import Evaluation
from cobalt_app.selectors import item_trace
from tests.helpers import define
from tests.trace_agents import city_items, langgraph_agent, record_then_replay, tree

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_langgraph_react_agent_shows_its_graph_and_counts_each_call_once(project, fake_provider):
    recorded, replayed = record_then_replay(project, fake_provider, graph_experiment())
    check(recorded, replayed)


def test_the_item_page_shows_the_graph_as_a_tree(project, fake_provider, client):
    import html
    import re

    from cobalt_app.models import ItemResult
    from tests.helpers import execute

    (run,) = execute(project, graph_experiment())
    item = ItemResult.objects.get(run=run, item_key="paris")
    page = html.unescape(client.get(f"/runs/{run.id}/items/{item.number}/").content.decode())
    names = re.findall(r'<span class="step-name">([^<]*)', page)
    assert [n.replace("\u00a0", " ").rstrip() for n in names] == [
        "LangGraph",
        "↳ model",
        "  ↳ ChatOpenAI",
        "↳ tools",
        "  ↳ get_weather",
        "↳ model",
        "  ↳ ChatOpenAI",
    ]
    assert "7 steps: 2 model calls, 1 tool call" in page


def test_langchain_instrumented_by_the_user_is_counted_once_too(project, fake_provider):
    """The user enabled OpenInference's LangChain instrumentation on the global provider
    themselves (as its docs say): Cobalt leaves theirs in place, and counts the same."""
    from openinference.instrumentation.langchain import LangChainInstrumentor
    from opentelemetry import trace

    from cobalt_app import traces

    traces.provider()  # the SDK provider on which Cobalt's processor is, set globally
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=trace.get_tracer_provider())
    try:
        recorded, replayed = record_then_replay(project, fake_provider, graph_experiment())
        assert instrumentor.is_instrumented_by_opentelemetry  # still theirs after the runs
    finally:
        instrumentor.uninstrument()
    check(recorded, replayed)


def graph_experiment():
    agent = langgraph_agent()

    async def runner(ctx):
        return await agent(ctx.item["input"])

    strict = Evaluator("tools", "tool-calls", mode="strict")
    return define("langgraph", Dataset(items=city_items()), runner, evaluators=[strict])


def check(recorded, replayed) -> None:
    for key, item in recorded.items():
        city = item.input["input"]
        assert item.output == f"tool said: sunny in {city}"
        steps = item_trace(item.id)
        assert tree(steps) == [
            ("other", "LangGraph", None),
            ("other", "model", "other"),
            ("llm", "ChatOpenAI", "other"),
            ("other", "tools", "other"),
            ("tool", "get_weather", "other"),
            ("other", "model", "other"),
            ("llm", "ChatOpenAI", "other"),
        ]
        assert [s["parent"] for s in steps] == [None, 0, 1, 0, 3, 0, 5]
        first, second = trace_spans.model_calls(steps)
        assert first["model"] == "gpt-4o-mini" and first["inputTokens"] > 0
        tool = steps[4]
        assert json.loads(tool["input"]) == {"city": city}
        assert "sunny in " + city in tool["output"] and tool["status"] == "ok"
        assert tool["durationMs"] is not None
        tokens = sum(c["inputTokens"] + c["outputTokens"] for c in (first, second))
        assert item.tokens == tokens  # each call once: LangChain's span and the SDK's merged
        assert [s["kind"] for s in item_trace(replayed[key].id)] == [s["kind"] for s in steps]
    scores = Evaluation.objects.filter(item__in=recorded.values()).values_list("score", flat=True)
    assert list(scores) == [1.0] * 3
