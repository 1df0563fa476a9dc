"""An async runner's items are scored by their sync function evaluator on a thread in
batches (`cobalt_app.batch_scoring`): the same verdicts as a sync runner's items get, an
evaluator that blocks or fails spares its neighbours. Real in-process runs over SQLite."""

import asyncio
import math
import sys
import threading
import time

import pytest

from cobalt import Dataset, Evaluator
from cobalt_app import aio
from cobalt_app.models import Run
from tests.helpers import define, execute
from tests.test_sync_items import rows, verdicts

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def items(n):
    return Dataset(items=[{"id": f"item-{i}", "input": f"q{i}"} for i in range(n)])


def batch_of_caller():
    """The batch (`_Batch`) whose thread runs the calling evaluator, or None."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_qualname == "_Batch._work":
            return frame.f_locals["self"]
        frame = frame.f_back
    return None


async def answer(ctx):
    return {"output": f"answer {ctx.index}", "metadata": {"n": ctx.index}}


def test_quick_items_are_scored_several_to_a_batch_with_what_they_returned(project):
    batches, seen = {}, {}

    def check(ctx):
        batch = batch_of_caller()
        batches.setdefault(batch, []).append(ctx.item["id"])
        seen[ctx.item["id"]] = (ctx.output, ctx.metadata, ctx.latency_ms is not None)
        return 0.5 if ctx.output.endswith("7") else 1.0

    fn = Evaluator(name="fn", type="function", fn=check)
    (run,) = execute(project, define("quick", items(60), answer, evaluators=[fn], concurrency=10))
    assert None not in batches  # each scored inside a batch
    assert max(len(scored) for scored in batches.values()) > 1
    assert seen["item-3"] == ("answer 3", {"n": 3}, True)
    expected = {(i, "fn"): ("ok", 0.5 if i % 10 == 7 else 1.0, "") for i in range(60)}
    assert verdicts(run) == expected
    run.refresh_from_db()
    assert run.status == "completed" and run.finished_items == 60


def mistaken(ctx):
    """A verdict per item: each way an evaluator can fail, and good ones around them."""
    index = int(ctx.item["id"].split("-")[1])
    if index == 1:
        raise ValueError("bad verdict")
    if index == 2:
        sys.exit(3)
    if index == 3:
        return math.nan
    if index == 4:
        return "high"
    if index == 5:
        return {"score": 0.25, "reason": "a quarter"}
    if index == 6:

        async def later():
            return 0.75

        return later()
    return 1.0


def test_an_evaluator_failing_inside_a_batch_gets_the_verdict_a_sync_runner_would(project):
    fn = Evaluator(name="fn", type="function", fn=mistaken)

    def sync_answer(ctx):
        return {"output": f"answer {ctx.index}", "metadata": {"n": ctx.index}}

    (batched,) = execute(project, define("batched", items(10), answer, evaluators=[fn]))
    (threaded,) = execute(project, define("threaded", items(10), sync_answer, evaluators=[fn]))
    scored = verdicts(batched)
    assert scored == verdicts(threaded)
    assert scored[1, "fn"] == ("error", None, "the function raised ValueError: bad verdict")
    assert scored[2, "fn"][0] == "error" and scored[2, "fn"][2].startswith("SystemExit(3)")
    assert scored[3, "fn"] == ("error", None, "the score must be between 0 and 1 (got nan)")
    assert scored[4, "fn"][0] == "error"
    assert scored[6, "fn"] == ("ok", 0.75, "")
    assert [scored[i, "fn"] for i in (0, 5, 9)] == [
        ("ok", 1.0, ""),
        ("ok", 0.25, ""),
        ("ok", 1.0, ""),
    ]
    assert {r.status for r in rows(batched).values()} == {"ok"}


def test_an_evaluator_that_blocks_times_out_and_holds_up_none_of_its_batch(project):
    release = threading.Event()  # the stuck evaluator's thread, let go at the end
    scored_at = {}

    def stuck(ctx):
        if ctx.item["id"] == "item-2":
            release.wait(60)
        scored_at[ctx.item["id"]] = time.monotonic()
        return 1.0

    fn = Evaluator(name="fn", type="function", fn=stuck)
    experiment = define("stuck", items(30), answer, evaluators=[fn], timeout=2, concurrency=10)
    began = time.monotonic()
    try:
        (run,) = execute(project, experiment)
    finally:
        release.set()
    scored = verdicts(run)
    assert scored[2, "fn"] == (
        "error",
        None,
        "timed out after 2s (the evaluator was stopped; give it more time with `timeout=` "
        "on the Evaluator)",
    )
    assert all(scored[i, "fn"] == ("ok", 1.0, "") for i in range(30) if i != 2)
    # Its batch's other items were moved on at once, not after the timeout.
    others = [at for item, at in scored_at.items() if item != "item-2"]
    assert len(others) == 29 and max(others) - began < 2
    assert {r.status for r in rows(run).values()} == {"ok"}


def test_a_run_cancelled_while_verdicts_are_batched_keeps_every_finished_item(project):
    gate = threading.Event()

    def slow(ctx):
        if ctx.item["id"] == "item-30":
            aio.loop_thread().interrupt()  # Ctrl-C, as a notebook's helper thread gets it
            gate.wait(1)
        return 1.0

    async def runner(ctx):
        await asyncio.sleep(0)
        return f"answer {ctx.index}"

    fn = Evaluator(name="fn", type="function", fn=slow)
    experiment = define("cancelled", items(400), runner, evaluators=[fn], concurrency=4)
    with pytest.raises(aio.Interrupted):
        execute(project, experiment)
    run = Run.objects.get(name="cancelled")
    assert run.status == "cancelled"
    found = rows(run)
    assert {r.status for r in found.values()} <= {"ok", "cancelled"}
    assert found[399].status == "cancelled"
    scored = verdicts(run)
    done = [i for i, r in found.items() if r.status == "ok"]
    assert len(done) >= 20
    assert all(scored[i, "fn"] == ("ok", 1.0, "") for i in done if i != 30)
