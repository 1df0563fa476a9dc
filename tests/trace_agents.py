"""Experiment files whose agents have no Cobalt-specific code: the trace tests run them with
the real `cobalt` command (and team workers), against the fake provider."""

from __future__ import annotations

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
