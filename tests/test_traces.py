"""Traces: every model and tool call of every item, captured through OpenTelemetry with no
Cobalt code in the agent, attributed to the right item, stored, priced and shown."""

from __future__ import annotations

import asyncio
import json
import re
import threading

import anthropic
import openai
import pytest

import cobalt
from cobalt import Dataset, Evaluator
from cobalt_app import results, traces
from cobalt_app.models import Evaluation, ItemResult, ItemTrace
from cobalt_app.pricing import estimate_cost
from cobalt_app.selectors import item_trace
from tests.helpers import define, execute

pytestmark = pytest.mark.django_db(transaction=True)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TRACE_KEYS = {
    "name",
    "kind",
    "parent",
    "startMs",
    "durationMs",
    "model",
    "inputTokens",
    "outputTokens",
    "cost",
    "status",
    "error",
    "input",
    "output",
}


def cities(n: int) -> Dataset:
    return Dataset(
        items=[
            {
                "id": f"city-{i}",
                "input": f"city{i}",
                "expected_tool_calls": [{"name": "get_weather", "arguments": {"city": f"city{i}"}}],
            }
            for i in range(n)
        ]
    )


def weather(city: str) -> str:
    return f"sunny in {city}"


def openai_tool_loop(client: openai.OpenAI, city: str) -> str:
    """A plain OpenAI SDK tool-calling loop, as a user writes it: no Cobalt code."""
    messages = [{"role": "user", "content": f'Weather? [[tool:{{"city": "{city}"}}]]'}]
    while True:
        reply = client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, tools=[WEATHER_TOOL]
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": weather(**arguments)}
            )


def stored_trace(item: ItemResult) -> list[dict]:
    return item_trace(item.id)


def test_a_plain_openai_tool_loop_is_traced_per_item_with_concurrency_20(project, fake_provider):
    client = openai.OpenAI()
    threads = set()

    def runner(ctx):
        threads.add(threading.get_ident())
        return openai_tool_loop(client, ctx.item["input"])

    tools = Evaluator("tools", "tool-calls")
    (run,) = execute(
        project, define("weather", cities(40), runner, evaluators=[tools], concurrency=20)
    )
    assert len(threads) > 1  # the sync runner really ran in several threads at once
    items = list(ItemResult.objects.filter(run=run).order_by("item_index"))
    assert [i.status for i in items] == ["ok"] * 40
    for item in items:
        city = item.input["input"]
        trace = stored_trace(item)
        assert [(s["kind"], s["name"]) for s in trace] == [
            ("llm", "ChatCompletion"),
            ("tool", "get_weather"),
            ("llm", "ChatCompletion"),
        ]
        # Every step of this item is about this item's city, and no other's.
        for step in trace:
            assert set(step) == TRACE_KEYS
            assert set(re.findall(r"city\d+", step["input"])) == {city}, step
        first, tool, second = trace
        assert first["model"] == "gpt-4o-mini" and first["status"] == "ok"
        assert json.loads(tool["input"]) == {"city": city}
        assert tool["output"] == f"sunny in {city}"
        assert tool["startMs"] >= first["startMs"] + first["durationMs"] - 0.01
        assert second["startMs"] >= tool["startMs"] + tool["durationMs"] - 0.01
        assert item.output == f"tool said: sunny in {city}"
        # Tokens and cost come from the trace: the metadata is empty.
        assert item.metadata == {}
        tokens_in = first["inputTokens"] + second["inputTokens"]
        tokens_out = first["outputTokens"] + second["outputTokens"]
        assert item.tokens == tokens_in + tokens_out > 0
        assert item.cost == pytest.approx(estimate_cost("gpt-4o-mini", tokens_in, tokens_out))
        assert item.cost > 0
    # The tool-calls evaluator scored from the trace.
    scores = Evaluation.objects.filter(run=run, evaluator="tools").values_list("score", flat=True)
    assert list(scores) == [1.0] * 40
    run.refresh_from_db()
    assert run.summary["agentTokens"] == sum(i.tokens for i in items)
    assert run.summary["agentCost"] == pytest.approx(sum(i.cost for i in items))
    # The results file carries each item's trace.
    (path,) = project.results_files()
    entries = json.loads(path.read_text())["items"]
    assert [len(e["trace"]) for e in entries] == [3] * 40
    assert entries[0]["trace"] == stored_trace(items[0])


def test_async_runners_with_both_sdks_keep_their_spans_apart(project, fake_provider):
    async def runner(ctx):
        async with (
            openai.AsyncOpenAI() as oa,
            anthropic.AsyncAnthropic() as an,
        ):
            first = await oa.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": f"ECHO: {ctx.item['input']}"}]
            )
            await asyncio.sleep(0)  # let the other items interleave
            second = await an.messages.create(
                model="claude-3-5-haiku",
                max_tokens=50,
                messages=[{"role": "user", "content": f"ECHO: {first.choices[0].message.content}"}],
            )
            return second.content[0].text

    (run,) = execute(project, define("both", cities(30), runner, concurrency=20))
    for item in ItemResult.objects.filter(run=run):
        city = item.input["input"]
        trace = stored_trace(item)
        assert [s["model"] for s in trace] == ["gpt-4o", "claude-3-5-haiku"], [
            {k: s[k] for k in ("name", "parent", "kind", "inputTokens")} for s in trace
        ]
        assert all(set(re.findall(r"city\d+", s["input"])) == {city} for s in trace)
        assert item.output == city
        expected = sum(
            estimate_cost(s["model"], s["inputTokens"], s["outputTokens"]) for s in trace
        )
        assert item.cost == pytest.approx(expected) and expected > 0


