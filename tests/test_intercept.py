"""Tool stubs, faults, delays, state and budgets (`cobalt.stub`, `cobalt.state`, budgets),
in-process through the real engine; the agent is a plain Python loop over `@cobalt.tool`s,
or the OpenAI SDK against the fake provider where model calls are counted."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading

import openai
import pytest

import cobalt
from cobalt import Dataset, Evaluator
from cobalt.config import ConfigError
from cobalt.intercept import MALFORMED, parse_stub
from cobalt_app.models import ItemResult, Run
from cobalt_app.trace_store import read_traces
from tests.helpers import define, execute_one

pytestmark = pytest.mark.django_db(transaction=True)

CALLED: list[str] = []
_lock = threading.Lock()


@cobalt.tool
def search(q: str) -> list[dict]:
    with _lock:
        CALLED.append(q)
    return [{"title": f"live result for {q}"}]


def agent(ctx) -> str:
    try:
        found = search(ctx.item["input"])
    except Exception as exc:  # the agent's own recovery
        return f"sorry, search failed ({type(exc).__name__}: {exc})"
    return f"found: {found}"


def items(n: int = 2, **extra) -> list[dict]:
    return [{"id": f"q{i}", "input": f"question {i}", **extra} for i in range(n)]


def results(run: Run) -> dict[str, ItemResult]:
    return {r.item_key: r for r in ItemResult.objects.filter(run=run).order_by("item_index")}


def steps(result: ItemResult) -> list[dict]:
    return read_traces([result.id])[result.id].steps


def run_agent(project, runner=agent, data=None, **options) -> dict[str, ItemResult]:
    CALLED.clear()
    dataset = Dataset(items=data if data is not None else items())
    run = execute_one(project, define("intercepts", dataset, runner, **options))
    return results(run)


def test_a_tool_stub_answers_instead_of_the_tool_and_the_trace_marks_it(project, client):
    stub = cobalt.stub("tool:search", returns=[{"title": "Refunds within 30 days"}])
    found = run_agent(project, intercept=[stub])
    assert CALLED == []
    for result in found.values():
        assert result.status == "ok", result.error
        assert "Refunds within 30 days" in result.output
        assert result.metadata["intercepted"] == {"stubbed": 1}
        (step,) = steps(result)
        assert step["intercepted"] == "stubbed" and step["kind"] == "tool"
    run = next(iter(found.values())).run
    assert run.summary["intercepted"] == {"stubbed": 2}
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert re.search(r'id="run-intercepts".*2 stubbed', page, re.S)
    item = next(iter(found.values()))
    panel = client.get(f"/runs/{run.id}/items/{item.number}/").content.decode()
    assert 'class="tag intercepted stubbed"' in panel and "1 tool call, 1 stubbed" in panel


def test_an_items_fixtures_come_first_and_times_hands_back_to_the_real_tool(project):
    def twice(ctx):
        return [agent(ctx), agent(ctx)]

    data = [
        {
            "id": "down",
            "input": "a",
            "fixtures": [{"tool": "search", "raises": "down", "times": 1}],
        },
        {"id": "plain", "input": "b"},
    ]
    stub = cobalt.stub("tool:sea*", fn=lambda q: [{"title": f"stubbed {q}"}])
    found = run_agent(project, twice, data, intercept=[stub])
    first, second = found["down"].output
    assert first == "sorry, search failed (ToolError: down)"
    assert second == "found: [{'title': 'stubbed a'}]"  # the item's stub was used up
    assert found["plain"].output == ["found: [{'title': 'stubbed b'}]"] * 2
    assert found["down"].metadata["intercepted"] == {"injected": 1, "stubbed": 1}
    assert [s["status"] for s in steps(found["down"])] == ["error", "ok"]


def test_once_used_up_a_stub_lets_the_real_tool_run(project):
    found = run_agent(
        project, data=items(1), intercept=[cobalt.stub("tool:search", returns=1, times=1)]
    )
    assert found["q0"].output == "found: 1"
    assert CALLED == []


@pytest.mark.parametrize(
    ("declared", "expected"),
    [
        ({"raises": "search is down"}, "sorry, search failed (ToolError: search is down)"),
        ({"timeout": True, "delay": 0.05}, "sorry, search failed (TimeoutError: tool search "),
        ({"malformed": True}, f"found: {MALFORMED}"),
    ],
)
def test_each_fault_reaches_the_agent_and_is_marked_injected(project, declared, expected):
    found = run_agent(project, data=items(1), intercept=[cobalt.stub("tool:search", **declared)])
    result = found["q0"]
    assert result.output.startswith(expected), result.output
    assert result.metadata["intercepted"] == {"injected": 1}
    (step,) = steps(result)
    assert step["intercepted"] == "injected"
    if "delay" in declared:
        assert step["durationMs"] >= 50


def test_a_delay_is_waited_by_sync_and_async_tools(project):
    @cobalt.tool
    async def lookup(q: str) -> str:
        return "live"

    async def runner(ctx):
        return [await lookup("x"), search("y")]

    stubs = [
        cobalt.stub("tool:lookup", returns="slow async", delay=0.1),
        cobalt.stub("tool:search", returns="slow sync", delay=0.1),
    ]
    found = run_agent(project, runner, items(1), intercept=stubs)
    assert found["q0"].output == ["slow async", "slow sync"]
    assert [s["durationMs"] >= 100 for s in steps(found["q0"])] == [True, True]


def test_a_fixture_file_is_read_from_the_projects_fixtures_folder(project):
    project.write("fixtures/search/refunds.json", '[{"title": "Refund policy"}]')
    project.write("fixtures/note.txt", "plain text")
    data = [
        {
            "id": "json",
            "input": "a",
            "fixtures": [{"tool": "search", "fixture": "search/refunds.json"}],
        },
        {"id": "text", "input": "b", "fixtures": [{"tool": "search", "fixture": "note.txt"}]},
        {"id": "gone", "input": "c", "fixtures": [{"tool": "search", "fixture": "missing.json"}]},
    ]
    found = run_agent(project, data=data)
    assert found["json"].output == "found: [{'title': 'Refund policy'}]"
    assert found["text"].output == "found: plain text"
    assert found["gone"].status == "error"  # a mistake of the test, not the tool's failure
    assert "fixture file" in found["gone"].error and "does not exist" in found["gone"].error


def test_declarations_that_cannot_work_are_refused_naming_the_field():
    with pytest.raises(ConfigError, match="`status` is for HTTP route stubs"):
        cobalt.stub("tool:search", status=500)
    with pytest.raises(ConfigError, match="give only one of `returns`, `fixture`"):
        cobalt.stub("tool:search", returns=1, fixture="a.json")
    with pytest.raises(ConfigError, match="outside the project's fixtures/ folder"):
        cobalt.stub("tool:search", fixture="../../etc/passwd")
    with pytest.raises(ConfigError, match="`times` must be a whole number"):
        parse_stub({"route": "GET https://api.example.com/*", "times": 0}, "item #1")
    with pytest.raises(ConfigError, match="item #2: fixtures.0.: unknown field.*'retrns'"):
        define("bad", Dataset(items=[{"a": 1}, {"fixtures": [{"tool": "x", "retrns": 1}]}]), agent)
    route = parse_stub({"route": "GET https://api.example.com/search*", "status": 500}, "x")
    assert route.kind == "route" and route.mark == "injected"
    assert route.matches_route("get", "https://api.example.com/search?q=refund")
    assert not route.matches_route("POST", "https://api.example.com/search")


ORDERS = {"A1": {"status": "open", "total": 30}, "A2": {"status": "open", "total": 12}}


@cobalt.tool
def cancel_order(order_id: str) -> str:
    orders = cobalt.state()["orders"]
    if order_id not in orders:
        return f"no order {order_id}"
    orders[order_id]["status"] = "cancelled"
    return f"order {order_id} cancelled"


def test_each_item_has_its_own_state_and_the_state_evaluator_compares_the_final_one(project):
    def support(ctx):
        return cancel_order(ctx.item["cancel"])

    def expected(cancelled):
        return {
            "orders": {
                k: {**v, "status": "cancelled" if k == cancelled else "open"}
                for k, v in ORDERS.items()
            }
        }

    data = [
        {"id": "right", "cancel": "A1", "expected_state": expected("A1")},
        {"id": "wrong", "cancel": "A2", "expected_state": expected("A1")},
    ]
    found = run_agent(
        project,
        support,
        data,
        state=lambda item: {"orders": {k: dict(v) for k, v in ORDERS.items()}},
        evaluators=[Evaluator(name="did-it", type="state")],
    )
    right, wrong = found["right"], found["wrong"]
    assert right.metadata["state"]["orders"]["A1"]["status"] == "cancelled"
    assert right.metadata["state"]["orders"]["A2"]["status"] == "open"  # not the other item's
    (ok,) = right.evaluations.all()
    assert ok.score == 1.0, ok.reason
    (bad,) = wrong.evaluations.all()
    assert bad.score == 0.0
    assert 'state.orders.A1.status: expected "cancelled", got "open"' in bad.reason
    assert 'state.orders.A2.status: expected "open", got "cancelled"' in bad.reason


def test_cobalt_state_outside_a_stateful_experiment_says_how_to_declare_it(project):
    found = run_agent(project, lambda ctx: cancel_order("A1"), items(1))
    assert found["q0"].status == "error"
    assert "declared with `state=`" in found["q0"].error


def test_a_runaway_tool_loop_is_stopped_by_max_tool_calls(project):
    def runaway(ctx):
        while True:  # never stops by itself, and swallows errors
            with contextlib.suppress(Exception):
                search("again")

    found = run_agent(project, runaway, items(2), max_tool_calls=5, timeout=20)
    for result in found.values():
        assert result.status == "error"
        assert result.error.startswith(
            "budget exceeded: max_tool_calls=5 reached (5 tool calls made)"
        )
    assert len(CALLED) == 10
    run = next(iter(found.values())).run
    assert run.summary["budgetStopped"] == 2


def test_model_call_token_and_cost_budgets_stop_the_agent(project, fake_provider):
    client = openai.OpenAI()

    def chatty(ctx):
        replies = []
        for n in range(10):
            reply = client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": f"ECHO: turn {n}"}]
            )
            replies.append(reply.choices[0].message.content)
        return replies

    for budget, expected in [
        ({"max_llm_calls": 3}, "budget exceeded: max_llm_calls=3 reached (3 model calls made)"),
        ({"max_tokens": 1}, "budget exceeded: max_tokens=1 reached"),
        ({"max_cost": 0.0000001}, "budget exceeded: max_cost=$1e-07 reached"),
    ]:
        before = len(fake_provider.requests)
        found = run_agent(project, chatty, items(1), **budget)
        assert found["q0"].status == "error"
        assert found["q0"].error.startswith(expected), found["q0"].error
        sent = fake_provider.requests[before:]
        assert len(sent) == (3 if "max_llm_calls" in budget else 1)


def test_twenty_items_in_flight_each_get_their_own_stubs_counters_and_state(project):
    async def runner(ctx):
        seen = []
        for _ in range(3):
            await asyncio.sleep(0.01)  # the other items run meanwhile
            try:
                seen.append(search(ctx.item["input"]))
            except Exception as exc:
                seen.append(str(exc))
        cobalt.state()["calls"] += len(seen)
        return seen

    data = [
        {
            "id": f"i{n}",
            "input": f"q{n}",
            "fixtures": [{"tool": "search", "returns": n, "times": n % 3 + 1}],
        }
        for n in range(20)
    ]
    found = run_agent(
        project,
        runner,
        data,
        intercept=[cobalt.stub("tool:search", raises="fallback")],
        state=lambda item: {"calls": 0, "who": item["id"]},
        concurrency=20,
    )
    for n in range(20):
        result = found[f"i{n}"]
        answered = n % 3 + 1
        assert result.output == [n] * answered + ["fallback"] * (3 - answered)
        assert result.metadata["state"] == {"calls": 3, "who": f"i{n}"}


def test_the_intercepted_evaluator_counts_calls_with_arguments_matching(project):
    def runner(ctx):
        return [search("refund policy"), search("shipping"), search("refund window")]

    evaluators = [
        Evaluator(
            name="searched-refund",
            type="intercepted",
            tool="search",
            arguments={"q": "refund*"},
            times=2,
        ),
        Evaluator(name="at-most-one", type="intercepted", tool="search", max=1),
        Evaluator(name="route", type="intercepted", route="GET https://api.example.com/*"),
    ]
    found = run_agent(
        project,
        runner,
        items(1),
        evaluators=evaluators,
        intercept=[cobalt.stub("tool:search", returns=[])],
    )
    scores = {e.evaluator: e for e in found["q0"].evaluations.all()}
    assert scores["searched-refund"].score == 1.0, scores["searched-refund"].reason
    assert scores["at-most-one"].score == 0.0
    assert "called 3 time(s) (wanted exactly 1)" in scores["at-most-one"].reason
    assert scores["route"].score == 0.0
    assert "no call of it in the trace" in scores["route"].reason


def test_a_route_stub_builds_the_response_the_transports_send():
    from cobalt_app.intercepts import route_answer

    answer = route_answer(cobalt.stub("GET https://api.example.com/*", returns={"hits": 1}))
    assert (answer.status, answer.content) == (200, b'{"hits": 1}')
    assert answer.headers["content-type"] == "application/json"
    down = route_answer(cobalt.stub("GET https://api.example.com/*", status=503, body="down"))
    assert (down.status, down.content, down.headers["content-type"]) == (503, b"down", "text/plain")
    slow = route_answer(cobalt.stub("* https://api.example.com/*", timeout=True, delay=0.2))
    assert slow.timeout and slow.delay == 0.2
    broken = route_answer(cobalt.stub("GET https://api.example.com/*", malformed=True))
    assert broken.content == MALFORMED.encode()
    by_fn = route_answer(
        cobalt.stub("POST https://api.example.com/*", fn=lambda r: {"got": r}), "rq"
    )
    assert by_fn.content == b'{"got": "rq"}'
