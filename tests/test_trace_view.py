"""Traces you can read (issue 37), rendered by the server: a real tool-using agent (the OpenAI
SDK against the fake provider, inside a `cobalt.span` of its own) and a real LLM judge, run
in-process; the item page shows messages by role, tool calls as `name(args)`, the tools
folded, a time axis, a tree with branch totals, the failing step, and the judge's call."""

from __future__ import annotations

import html
import json
import re
import time

import pytest
from django.test import Client

import cobalt
from cobalt import Dataset, Evaluator
from cobalt_app import page_trace, storable, trace_messages
from cobalt_app.models import Evaluation, ItemResult, JudgeCall
from tests.helpers import define, execute

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "sk-test-openai-SECRET-0001"  # the fake provider's key in the environment (conftest)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} of a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    for name in ("get_weather", "get_time", "get_news", "get_map")
]


def weather(city: str) -> str:
    if city == "Atlantis":
        raise RuntimeError("no weather station in Atlantis")
    return f"sunny in {city}"


def agent(ctx) -> str:
    """An OpenAI SDK tool loop inside a span of its own: the tree's parent."""
    import openai

    client = openai.OpenAI()
    city = ctx.item["input"]
    prompt = f'Weather in {city}? [[tool:{{"city": "{city}"}}]]'
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": prompt},
    ]
    with cobalt.span("support-agent", kind="agent", input=city):
        while True:
            reply = client.chat.completions.create(
                model="gpt-4o-mini", messages=messages, tools=TOOLS, tool_choice="auto"
            )
            message = reply.choices[0].message
            if not message.tool_calls:
                return f"{message.content} (key {KEY})"  # a secret the judge will read
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                result = weather(**json.loads(call.function.arguments))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})


JUDGE = Evaluator(name="judge", prompt="Is this a good answer? {{output}} [[score:0.8]]")


@pytest.fixture
def client() -> Client:
    return Client(HTTP_HOST="127.0.0.1")


@pytest.fixture
def run(project, fake_provider):
    items = Dataset(
        items=[{"id": "paris", "input": "Paris"}, {"id": "atlantis", "input": "Atlantis"}]
    )
    (done,) = execute(project, define("weather", items, agent, evaluators=[JUDGE]))
    return done


def trace_section(page: str) -> str:
    return page[page.index('<section id="item-trace"') : page.index("</section>")]


def test_a_model_call_reads_as_messages_by_role_with_its_tools_folded(run, client):
    item = ItemResult.objects.get(run=run, item_key="paris")
    page = client.get(f"/runs/{run.id}/items/{item.number}/").content.decode()
    trace = trace_section(page)
    roles = re.findall(r'<li class="message message-(\w+)">', trace)
    assert roles[:3] == ["system", "user", "assistant"]  # the first call and its reply
    assert "tool" in roles  # the second call carries the tool's result
    assert '<pre class="call">get_weather(city=&quot;Paris&quot;)</pre>' in trace
    assert trace.count("<summary>4 tools defined</summary>") == 2  # folded, once per call
    assert "The get_time of a city." in trace  # inside the fold
    assert '<pre class="output" dir="auto">sunny in Paris</pre>' in trace  # the tool's result
    assert "{&quot;messages&quot;: [" not in trace  # never one line of raw JSON
    assert "tool said: sunny in Paris" in trace  # the answer, as the assistant's message


def test_steps_sit_in_their_parents_branch_with_offsets_and_totals(run, client):
    item = ItemResult.objects.get(run=run, item_key="paris")
    page = client.get(f"/runs/{run.id}/items/{item.number}/").content.decode()
    trace = trace_section(page)
    # The agent span holds the three steps: its <details> opens a nested list.
    agent_row = trace[trace.index('id="step-1"') : trace.index('id="step-2"')]
    assert "support-agent" in agent_row and '<ol class="timeline tree">' in agent_row
    assert trace.index('<ol class="timeline tree">') < trace.index('id="step-4"')
    assert trace.count("</ol></details></li>") == 1  # the branch closes once, after step 4
    # Its tokens are its branch's: both model calls.
    usage = [int(n.replace(",", "")) for n in re.findall(r">([\d,]+) tok<", trace)]
    assert len(usage) == 3 and usage[0] == usage[1] + usage[2] and usage[1] > 0
    # Offsets read as the page writes them: 420ms, or 1.2s on a slow machine.
    offsets = [
        float(number) * (1 if unit == "ms" else 1000)
        for number, unit in re.findall(r'<span class="step-at"[^>]*>\+([\d.]+)(ms|s)</span>', trace)
    ]
    assert len(offsets) == 4 and offsets == sorted(offsets)
    assert re.search(r'id="trace-totals">[\d.]+m?s in all</p>', trace)
    assert "failed here" not in trace