def test_metadata_still_wins_over_the_trace(project, fake_provider):
    client = openai.OpenAI()

    def runner(ctx):
        openai_tool_loop(client, ctx.item["input"])
        return {"output": "x", "metadata": {"tokens": 7, "cost": 0.5}}

    (run,) = execute(project, define("meta", cities(2), runner))
    for item in ItemResult.objects.filter(run=run):
        assert (item.tokens, item.cost) == (7, 0.5)
        assert len(stored_trace(item)) == 3


def test_custom_spans_and_tools_nest_and_record_failures(project):
    @cobalt.tool
    def lookup(term: str) -> dict:
        return {"hits": [term.upper()]}

    @cobalt.tool(name="broken")
    async def broken_tool(n: int) -> None:
        raise ValueError(f"no {n}")

    async def runner(ctx):
        with cobalt.span("plan", kind="agent", input={"q": ctx.item["input"]}) as plan:
            lookup(ctx.item["input"])
            with pytest.raises(ValueError):
                await broken_tool(3)
            with cobalt.span("think", kind="llm") as think:
                think.set(model="gpt-4o", input_tokens=1000, output_tokens=100)
            plan.output = "planned"
        return "ok"

    (run,) = execute(project, define("custom", cities(3), runner, concurrency=3))
    for item in ItemResult.objects.filter(run=run):
        trace = stored_trace(item)
        assert [(s["kind"], s["name"], s["parent"]) for s in trace] == [
            ("agent", "plan", None),
            ("tool", "lookup", 0),
            ("tool", "broken", 0),
            ("llm", "think", 0),
        ]
        plan, lookup_step, broken, think = trace
        assert json.loads(plan["input"]) == {"q": item.input["input"]}
        assert plan["output"] == "planned"
        assert json.loads(lookup_step["input"]) == {"term": item.input["input"]}
        assert json.loads(lookup_step["output"]) == {"hits": [item.input["input"].upper()]}
        assert broken["status"] == "error" and broken["error"] == "ValueError: no 3"
        assert think["cost"] == pytest.approx(estimate_cost("gpt-4o", 1000, 100))
        assert item.tokens == 1100


