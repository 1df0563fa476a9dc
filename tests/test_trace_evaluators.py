"""Evaluators that read the trace: steps, tool-errors, loops, tool-used/tool-not-used,
tool-calls and trajectory without metadata, `{{trace}}` in judge prompts."""

from __future__ import annotations

import asyncio
import json

import pytest

import cobalt
from cobalt import Dataset, Evaluator
from cobalt_app.evaluators import EvalOutcome, EvalTarget, evaluate
from cobalt_app.models import Evaluation
from tests.helpers import define, execute


def step(kind: str, name: str, *, parent=None, status="ok", error=None, input=None, **extra):
    return {
        "name": name,
        "kind": kind,
        "parent": parent,
        "startMs": 0.0,
        "durationMs": 1.0,
        "model": extra.get("model"),
        "inputTokens": extra.get("inputTokens"),
        "outputTokens": extra.get("outputTokens"),
        "cost": None,
        "status": status,
        "error": error,
        "input": input,
        "output": extra.get("output"),
    }


def tool(name: str, arguments: dict, **kwargs):
    return step("tool", name, input=json.dumps(arguments), **kwargs)


TRACE = [
    step("agent", "support-agent"),
    step("llm", "chat gpt-4o", parent=0, model="gpt-4o"),
    step("llm", "ChatCompletion", parent=1, model="gpt-4o"),  # the SDK's span inside
    tool("search", {"q": "refund"}, parent=0),
    step("llm", "chat gpt-4o", parent=0, model="gpt-4o"),
    tool("search", {"q": "refund"}, parent=0),
    tool("search", {"q": "refund"}, parent=0),
    tool("lookup_order", {"id": 7}, parent=0, status="error", error="KeyError: 7"),
    step("llm", "chat gpt-4o", parent=0, model="gpt-4o"),
]


def check(evaluator: Evaluator, trace=TRACE, item=None, metadata=None) -> EvalOutcome:
    target = EvalTarget(item or {"input": "q"}, "answer", metadata or {}, trace=trace)
    return asyncio.run(evaluate(evaluator, target, None))


def scored(evaluator: Evaluator, **kwargs) -> tuple[float, str]:
    outcome = check(evaluator, **kwargs)
    assert outcome.status == "ok", outcome.error
    return outcome.score, outcome.reason


def test_steps_counts_each_model_call_once_and_every_tool_call():
    assert scored(Evaluator("s", "steps", max_llm_calls=3, max_tool_calls=4)) == (
        1.0,
        "3 model calls and 4 tool calls, within budget",
    )
    assert scored(Evaluator("s", "steps", max_llm_calls=2)) == (
        0.0,
        "over budget: 3 model calls (at most 2)",
    )
    assert scored(Evaluator("s", "steps", max_tool_calls=3))[0] == 0.0


def test_steps_needs_a_budget_and_a_trace():
    assert "needs `max_llm_calls=`" in check(Evaluator("s", "steps")).error
    outcome = check(Evaluator("s", "steps", max_llm_calls=1), trace=[])
    assert outcome.status == "error" and "the trace holds no step" in outcome.error


def test_tool_errors_scores_the_share_that_did_not_fail():
    score, reason = scored(Evaluator("e", "tool-errors"))
    assert score == pytest.approx(0.75)
    assert reason == "1 of 4 tool calls failed (first: lookup_order: KeyError: 7)"
    assert scored(Evaluator("e", "tool-errors", threshold=0.9))[0] == 0.0
    assert scored(Evaluator("e", "tool-errors"), trace=TRACE[:3]) == (1.0, "no tool was called")


def test_loops_catches_the_same_call_repeated_in_a_row():
    # Three searches for "refund" in a row (the model calls between them do not break it).
    assert scored(Evaluator("l", "loops")) == (
        0.0,
        "search was called 3 times in a row with the same arguments (at most 2 allowed)",
    )
    assert scored(Evaluator("l", "loops", max_repeats=3))[0] == 1.0
    different = [tool("search", {"q": n}) for n in ("a", "b", "a")]
    assert scored(Evaluator("l", "loops", max_repeats=1), trace=different)[0] == 1.0


def test_tool_used_and_not_used():
    assert scored(Evaluator("u", "tool-used", tool="lookup_order")) == (
        1.0,
        "called: lookup_order",
    )
    assert scored(Evaluator("u", "tool-used", tool=["search", "refund"])) == (
        0.0,
        "not called: refund (called: lookup_order, search)",
    )
    assert scored(Evaluator("n", "tool-not-used", tool="delete_account")) == (
        1.0,
        "not called: delete_account",
    )
    assert scored(Evaluator("n", "tool-not-used", tool="search")) == (
        0.0,
        "called although it should not: search (3×)",
    )
    assert "needs `tool=`" in check(Evaluator("n", "tool-used")).error


def test_tool_calls_reads_the_trace_and_metadata_still_wins():
    expected = {"expected_tool_calls": [{"name": "search"}, {"name": "lookup_order"}]}
    evaluator = Evaluator("t", "tool-calls", mode="superset")
    assert scored(evaluator, item=expected)[0] == 1.0
    strict = Evaluator("t", "tool-calls", mode="strict", match_arguments="ignore")
    assert scored(strict, item=expected)[0] == 0.0  # four calls, not two
    reported = {"tool_calls": [{"name": "search"}, {"name": "lookup_order"}]}
    assert scored(strict, item=expected, metadata=reported)[0] == 1.0


@pytest.mark.django_db(transaction=True)
def test_judges_see_the_trace(project, fake_provider):
    @cobalt.tool
    def lookup_order(id: int) -> dict:
        raise KeyError(id)

    def runner(ctx):
        with cobalt.span("support-agent", kind="agent"):
            with pytest.raises(KeyError):
                lookup_order(7)
            for _ in range(2):
                search(q="refund")
        return "answer"

    @cobalt.tool
    def search(q: str) -> str:
        return "policy"

    prompt = "Did the agent work well? Steps:\n{{trace}}\n[[score:0.4]]"
    evaluators = [
        Evaluator("judge", "llm-judge", prompt=prompt),
        Evaluator("trajectory", "trajectory"),
    ]
    definition = define(
        "judged", Dataset(items=[{"input": "refund?"}]), runner, evaluators=evaluators
    )
    (run,) = execute(project, definition, no_cache=True)
    verdicts = dict(Evaluation.objects.filter(run=run).values_list("evaluator", "score"))
    assert verdicts["judge"] == 0.4
    bodies = [json.dumps(r["json"]) for r in fake_provider.requests if "json" in r]
    judge = next(b for b in bodies if "Did the agent work well" in b)
    assert "[agent] support-agent\\n  [tool] lookup_order input={" in judge
    assert "error=KeyError: 7" in judge
    trajectory = next(b for b in bodies if "grading an AI agent's trajectory" in b)
    assert "lookup_order({" in trajectory and "search({" in trajectory
