"""Agent frameworks traced with no Cobalt code in the agent: a real OpenAI Agents SDK agent
and a real PydanticAI agent, each calling a function tool, against the fake provider."""

from __future__ import annotations

import re

import pytest
from openai import AsyncOpenAI

from cobalt import Dataset, Evaluator
from cobalt_app.models import Evaluation, ItemResult
from cobalt_app.selectors import item_trace
from tests.helpers import define, execute

pytestmark = pytest.mark.django_db(transaction=True)


def cities(n: int) -> Dataset:
    return Dataset(
        items=[
            {
                "id": f"city-{i}",
                "input": f'Weather in city{i}? [[tool:{{"city": "city{i}"}}]]',
                "expected_tool_calls": [{"name": "get_weather", "arguments": {"city": f"city{i}"}}],
            }
            for i in range(n)
        ]
    )


def run_cities(project, name: str, runner) -> list[ItemResult]:
    evaluators = [Evaluator("tools", "tool-calls"), Evaluator("budget", "steps", max_llm_calls=2)]
    definition = define(name, cities(12), runner, evaluators=evaluators, concurrency=12)
    (run,) = execute(project, definition)
    scores = Evaluation.objects.filter(run=run).values_list("evaluator", "score")
    assert sorted(set(scores)) == [("budget", 1.0), ("tools", 1.0)]
    return list(ItemResult.objects.filter(run=run))


def check_item(item: ItemResult) -> list[dict]:
    """The item's model and tool calls, all about its own city; tokens from the trace."""
    trace = item_trace(item.id)
    city = re.search(r"city\d+", item.input["input"]).group(0)
    assert item.output == f"tool said: sunny in {city}", (item.error, item.traceback[-1500:])
    calls = [s for s in trace if s["kind"] in ("llm", "tool")]
    assert [s["kind"] for s in calls] == ["llm", "tool", "llm"]
    for step in calls:
        assert set(re.findall(r"city\d+", step["input"])) == {city}, step
    llm, tool, _ = calls
    assert llm["model"] == "gpt-4o-mini" and llm["inputTokens"] > 0
    assert (tool["name"], tool["output"]) == ("get_weather", f"sunny in {city}")
    assert item.tokens == sum(
        s["inputTokens"] + s["outputTokens"] for s in calls if s["kind"] == "llm"
    )
    assert item.metadata == {}
    return trace


@pytest.fixture
def agents_sdk_without_export():
    """The Agents SDK sends its traces to OpenAI by default: a user without an OpenAI account
    behind the key (here, the fake provider's) turns that off. Cobalt adds its own processor."""
    from agents import set_trace_processors

    set_trace_processors([])


def test_an_openai_agents_sdk_agent_is_traced(project, fake_provider, agents_sdk_without_export):
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    client = AsyncOpenAI()
    agent = Agent(
        name="weather",
        instructions="Answer with the weather.",
        tools=[get_weather],
        model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client),
    )

    async def runner(ctx):
        result = await Runner.run(agent, ctx.item["input"])
        return result.final_output

    for item in run_cities(project, "agents-sdk", runner):
        trace = check_item(item)
        names = {(s["kind"], s["name"]) for s in trace}
        assert ("agent", "weather") in names  # the SDK's agent span, around the calls


def test_a_pydantic_ai_agent_is_traced(project, fake_provider):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(openai_client=AsyncOpenAI()))
    agent = Agent(model, instructions="Answer with the weather.")

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    async def runner(ctx):
        return (await agent.run(ctx.item["input"])).output

    for item in run_cities(project, "pydantic-ai", runner):
        trace = check_item(item)
        assert trace[0]["kind"] == "agent" and trace[0]["parent"] is None
        assert all(s["parent"] == 0 for s in trace[1:])
