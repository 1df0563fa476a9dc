"""Tool stubs, faults, delays, state and budgets (`cobalt.stub`, `cobalt.state`, budgets),
in-process through the real engine; the agent is a plain Python loop over `@cobalt.tool`s."""

from __future__ import annotations

import time

import pytest

import cobalt
from cobalt import Dataset, Evaluator
from cobalt.config import ConfigError
from cobalt_app.models import ItemResult
from cobalt_app.trace_store import read_traces
from tests.helpers import define, execute_one

pytestmark = pytest.mark.django_db(transaction=True)

SERVER_CALLS: list[str] = []


@cobalt.tool
def search(q: str) -> list[dict]:
    SERVER_CALLS.append(q)
    return [{"title": f"live result for {q}"}]


def agent(ctx) -> str:
    try:
        found = search(ctx.item["input"])
    except Exception as exc:  # the agent's own recovery
        return f"sorry, search failed ({type(exc).__name__}: {exc})"
    return f"found: {found}"


def items(n: int = 2, **extra) -> list[dict]:
    return [{"id": f"q{i}", "input": f"question {i}", **extra} for i in range(n)]


def outputs(run) -> dict[str, ItemResult]:
    return {r.item_key: r for r in ItemResult.objects.filter(run=run).order_by("item_index")}


def test_a_tool_stub_answers_instead_of_the_tool_and_the_trace_marks_it(project):
    SERVER_CALLS.clear()
    stub = cobalt.stub("tool:search", returns=[{"title": "Refunds within 30 days"}])
    run = execute_one(
        project, define("stubbed", Dataset(items=items()), agent, intercept=[stub])
    )
    results = outputs(run)
    assert SERVER_CALLS == []
    for result in results.values():
        assert result.status == "ok", result.error
        assert "Refunds within 30 days" in result.output
        assert result.metadata["intercepted"] == {"stubbed": 1}
    traces = read_traces([r.id for r in results.values()])
    (step,) = traces[next(iter(results.values())).id].steps
    assert step["intercepted"] == "stubbed" and step["kind"] == "tool"