def test_the_step_where_the_item_failed_is_marked_and_open(run, client):
    item = ItemResult.objects.get(run=run, item_key="atlantis")
    page = client.get(f"/runs/{run.id}/items/{item.number}/").content.decode()
    trace = trace_section(page)
    # The agent span the exception crossed failed; the tool call it never got back from is
    # where: marked, with the item's error.
    assert '<li class="step step-agent step-error" id="step-1">' in trace
    failing = re.search(r'<li class="step step-tool step-failed" id="step-(\d+)">', trace)
    number = failing.group(1)
    assert (
        f'<a class="bad" href="/runs/{run.id}/items/{item.number}/#step-{number}">failed at step {number}</a>'
        in trace
    )
    row = trace[failing.start() :]
    assert row.split("<summary>", 1)[0].endswith("<details open>\n    ")  # open on load
    assert '<span class="bad failed-mark">failed here</span>' in row
    assert "RuntimeError: no weather station in Atlantis" in row


def test_the_last_step_is_marked_when_only_the_item_failed():
    steps = [
        {"name": "chat", "kind": "llm", "parent": None, "startMs": 0.0, "durationMs": 5.0},
        {"name": "lookup", "kind": "tool", "parent": None, "startMs": 6.0, "durationMs": None},
    ]
    page = page_trace.trace_page(steps, item_error="KeyError: 'city'")
    assert (page.failed, page.failed_page, page.total_ms) == (2, 1, 6.0)
    assert page.rows[1]["failed_here"] and page.rows[1]["error"] == "KeyError: 'city'"
    assert page.rows[1]["open"] and not page.rows[0]["open"]
    assert page_trace.trace_page(steps).failed is None


def test_a_tree_opens_on_its_first_two_levels():
    def step(name: str, parent: int | None, start: float) -> dict:
        return {"name": name, "kind": "other", "parent": parent, "startMs": start, "durationMs": 1}

    # request > agent > tool > http, and a model call under the agent
    steps = [step("POST /ask", None, 0), step("agent", 0, 1), step("lookup", 1, 2)]
    steps += [step("GET db", 2, 3), step("chat", 1, 4)]
    opened = [row["open"] for row in page_trace.trace_page(steps).rows]
    # The request and the agent show their children; the tool's branch and the leaves stay
    # folded (a leaf's "open" would spill its input and output).
    assert opened == [True, True, False, False, False]


def test_the_judges_call_is_shown_under_its_score_without_secrets(run, client):
    item = ItemResult.objects.get(run=run, item_key="paris")
    evaluation = Evaluation.objects.get(item=item, evaluator="judge")
    assert evaluation.score == 0.8
    stored = JudgeCall.objects.get(item=item, evaluator="judge").data
    assert KEY not in json.dumps(stored)  # redacted before it reached the database
    (turn,) = stored["calls"]
    assert "Is this a good answer? tool said: sunny in Paris (key ***)" in turn["prompt"]
    assert json.loads(turn["reply"])["score"] == 0.8
    page = client.get(f"/runs/{run.id}/items/{item.number}/").content.decode()
    verdicts = page[page.index('<table class="verdicts">') : page.index("</table>")]
    call = verdicts[verdicts.index('<details class="judge-call">') :]
    assert "<summary>Show judge call</summary>" in call and "<code>gpt-4o-mini</code>" in call
    assert re.findall(r'<li class="message message-(\w+)">', call) == [
        "system",
        "user",
        "assistant",
    ]
    assert "(key ***)" in call and KEY not in page
    assert "&quot;score&quot;: 0.8" in call


def test_a_cached_evaluation_shows_the_call_that_produced_it(project, fake_provider, client):
    items = Dataset(items=[{"id": "a", "input": "x"}])
    experiment = define("cached", items, lambda ctx: "four", evaluators=[JUDGE])
    first, second = (execute(project, experiment)[0] for _ in range(2))
    assert fake_provider.request_count() == 1  # the second run's judge answered from the cache
    evaluation = Evaluation.objects.get(run=second)
    assert evaluation.cached and evaluation.tokens == 0
    assert (
        JudgeCall.objects.get(item=evaluation.item).data
        == JudgeCall.objects.get(item__run=first).data
    )
    page = client.get(f"/runs/{second.id}/items/{evaluation.item.number}/").content.decode()
    assert "Show judge call" in page and "Is this a good answer? four" in page


