"""Framework tools answered like `@cobalt.tool`s: a LangChain tool stubbed, recorded and
replayed; a PydanticAI and an OpenAI Agents SDK agent (real SDKs, the fake provider) with
their function tools stubbed and faulted, each marked in its own step."""

from __future__ import annotations

import pytest

import cobalt
from cobalt import Dataset
from cobalt_app.models import ItemResult
from cobalt_app.trace_store import read_traces
from tests.conftest import Project
from tests.helpers import define, execute_one

pytestmark_db = pytest.mark.django_db(transaction=True)


LC_CALLS: list[str] = []


def langchain_tool():
    from langchain_core.tools import tool

    @tool
    def search_docs(q: str) -> str:
        """Search the help centre."""
        LC_CALLS.append(q)
        return f"live docs for {q}"

    return search_docs


@pytestmark_db
def test_a_langchain_tool_is_stubbed_recorded_and_replayed(project: Project):
    search_docs = langchain_tool()

    def runner(ctx):
        message = search_docs.invoke(
            {"name": "search_docs", "args": {"q": ctx.item["q"]}, "id": "c1", "type": "tool_call"}
        )
        return [message.content, search_docs.invoke({"q": ctx.item["q"] + "?"})]

    data = Dataset(items=[{"id": "a", "q": "refund"}, {"id": "b", "q": "shipping"}])
    stub = cobalt.stub("tool:search_docs", returns="stubbed docs", times=1)
    stubbed = execute_one(project, define("lc-stub", data, runner, intercept=[stub]))
    for result in ItemResult.objects.filter(run=stubbed):
        assert result.output == ["stubbed docs", f"live docs for {result.input['q']}?"]
        assert result.metadata["intercepted"] == {"stubbed": 1}
    LC_CALLS.clear()
    execute_one(project, define("lc", data, runner), overrides={"replay": "record"})
    assert sorted(LC_CALLS) == ["refund", "refund?", "shipping", "shipping?"]
    LC_CALLS.clear()
    replayed = execute_one(project, define("lc", data, runner), overrides={"replay": "replay"})
    assert LC_CALLS == []
    for result in ItemResult.objects.filter(run=replayed):
        q = result.input["q"]
        assert result.status == "ok", result.error
        assert result.output == [f"live docs for {q}", f"live docs for {q}?"]
        assert result.metadata["intercepted"] == {"replayed": 2}


@pytestmark_db
def test_a_pydantic_ai_tool_is_stubbed_in_its_own_step(project: Project, fake_provider):
    from openai import AsyncOpenAI
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(openai_client=AsyncOpenAI()))
    agent = Agent(model, instructions="Answer with the weather.")
    ran = []

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"sunny in {city}"

    async def runner(ctx):
        return (await agent.run(ctx.item["input"])).output

    data = Dataset(items=[{"id": "oslo", "input": 'Weather? [[tool:{"city": "Oslo"}]]'}])
    stub = cobalt.stub("tool:get_weather", fn=lambda city: f"snow in {city}")
    run = execute_one(project, define("pydantic-stub", data, runner, intercept=[stub]))
    (result,) = ItemResult.objects.filter(run=run)
    assert result.output == "tool said: snow in Oslo", result.error
    assert ran == []
    tools = [s for s in read_traces([result.id])[result.id].steps if s["kind"] == "tool"]
    assert [(s["name"], s.get("intercepted")) for s in tools] == [("get_weather", "stubbed")]


@pytestmark_db
def test_an_openai_agents_sdk_tool_is_stubbed_in_its_own_step(project: Project, fake_provider):
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_trace_processors,
    )
    from openai import AsyncOpenAI

    set_trace_processors([])  # no export to OpenAI; Cobalt adds its own processor
    ran = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"sunny in {city}"

    agent = Agent(
        name="weather",
        instructions="Answer with the weather.",
        tools=[get_weather],
        model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=AsyncOpenAI()),
    )

    async def runner(ctx):
        return (await Runner.run(agent, ctx.item["input"])).final_output

    data = Dataset(
        items=[
            {"id": "oslo", "input": 'Weather? [[tool:{"city": "Oslo"}]]'},
            {"id": "down", "input": 'Weather? [[tool:{"city": "Rome"}]]',
             "fixtures": [{"tool": "get_weather", "raises": "the weather API is down"}]},
        ]
    )  # fmt: skip
    stub = cobalt.stub("tool:get_weather", fn=lambda city: f"snow in {city}")
    run = execute_one(project, define("agents-stub", data, runner, intercept=[stub]))
    found = {r.item_key: r for r in ItemResult.objects.filter(run=run)}
    assert found["oslo"].output == "tool said: snow in Oslo", found["oslo"].error
    assert found["down"].output.startswith("tool said: An error occurred while running the tool")
    assert ran == []
    for key, mark in (("oslo", "stubbed"), ("down", "injected")):
        steps = read_traces([found[key].id])[found[key].id].steps
        tools = [s for s in steps if s["kind"] == "tool"]
        assert [(s["name"], s.get("intercepted")) for s in tools] == [("get_weather", mark)]


def _tool_step(name, parent, start, duration, given, mark=None):
    step = {
        "name": name,
        "kind": "tool",
        "parent": parent,
        "startMs": start,
        "durationMs": duration,
        "model": None,
        "inputTokens": None,
        "outputTokens": None,
        "cost": None,
        "status": "ok",
        "error": None,
        "input": given,
        "output": None,
    }
    return {**step, "intercepted": mark} if mark else step


def test_a_tool_call_seen_by_the_framework_and_by_cobalt_is_one_step_and_others_stay_apart():
    from cobalt_app.trace_merge import one_tool_call

    seen_twice = [  # LangChain's span (a one-argument tool's input bare), Cobalt's inside it
        _tool_step("search", None, 0.5, 1.0, "word0"),
        _tool_step("search", None, 1.3, 0.1, '{"query": "word0"}', mark="replayed"),
    ]
    (merged,), _ = one_tool_call(seen_twice, [{}, {}])
    assert (merged["startMs"], merged["intercepted"]) == (0.5, "replayed")
    apart = [
        _tool_step("search", None, 0.0, 5.0, '{"q": "a"}'),  # two at once, other arguments
        _tool_step("search", None, 1.0, 1.0, '{"q": "b"}'),
        _tool_step("search", None, 6.0, 0.5, '{"q": "a"}'),  # the same again, later
    ]
    kept, _ = one_tool_call([dict(s) for s in apart], [{}, {}, {}])
    assert kept == apart
