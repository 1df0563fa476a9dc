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

    (run,) = execute(
        project,
        define(
            "thread",
            items(3),
            runner,
            evaluators=[Evaluator(name="watch", type="function", fn=watch)],
        ),
    )
    rows = {r.item_index: r for r in ItemResult.objects.filter(run=run)}
    found = verdicts(run)
    for index in range(3):
        name, latency, question = seen[index]
        assert name == threads[index] and name.startswith("cobalt-runner")
        assert latency == rows[index].latency_ms and question == f"q{index}"
        assert rows[index].status == "ok"
        assert (found[index, "watch"].score, found[index, "watch"].reason) == (0.25, "quarter")
    run.refresh_from_db()
    assert run.status == "completed" and run.finished_items == 3


async def later(value):
    return value


@pytest.mark.parametrize(
    ("fn", "score", "error"),
    [
        (lambda c: EvalResult(0.5, "half"), 0.5, ""),
        (lambda c: c.output == "yes", 1.0, ""),
        (lambda c: later(0.75), 0.75, ""),
        (lambda c: 1.5, None, "between 0 and 1"),
        (lambda c: 1 / 0, None, "the function raised ZeroDivisionError"),
        (lambda c: "great", None, "returned str"),
        (lambda c: sys.exit(3), None, "SystemExit(3): the evaluator raised it"),
    ],
)
def test_every_rule_of_an_evaluation_holds_on_the_runner_thread(project, fn, score, error):
    evaluators = [Evaluator(name="fn", type="function", fn=fn)]
    (run,) = execute(project, define("rules", items(1), lambda c: "yes", evaluators=evaluators))
    assert ItemResult.objects.get(run=run).status == "ok"
    found = verdicts(run)[0, "fn"]
    assert found.score == score
    assert (found.status, error in found.error) == (("error", True) if error else ("ok", True))


def test_a_slow_evaluator_on_the_runner_thread_times_out(project):
    def slow(ctx):
        time.sleep(3)  # the evaluator's own slowness, not a wait of the test
        return 1.0

    evaluators = [Evaluator(name="slow", type="function", fn=slow)]
    (run,) = execute(
        project, define("slow-eval", items(1), lambda c: "out", evaluators=evaluators, timeout=1)
    )
    assert ItemResult.objects.get(run=run).status == "ok"
    found = verdicts(run)
    assert found[0, "slow"].status == "error"
    assert found[0, "slow"].error.startswith("timed out after 1s (the evaluator was stopped")


def test_several_evaluators_of_a_sync_runner_still_run_beside_each_other(project):
    barrier = threading.Barrier(2, timeout=10)  # both inside their function at once

    def meet(ctx):
        barrier.wait()
        return EvalResult(score=1.0, reason=threading.current_thread().name)

    evaluators = [Evaluator(name=f"sync-{i}", type="function", fn=meet) for i in range(2)]
    (run,) = execute(project, define("beside", items(1), lambda c: "x", evaluators=evaluators))
    found = verdicts(run)
    assert [found[0, f"sync-{i}"].status for i in range(2)] == ["ok", "ok"]


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