def test_the_api_item_detail_carries_the_judges_call(run, client):
    item = ItemResult.objects.get(run=run, item_key="paris")
    detail = client.get(f"/api/runs/{run.id}/items/{item.number}/").json()
    assert detail["id"] == item.id and detail["key"] == "paris"
    call = detail["evaluations"]["judge"]["judgeCall"]
    assert call["model"] == "gpt-4o-mini" and call["calls"][0]["prompt"].startswith("Is this")
    assert [s["kind"] for s in detail["trace"]] == ["agent", "llm", "tool", "llm"]
    missing = client.get(f"/api/runs/{run.id}/items/99/")
    assert missing.status_code == 404 and "has no item" in missing.json()["detail"]


def test_the_item_panel_reads_judge_calls_only_for_judged_items(
    run, client, django_assert_num_queries
):
    item = ItemResult.objects.get(run=run, item_key="paris")
    # run, item and its trace, evaluations, judge calls, the run's item count (its neighbours)
    with django_assert_num_queries(5):
        client.get(f"/runs/{run.id}/items/{item.number}/", HTTP_HX_REQUEST="true")
    failed = ItemResult.objects.get(run=run, item_key="atlantis")  # not evaluated
    with django_assert_num_queries(4):
        client.get(f"/runs/{run.id}/items/{failed.number}/", HTTP_HX_REQUEST="true")


def test_a_judge_call_is_capped_and_redacted_when_stored():
    call = {
        "provider": "openai",
        "model": "m",
        "system": "s",
        "calls": [{"prompt": f"token={KEY} " + "p" * 20_000, "reply": "r" * 10}],
    }
    kept = storable.judge_call(call)
    (turn,) = kept["calls"]
    assert len(turn["prompt"]) == storable.JUDGE_CALL_CHARS["prompt"]
    assert turn["promptChars"] == 20_000 + len(f"token={KEY} ")
    assert KEY not in turn["prompt"] and turn["reply"] == "r" * 10 and "replyChars" not in turn
    assert storable.judge_call(kept) == kept  # idempotent
    assert storable.judge_call("not a call") is None


def test_a_cut_model_call_still_reads_as_messages():
    request = json.dumps(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "x" * 500},
            ]
        }
    )
    cut = request[:120] + trace_messages.CUT
    step = {"kind": "llm", "name": "chat", "input": cut, "output": None}
    shown = trace_messages.view(step)
    assert [m.role for m in shown.messages] == ["system", "user"] and shown.cut
    assert shown.messages[1].text.startswith("xxx") and not shown.input_text


def test_anthropic_and_genai_shapes_read_as_messages():
    anthropic = trace_messages.view(
        {
            "kind": "llm",
            "input": json.dumps(
                {
                    "system": "Be brief.",
                    "messages": [
                        {"role": "user", "content": "Weather?"},
                        {"role": "user", "content": [{"type": "tool_result", "content": "sunny"}]},
                    ],
                    "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
                }
            ),
            "output": json.dumps(
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "name": "get_weather", "input": {"city": "Oslo"}}
                    ],
                }
            ),
        }
    )
    assert [(m.role, m.text) for m in anthropic.messages] == [
        ("system", "Be brief."),
        ("user", "Weather?"),
        ("tool", "sunny"),
    ]
    assert anthropic.reply[0].calls == ['get_weather(city="Oslo")']
    assert [t.name for t in anthropic.tools] == ["get_weather"]
    genai = trace_messages.view(
        {
            "kind": "llm",
            "input": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "Hi"}]}]),
            "output": "plain words",
        }
    )
    assert [(m.role, m.text) for m in genai.messages] == [("user", "Hi")]
    assert genai.output_text == "plain words"
    tool = trace_messages.view(
        {"kind": "tool", "name": "search", "input": json.dumps({"q": "a" * 90})}
    )
    assert tool.call == f'search(\n    q="{"a" * 90}",\n)'


def test_agent_text_stays_escaped_in_messages_and_calls(client, run):
    item = ItemResult.objects.get(run=run, item_key="paris")
    page = html.unescape(client.get(f"/runs/{run.id}/items/{item.number}/").content.decode())
    assert "<script>" not in page.split("</head>", 1)[1].replace('<script src="', "")


