"""Experiment files whose agents have no Cobalt-specific code: the trace tests run them with
the real `cobalt` command (and team workers), against the fake provider."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

# A plain OpenAI SDK tool-calling loop. "Atlantis" fails after its first model call.
WEATHER_EXPERIMENT = """
import json

import openai

from cobalt import Dataset, Evaluator, experiment

client = openai.OpenAI()
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}]


def get_weather(city):
    if city == "Atlantis":
        raise RuntimeError("no weather station in Atlantis")
    return f"sunny in {city}"


def agent(city):
    messages = [{"role": "user", "content": f'Weather in {city}? [[tool:{{"city": "{city}"}}]]'}]
    while True:
        reply = client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, tools=TOOLS
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = get_weather(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})


CITIES = ["Paris", "Lima", "Oslo", "Atlantis"]
dataset = Dataset(items=[
    {"id": c.lower(), "input": c,
     "expected_tool_calls": [{"name": "get_weather", "arguments": {"city": c}}]}
    for c in CITIES
])


@experiment("weather", dataset, evaluators=[Evaluator(name="tools", type="tool-calls")])
def run(ctx):
    return agent(ctx.item["input"])
"""

# The same agent inside the user's own OpenTelemetry setup: a tracer provider set at import
# with an exporter that appends span names to $SPANS_FILE, and a span of the user's own; and a
# judge, whose model calls are Cobalt's, not the agent's (they reach no exporter).
USER_TRACING_PREFIX = """
import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class FileExporter(SpanExporter):
    def export(self, spans):
        with open(os.environ["SPANS_FILE"], "a") as fh:
            for span in spans:
                fh.write(span.name + "\\n")
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("my-app")
"""

USER_TRACING_EXPERIMENT = USER_TRACING_PREFIX + (
    WEATHER_EXPERIMENT.replace('@experiment("weather"', '@experiment("mine"')
    .replace(
        '    return agent(ctx.item["input"])',
        '    with tracer.start_as_current_span("my-agent"):\n        return agent(ctx.item["input"])',
    )
    .replace(
        'evaluators=[Evaluator(name="tools", type="tool-calls")]',
        'evaluators=[Evaluator(name="tools", type="tool-calls"), '
        'Evaluator(name="judge", prompt="Good? {{output}} [[score:0.9]]")]',
    )
)


# ------------------------------------------------------------------ real frameworks, in-process
# Each builds a real agent of its framework with one tool, `get_weather`, against the fake
# provider (OPENAI_*/ANTHROPIC_* point at it); the prompt's [[tool:...]] marker makes the model
# call the tool once, then answer "tool said: sunny in <city>".


def weather(city: str) -> str:
    return f"sunny in {city}"


def weather_prompt(city: str) -> str:
    return f'Weather in {city}? [[tool:{{"city": "{city}"}}]]'


def langgraph_agent():
    """A LangGraph ReAct agent (`create_agent`, a graph of model and tools nodes)."""
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return weather(city)

    graph = create_agent(ChatOpenAI(model="gpt-4o-mini"), tools=[get_weather])

    async def run(city: str) -> str:
        state = await graph.ainvoke({"messages": [("user", weather_prompt(city))]})
        return state["messages"][-1].content

    return run


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def litellm_agent(asynchronous: bool):
    """A tool loop on `litellm.completion` (or `acompletion`), OpenAI behind it."""
    import json

    import litellm

    def messages_for(city: str) -> list[dict]:
        return [{"role": "user", "content": weather_prompt(city)}]

    def answer(messages: list[dict], reply) -> str | None:
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = weather(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        return None

    def run_sync(city: str) -> str:
        messages = messages_for(city)
        while True:
            reply = litellm.completion(
                model="openai/gpt-4o-mini", messages=messages, tools=[WEATHER_TOOL]
            )
            if (done := answer(messages, reply)) is not None:
                return done

    async def run_async(city: str) -> str:
        messages = messages_for(city)
        while True:
            reply = await litellm.acompletion(
                model="openai/gpt-4o-mini", messages=messages, tools=[WEATHER_TOOL]
            )
            if (done := answer(messages, reply)) is not None:
                return done

    return run_async if asynchronous else run_sync


def smolagents_agent():
    """A smolagents ToolCallingAgent: its tool answers through an `Observation:` message and
    it ends by calling `final_answer`."""
    import os

    from smolagents import OpenAIServerModel, Tool, ToolCallingAgent

    class GetWeather(Tool):
        name = "get_weather"
        description = "The weather in a city."
        inputs = {"city": {"type": "string", "description": "the city"}}
        output_type = "string"

        def forward(self, city: str) -> str:
            return weather(city)

    model = OpenAIServerModel(
        model_id="gpt-4o-mini",
        api_base=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
    )

    def run(city: str) -> str:
        agent = ToolCallingAgent(tools=[GetWeather()], model=model, max_steps=4, verbosity_level=0)
        return str(agent.run(weather_prompt(city)))

    return run


def llama_index_agent():
    """A LlamaIndex FunctionAgent (a workflow that streams the model's tool calls) on its
    LiteLLM integration (`llama-index-llms-openai` holds openai below 3): three layers, one
    model call each."""
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.tools import FunctionTool
    from llama_index.llms.litellm import LiteLLM

    def get_weather(city: str) -> str:
        """The weather in a city."""
        return weather(city)

    llm = LiteLLM(model="openai/gpt-4o-mini")
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(get_weather)], llm=llm)

    async def run(city: str) -> str:
        return str(await agent.run(weather_prompt(city)))

    return run


def record_then_replay(project, fake_provider, definition):
    """Run `definition` with `--record`, then with `--replay`: (recorded run's items, replayed
    run's items, by item key), asserting the replay reached no provider."""
    from cobalt_app.models import ItemResult
    from tests.helpers import execute

    (recorded,) = execute(project, definition, overrides={"replay": "record"})
    requests = fake_provider.request_count()
    (replayed,) = execute(project, definition, overrides={"replay": "replay"})
    assert fake_provider.request_count() == requests  # answered from the recording
    items = [
        {i.item_key: i for i in ItemResult.objects.filter(run=run)} for run in (recorded, replayed)
    ]
    assert {k: (i.status, i.output) for k, i in items[1].items()} == {
        k: (i.status, i.output) for k, i in items[0].items()
    }
    return items


def tree(steps: list[dict]) -> list[tuple]:
    """(kind, name, parent's kind and name) of each step: the shape of a trace."""
    return [
        (
            s["kind"],
            s["name"],
            None if s["parent"] is None else steps[s["parent"]]["kind"],
        )
        for s in steps
    ]


CITIES = ["Paris", "Lima", "Oslo"]


def city_items() -> list[dict]:
    return [
        {
            "id": city.lower(),
            "input": city,
            "expected_tool_calls": [{"name": "get_weather", "arguments": {"city": city}}],
        }
        for city in CITIES
    ]


def haystack_pipeline():
    """A Haystack pipeline: a prompt builder feeding OpenAI's chat generator."""
    from haystack import Pipeline
    from haystack.components.builders import ChatPromptBuilder
    from haystack.components.generators.chat import OpenAIChatGenerator
    from haystack.dataclasses import ChatMessage

    pipeline = Pipeline()
    template = [ChatMessage.from_user("ECHO: the weather in {{ city }} is sunny")]
    pipeline.add_component("prompt", ChatPromptBuilder(template=template, required_variables="*"))
    pipeline.add_component("llm", OpenAIChatGenerator(model="gpt-4o-mini"))
    pipeline.connect("prompt.prompt", "llm.messages")

    def run(city: str) -> str:
        return pipeline.run({"prompt": {"city": city}})["llm"]["replies"][0].text

    return run


DSPY_ANSWER = "[[ ## answer ## ]]\nsunny\n\n[[ ## completed ## ]]"  # its ChatAdapter's format


def dspy_program():
    """A DSPy `Predict` module on LiteLLM (DSPy's own LM client); the
    fake provider must answer in DSPy's field format (`reply_when("Weather in", DSPY_ANSWER)`)."""
    import dspy

    lm = dspy.LM("openai/gpt-4o-mini", cache=False)
    predict = dspy.Predict("question -> answer")

    def run(city: str) -> str:
        with dspy.context(lm=lm):
            return predict(question=f"Weather in {city}?").answer

    return run


# A CrewAI crew: one agent with one tool and one task, on CrewAI's own OpenAI client (its
# `LLM`, which reads OPENAI_BASE_URL). CrewAI needs mcp<2, so it runs in its own virtualenv
# (tests/test_trace_crewai.py).
CREW_EXPERIMENT = """
from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool

from cobalt import Dataset, Evaluator, experiment


@tool("get_weather")
def get_weather(city: str) -> str:
    \"\"\"The weather in a city.\"\"\"
    return f"sunny in {city}"


def crew():
    forecaster = Agent(
        role="Forecaster",
        goal="Tell the weather",
        backstory="You read the weather station.",
        tools=[get_weather],
        llm=LLM(model="gpt-4o-mini"),
    )
    task = Task(
        name="forecast",
        description="{question}",
        expected_output="The weather in one sentence.",
        agent=forecaster,
    )
    return Crew(agents=[forecaster], tasks=[task])


CITIES = ["Paris", "Lima", "Oslo"]
dataset = Dataset(items=[
    {"id": c.lower(), "input": c,
     "expected_tool_calls": [{"name": "get_weather", "arguments": {"city": c}}]}
    for c in CITIES
])


@experiment("crew", dataset, evaluators=[Evaluator("tools", "tool-calls", mode="strict")])
def run(ctx):
    city = ctx.item["input"]
    question = f'Weather in {city}? [[tool:{{"city": "{city}"}}]]'
    return crew().kickoff(inputs={"question": question}).raw
"""


@contextlib.contextmanager
def weather_site(
    tmp_path_factory, provider, experiment: str = WEATHER_EXPERIMENT
) -> Iterator[tuple[str, str]]:
    """A project that ran the weather agent once with the real `cobalt run` against the fake
    `provider`, served by `cobalt serve` for the block: (its URL, the run id)."""
    from tests.conftest import cobalt_run, new_project, served

    project = new_project(tmp_path_factory, "traces", {"experiments/weather.cobalt.py": experiment})
    env = {
        "OPENAI_BASE_URL": provider.openai_base_url,
        "OPENAI_API_KEY": "sk-test-openai-SECRET-0001",
    }
    run_id = cobalt_run(project, "experiments/weather.cobalt.py", env=env, timeout=300)
    with served(project) as url:
        yield url, run_id
