"""Items whose step is all sync run one after another on a runner thread, their outcomes
handed to the lane in batches (`cobalt_app.sync_items`): the same outcomes as through the
loop, timeouts and cancels included. Real in-process runs over the project's SQLite."""

import math
import sys
import threading

import pytest

from cobalt import Dataset, Evaluator
from cobalt_app import aio
from cobalt_app.models import Evaluation, ItemResult, Run
from tests.helpers import define, execute

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def items(n):
    return Dataset(items=[{"id": f"item-{i}", "input": f"q{i}"} for i in range(n)])


def in_a_batch() -> bool:
    """Whether the calling runner runs inside a batch of `sync_items` (not through the loop)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_qualname == "Batch._work":
            return True
        frame = frame.f_back
    return False


def rows(run):
    return {r.item_index: r for r in ItemResult.objects.filter(run=run)}


def verdicts(run):
    return {
        (e.item.item_index, e.evaluator): (e.status, e.score, e.error)
        for e in Evaluation.objects.filter(run=run).select_related("item")
    }


def test_a_sync_agent_timing_out_inside_a_batch_is_stopped_and_its_neighbours_run_on(project):
    batched = {}

    def runner(ctx):
        batched[ctx.index] = in_a_batch()
        while ctx.index == 5:
            pass
        return f"answer {ctx.index}"

    check = Evaluator(name="has", type="contains", value="answer")
    experiment = define("spin", items(20), runner, evaluators=[check], timeout=1, concurrency=1)
    (run,) = execute(project, experiment)
    found = rows(run)
    assert set(batched.values()) == {True}
    assert (found[5].status, found[5].error) == (
        "timeout",
        "timed out after 1s (its code was stopped)",
    )
    others = {i: (r.status, r.output) for i, r in found.items() if i != 5}
    assert others == {i: ("ok", f"answer {i}") for i in range(20) if i != 5}
    scored = verdicts(run)
    assert all(scored[i, "has"] == ("ok", 1.0, "") for i in others)
    assert (5, "has") not in scored
    run.refresh_from_db()
    assert run.status == "completed" and run.finished_items == 20


def test_a_thread_left_inside_a_batch_gives_back_the_items_it_had_not_begun(project):
    # Item 2 blocks in C (a lock): no interruption reaches it; after the grace period its
    # thread is left, and the items after it in its batch run all the same.
    project.write("cobalt.toml", 'test_dir = "experiments"\ntimeout_grace = 1\n')
    release = threading.Event()
    threads = {}

    def runner(ctx):
        threads[ctx.index] = threading.current_thread()
        if ctx.index == 2:
            release.wait(60)
        return f"answer {ctx.index}"

    check = Evaluator(name="has", type="contains", value="answer")
    experiment = define("left", items(20), runner, evaluators=[check], timeout=1, concurrency=1)
    try:
        (run,) = execute(project, experiment)
    finally:
        release.set()
    found = rows(run)
    assert found[2].status == "timeout"
    assert found[2].error.startswith("timed out after 1s and its code did not stop within 1s")
    assert f"thread {threads[2].name} was left running" in found[2].error
    assert {i: r.status for i, r in found.items() if i != 2} == {
        i: "ok" for i in range(20) if i != 2
    }
    assert threads[3] is not threads[2]  # taken back, run by another thread
    assert verdicts(run)[3, "has"] == ("ok", 1.0, "")


def mistakes(ctx):
    """Item 3 raises, 4 exits, 5 answers NaN, 6 forgets its return; the others answer."""
    if ctx.index == 3:
        raise ValueError("boom")
    if ctx.index == 4:
        sys.exit(3)
    if ctx.index == 5:
        return math.nan
    if ctx.index == 6:
        return None
    return f"answer {ctx.index}"


def score(ctx):
    if ctx.item["id"] == "item-7":
        raise RuntimeError("the evaluator broke")
    return 0.5


async def async_score(ctx):  # an async evaluator: the items go through the loop
    return 1.0


def test_a_failing_item_of_a_batch_is_recorded_as_through_the_loop_and_spares_its_neighbours(
    project,
):
    common = [
        Evaluator(name="fn", type="function", fn=score),
        Evaluator(name="has", type="contains", value="answer"),
    ]
    loop_only = Evaluator(name="async", type="function", fn=async_score)
    (batched,) = execute(project, define("batched", items(12), mistakes, evaluators=common))
    (looped,) = execute(
        project, define("looped", items(12), mistakes, evaluators=[*common, loop_only])
    )
    seen = {}
    for run in (batched, looped):
        seen[run.id] = {
            i: (r.status, r.error, r.output, r.traceback.strip().splitlines()[-1:])
            for i, r in rows(run).items()
        }
    assert seen[batched.id] == seen[looped.id]
    assert seen[batched.id][3][:2] == ("error", "ValueError: boom")
    assert seen[batched.id][4][0] == "error" and "SystemExit" in seen[batched.id][4][1]
    assert [seen[batched.id][i][:3] for i in (0, 11)] == [
        ("ok", "", "answer 0"),
        ("ok", "", "answer 11"),
    ]
    left = {k: v for k, v in verdicts(looped).items() if k[1] != "async"}
    assert verdicts(batched) == left
    assert verdicts(batched)[7, "fn"][0] == "error"
    assert verdicts(batched)[8, "fn"] == ("ok", 0.5, "")


def test_an_evaluator_past_the_timeout_inside_a_batch_is_timed_out_and_the_rest_run(project):
    release = threading.Event()  # the stuck evaluator's thread, let go at the end

    def stuck(ctx):
        if ctx.item["id"] == "item-2":
            release.wait(60)
        return 1.0

    evaluators = [
        Evaluator(name="has", type="contains", value="answer"),
        Evaluator(name="fn", type="function", fn=stuck),
        Evaluator(name="json", type="json-valid"),
    ]
    experiment = define(
        "stuck",
        items(10),
        lambda ctx: f"answer {ctx.index}",
        evaluators=evaluators,
        timeout=1,
        concurrency=1,
    )
    try:
        (run,) = execute(project, experiment)
    finally:
        release.set()
    scored = verdicts(run)
    assert scored[2, "has"] == ("ok", 1.0, "")
    assert scored[2, "fn"][0] == "error" and scored[2, "fn"][2].startswith("timed out after 1s")
    assert scored[2, "json"][0] == "ok"  # scored as usual after the timed-out one
    assert {i: r.status for i, r in rows(run).items()} == {i: "ok" for i in range(10)}
    assert all(scored[i, "fn"] == ("ok", 1.0, "") for i in range(10) if i != 2)


def test_a_lane_cancelled_mid_batch_records_every_item_that_finished_before(project):
    finished = []

    def runner(ctx):
        if ctx.index == 40:
            aio.loop_thread().interrupt()  # Ctrl-C, as a notebook's helper thread gets it
        finished.append(ctx.index)
        return f"answer {ctx.index}"

    check = Evaluator(name="has", type="contains", value="answer")
    experiment = define("cancelled", items(400), runner, evaluators=[check], concurrency=1)
    with pytest.raises(aio.Interrupted):
        execute(project, experiment)
    run = Run.objects.get(name="cancelled")
    assert run.status == "cancelled"
    found = rows(run)
    statuses = {r.status for r in found.values()}
    assert statuses <= {"ok", "cancelled"}, statuses
    assert all(found[i].status == "ok" for i in range(40))  # finished before the cancel
    scored = verdicts(run)
    assert all(scored[i, "has"] == ("ok", 1.0, "") for i, r in found.items() if r.status == "ok")
    assert found[399].status == "cancelled"  # the batch did not run on


def test_every_quick_item_of_a_big_run_is_recorded_once_with_its_verdict(project):
    # 40 runner threads land outcomes while the loop takes them: none may fall between.
    check = Evaluator(name="has", type="contains", value="answer")
    experiment = define(
        "many", items(20_000), lambda ctx: f"answer {ctx.index}", evaluators=[check]
    )
    (run,) = execute(project, experiment)
    run.refresh_from_db()
    assert run.status == "completed" and run.finished_items == 20_000
    assert ItemResult.objects.filter(run=run, status="ok").count() == 20_000
    assert Evaluation.objects.filter(run=run, status="ok", score=1.0).count() == 20_000
