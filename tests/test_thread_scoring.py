"""A sync runner's sync function evaluators are scored by the runner's own thread (one
hand-over per item, `cobalt_app.thread_scoring`), with every rule of `evaluate()` kept."""

import asyncio
import sys
import threading
import time

import pytest

from cobalt import Dataset, EvalResult, Evaluator
from cobalt_app.engine import NOTHING_RETURNED
from cobalt_app.models import Evaluation, ItemResult
from tests.helpers import define, execute

pytestmark = pytest.mark.django_db(transaction=True)


def items(n):
    return Dataset(items=[{"id": f"item-{i}", "input": f"q{i}"} for i in range(n)])


def verdicts(run):
    return {
        (e.item.item_index, e.evaluator): e
        for e in Evaluation.objects.filter(run=run).select_related("item")
    }


def test_the_runner_thread_scores_the_item_with_every_rule_of_an_evaluation(project):
    threads, seen = {}, {}

    def runner(ctx):
        threads[ctx.index] = threading.current_thread().name
        return {"output": "yes", "metadata": {"flag": ctx.index}}

    def watch(ctx):
        seen[ctx.metadata["flag"]] = (threading.current_thread().name, ctx.latency_ms, ctx.input)
        return {"score": 0.25, "reason": "quarter"}

    async def later(value):
        return value

    evaluators = [
        Evaluator(name="watch", type="function", fn=watch),
        Evaluator(name="result", type="function", fn=lambda c: EvalResult(0.5, "half")),
        Evaluator(name="bool", type="function", fn=lambda c: c.output == "yes"),
        Evaluator(name="range", type="function", fn=lambda c: 1.5),
        Evaluator(name="raises", type="function", fn=lambda c: 1 / 0),
        Evaluator(name="junk", type="function", fn=lambda c: "great"),
        Evaluator(name="exits", type="function", fn=lambda c: sys.exit(3)),
        Evaluator(name="awaitable", type="function", fn=lambda c: later(0.75)),
    ]
    (run,) = execute(project, define("thread", items(3), runner, evaluators=evaluators))
    rows = {r.item_index: r for r in ItemResult.objects.filter(run=run)}
    found = verdicts(run)
    for index in range(3):
        name, latency, question = seen[index]
        assert name == threads[index] and name.startswith("cobalt-runner")
        assert latency == rows[index].latency_ms and question == f"q{index}"
        assert rows[index].status == "ok"
        assert (found[index, "watch"].score, found[index, "watch"].reason) == (0.25, "quarter")
        assert (found[index, "result"].score, found[index, "result"].reason) == (0.5, "half")
        assert found[index, "bool"].score == 1.0
        assert found[index, "awaitable"].score == 0.75
        for evaluator, message in (
            ("range", "between 0 and 1"),
            ("raises", "the function raised ZeroDivisionError"),
            ("junk", "returned str"),
            ("exits", "SystemExit(3): the evaluator raised it"),
        ):
            assert found[index, evaluator].status == "error"
            assert found[index, evaluator].score is None
            assert message in found[index, evaluator].error
    run.refresh_from_db()
    assert run.status == "completed" and run.finished_items == 3


def test_a_slow_evaluator_times_out_and_those_after_it_are_still_scored(project):
    def slow(ctx):
        time.sleep(3)  # the evaluator's own slowness, not a wait of the test
        return 1.0

    evaluators = [
        Evaluator(name="quick", type="function", fn=lambda c: 0.5),
        Evaluator(name="slow", type="function", fn=slow),
        Evaluator(name="after", type="function", fn=lambda c: 0.25),
    ]
    (run,) = execute(
        project, define("slow-eval", items(1), lambda c: "out", evaluators=evaluators, timeout=1)
    )
    assert ItemResult.objects.get(run=run).status == "ok"
    found = verdicts(run)
    assert found[0, "quick"].score == 0.5
    assert found[0, "slow"].status == "error"
    assert found[0, "slow"].error.startswith("timed out after 1s (the evaluator was stopped")
    assert found[0, "after"].score == 0.25


def test_items_whose_runner_gave_no_storable_output_are_not_scored_by_its_thread(project):
    called = []

    def runner(ctx):
        if ctx.index == 0:
            return None
        if ctx.index == 1:
            raise ValueError("the agent broke")
        if ctx.index == 2:
            return {"output": "x", "metadata": {"cost": float("nan")}}
        if ctx.index == 3:
            time.sleep(3)  # the agent's own slowness: past its timeout
        return "fine"

    def record(ctx):
        called.append(ctx.output)
        return 1.0

    evaluators = [Evaluator(name="fn", type="function", fn=record)]
    (run,) = execute(
        project, define("unscored", items(5), runner, evaluators=evaluators, timeout=1)
    )
    rows = {r.item_index: r for r in ItemResult.objects.filter(run=run)}
    found = verdicts(run)
    assert rows[0].status == "ok" and found[0, "fn"].error == NOTHING_RETURNED
    assert rows[1].status == "error" and (1, "fn") not in found
    assert rows[2].status == "error" and "could not be stored" in rows[2].error
    assert (2, "fn") not in found
    assert rows[3].status == "timeout" and (3, "fn") not in found
    assert rows[4].status == "ok" and found[4, "fn"].score == 1.0
    assert "fine" in called and None not in called


def test_an_async_runner_keeps_its_evaluators_on_their_own_threads(project):
    names = []

    async def runner(ctx):
        await asyncio.sleep(0)
        return "out"

    def record(ctx):
        names.append(threading.current_thread().name)
        return 1.0

    evaluators = [Evaluator(name="fn", type="function", fn=record)]
    execute(project, define("async-runner", items(2), runner, evaluators=evaluators))
    assert len(names) == 2 and all(n.startswith("cobalt-eval") for n in names)