def test_secrets_are_never_stored(project, fake_provider, monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-very-private-value")
    client = openai.OpenAI()

    def runner(ctx):
        with cobalt.span(
            "call-service",
            kind="tool",
            input={
                "url": "https://api.example.com",
                "headers": {"Authorization": "Bearer abcdefghijklmnop", "X-Api-Key": "k-123456"},
                "note": "uses tok-very-private-value and sk-live-0123456789abcdef",
            },
        ) as step:
            step.output = "Authorization: Bearer zyxwvutsrqponm"
        return openai_tool_loop(client, ctx.item["input"])

    (run,) = execute(project, define("secrets", cities(1), runner))
    (item,) = ItemResult.objects.filter(run=run)
    text = json.dumps(stored_trace(item)) + json.dumps(results.run_results(run))
    for secret in (
        "abcdefghijklmnop",
        "k-123456",
        "tok-very-private-value",
        "sk-live-0123456789abcdef",
        "zyxwvutsrqponm",
        "sk-test-openai-SECRET-0001",
    ):
        assert secret not in text
    step = stored_trace(item)[0]
    assert json.loads(step["input"])["headers"] == {"Authorization": "***", "X-Api-Key": "***"}
    assert json.loads(step["input"])["url"] == "https://api.example.com"


def test_inputs_and_outputs_are_cut_to_the_configured_size(project):
    project.write("cobalt.toml", "[trace]\nmax_chars = 50\n")

    def runner(ctx):
        with cobalt.span("big", input="x" * 500) as step:
            step.output = "y" * 500
        return "ok"

    (run,) = execute(project, define("big", cities(1), runner))
    (step,) = stored_trace(ItemResult.objects.get(run=run))
    assert step["input"] == "x" * 49 + "…" and step["output"] == "y" * 49 + "…"


def test_no_trace_is_kept_when_capture_is_off(project, fake_provider):
    project.write("cobalt.toml", "[trace]\nenabled = false\n")
    client = openai.OpenAI()

    def runner(ctx):
        return openai_tool_loop(client, ctx.item["input"])

    (run,) = execute(project, define("off", cities(2), runner))
    assert ItemResult.objects.filter(run=run, status="ok").count() == 2
    # No step kept: each item's row only says why (see tests/test_trace_not_captured.py).
    stored = ItemTrace.objects.filter(item__run=run)
    assert list(stored.values_list("missing", flat=True)) == [traces.OFF, traces.OFF]
    assert all(e["trace"] == [] for e in results.run_results(run)["items"])


def test_run_pages_never_read_the_traces_only_the_item_panel_does(project, fake_provider):
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client_ = openai.OpenAI()
    (run,) = execute(
        project,
        define("pages", cities(30), lambda ctx: openai_tool_loop(client_, ctx.item["input"])),
    )
    browser = Client(HTTP_HOST="127.0.0.1")
    for url in ("/", f"/runs/{run.id}/", f"/runs/{run.id}/?page=2"):
        with CaptureQueriesContext(connection) as queries:
            assert browser.get(url).status_code == 200
        assert not [q for q in queries if "itemtrace" in q["sql"]], url
    item = ItemResult.objects.get(run=run, item_index=0)
    with CaptureQueriesContext(connection) as queries:
        panel = browser.get(f"/runs/{run.id}/items/{item.number}/").content.decode()
    assert len([q for q in queries if "itemtrace" in q["sql"]]) == 1
    assert "3 steps: 2 model calls, 1 tool call" in panel


def test_a_thread_that_carries_only_the_otel_context_still_joins_its_item(project):
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    tracer = trace.get_tracer("framework")

    def worker(parent_context, name):
        token = otel_context.attach(parent_context)  # as frameworks hand spans to threads
        try:
            with tracer.start_as_current_span(f"work-{name}"):
                pass
        finally:
            otel_context.detach(token)

    async def runner(ctx):
        with cobalt.span("outer", kind="agent"):
            thread = threading.Thread(
                target=worker, args=(otel_context.get_current(), ctx.item["input"])
            )
            thread.start()  # a plain thread: no copy of the item's context variables
            await asyncio.to_thread(thread.join)
        return "ok"

    (run,) = execute(project, define("threads", cities(10), runner, concurrency=10))
    for item in ItemResult.objects.filter(run=run):
        trace_ = stored_trace(item)
        assert [(s["name"], s["parent"]) for s in trace_] == [
            ("outer", None),
            (f"work-{item.input['input']}", 0),
        ]


def test_the_helpers_work_outside_a_run_and_refuse_an_unknown_kind():
    @cobalt.tool
    def add(a: int, b: int) -> int:
        return a + b

    with cobalt.span("outside", input="x") as step:
        step.output = add(2, b=3)
    assert step.output == 5
    with (
        pytest.raises(ValueError, match="kind must be one of llm, tool, agent"),
        cobalt.span("bad", kind="database"),
    ):
        pass


def anthropic_tool_loop(client: anthropic.Anthropic, city: str, rounds: int) -> str:
    """A plain Anthropic SDK tool loop (tool_use → tool_result) asking for `rounds` calls."""
    tools = [{"name": "get_weather", "input_schema": WEATHER_TOOL["function"]["parameters"]}]
    prompt = f'Weather? [[tool:{{"city": "{city}"}}]] [[tools:{rounds}]]'
    messages = [{"role": "user", "content": prompt}]
    while True:
        reply = client.messages.create(
            model="claude-3-5-haiku", max_tokens=100, messages=messages, tools=tools
        )
        uses = [block for block in reply.content if block.type == "tool_use"]
        if not uses:
            return reply.content[0].text
        messages.append({"role": "assistant", "content": [u.model_dump() for u in uses]})
        results = [
            {"type": "tool_result", "tool_use_id": u.id, "content": weather(**u.input)}
            for u in uses
        ]
        messages.append({"role": "user", "content": results})


def test_an_anthropic_tool_loop_is_traced_and_its_repeats_caught(project, fake_provider):
    client = anthropic.Anthropic()
    evaluators = [
        Evaluator("loops", "loops", max_repeats=2),
        Evaluator("budget", "steps", max_llm_calls=3),
        Evaluator("used", "tool-used", tool="get_weather"),
    ]

    def runner(ctx):
        return anthropic_tool_loop(client, ctx.item["input"], rounds=int(ctx.item["id"][-1]) + 1)

    (run,) = execute(project, define("claude", cities(3), runner, evaluators=evaluators))
    verdicts = {
        (key, name): score
        for key, name, score in Evaluation.objects.filter(run=run).values_list(
            "item__item_key", "evaluator", "score"
        )
    }
    for n in range(3):  # city-n asked for n + 1 tool calls in a row
        item = ItemResult.objects.get(run=run, item_key=f"city-{n}")
        trace = stored_trace(item)
        assert [s["kind"] for s in trace] == ["llm", "tool"] * (n + 1) + ["llm"]
        assert all(s["output"] == f"sunny in city{n}" for s in trace if s["kind"] == "tool")
        assert item.output == f"tool said: sunny in city{n}"
        assert verdicts[(f"city-{n}", "loops")] == (0.0 if n + 1 > 2 else 1.0)
        assert verdicts[(f"city-{n}", "budget")] == (0.0 if n + 2 > 3 else 1.0)
        assert verdicts[(f"city-{n}", "used")] == 1.0