def test_a_trace_of_5000_steps_renders_a_page_quickly():
    steps = []
    for n in range(5000):
        kind = "llm" if n % 2 else "tool"
        steps.append(
            {
                "name": "chat" if kind == "llm" else "search",
                "kind": kind,
                "parent": 0 if n else None,
                "startMs": float(n),
                "durationMs": 1.0,
                "inputTokens": 3 if kind == "llm" else None,
                "outputTokens": 2 if kind == "llm" else None,
                "cost": 0.001 if kind == "llm" else None,
                "status": "ok",
                "input": json.dumps({"messages": [{"role": "user", "content": f"q{n}"}]}),
                "output": "done",
            }
        )
    started = time.perf_counter()
    page = page_trace.trace_page(steps, 50)
    took = time.perf_counter() - started
    assert [r["number"] for r in page.rows][:2] == [4901, 4902] and page.pages == 50
    assert page.rows[-1]["closes"] == [False]  # its parent is on page 1: top level here
    assert took < 0.5, f"{took:.3f}s"
    first = page_trace.trace_page(steps, 1)
    assert first.rows[0]["branch_tokens"] == 2500 * 5 and first.rows[0]["has_children"]


REJUDGED = """
from cobalt import Dataset, Evaluator, experiment

@experiment("rejudged", Dataset(items=[{"id": "a", "input": "x"}]), evaluators=[
    Evaluator(name="kept", prompt="Kept? {{output}} [[score:0.7]]"),
    Evaluator(name="again", prompt="Again? {{output}} [[score:0.6]]"),
])
def run(ctx):
    return "four"
"""


def test_a_rejudge_keeps_the_calls_of_the_judges_it_did_not_run_again(project, cobalt_cli):
    import sqlite3

    from tests.helpers import run_id_of

    project.write("experiments/rejudged.cobalt.py", REJUDGED)
    first = run_id_of(cobalt_cli(project, "run", "experiments/rejudged.cobalt.py"))
    again = run_id_of(cobalt_cli(project, "rejudge", first, "--evaluator", "again"))
    with sqlite3.connect(project.db_path) as db:
        rows = db.execute(
            "SELECT i.run_id, c.evaluator, c.data FROM cobalt_app_judgecall c "
            "JOIN cobalt_app_itemresult i ON i.id = c.item_id ORDER BY i.run_id, c.evaluator"
        ).fetchall()
    calls = {(run, name): json.loads(data)["calls"][0]["prompt"] for run, name, data in rows}
    assert calls[(again, "kept")] == calls[(first, "kept")]  # copied with its verdict
    assert calls[(again, "again")].startswith("Again? four")  # its own, judged again


def test_the_api_item_detail_needs_a_login_in_team_mode(run, client, settings):
    item = ItemResult.objects.get(run=run, item_key="paris")
    settings.TEAM_MODE = True
    assert client.get(f"/api/runs/{run.id}/items/{item.number}/").status_code == 401


def test_the_production_trace_page_shows_the_same_tree(client):
    from cobalt_app.models import ReceivedSpan, ReceivedTrace

    trace = ReceivedTrace.objects.create(
        trace_id="ab" * 16, service="weather-agent", name="agent", status="error"
    )

    def span(span_id: str, parent: str, at_ms: int, **step) -> None:
        base = {"kind": "other", "durationMs": 5.0, "status": "ok", "input": None, "output": None}
        ReceivedSpan.objects.create(
            trace=trace,
            span_id=span_id,
            parent_span_id=parent,
            start_ns=1_000_000_000 + at_ms * 1_000_000,
            step={**base, **step},
        )

    span("a1", "", 0, name="agent", kind="agent", durationMs=30.0, status="error", error="boom")
    span(
        "b2",
        "a1",
        2,
        name="chat",
        kind="llm",
        input=json.dumps([{"role": "user", "content": "<b>hi</b>"}]),
    )
    span("c3", "a1", 20, name="lookup", kind="tool", input='{"q": 1}', status="error", error="boom")
    page = client.get(f"/traces/{trace.trace_id}/").content.decode()
    assert '<ol class="timeline tree">' in page  # the agent holds its two steps
    assert '<li class="message message-user">' in page and "&lt;b&gt;hi&lt;/b&gt;" in page
    assert '<li class="step step-tool step-error step-failed" id="step-3">' in page
    assert '<pre class="call">lookup(q=1)</pre>' in page
    assert f'href="/traces/{trace.trace_id}/#step-3">failed at step 3</a>' in page
