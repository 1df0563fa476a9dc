"""Nothing lost, nothing hung: values JSON cannot hold, `sys.exit()` in user code, evaluators
that hang or block. Embedded here (real SQLite, the real `cobalt` command and in-process
runs); team mode (PostgreSQL, Redis, worker processes) at the end of the file."""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cobalt import Dataset, EvalResult, Evaluator
from cobalt_app import storable
from cobalt_app.models import ItemResult, Run
from tests.helpers import define, execute
from tests.team_harness import Team

# Item index → what its runner returns or does. Every other item answers `answer {i}`.
MISTAKES = """\
import asyncio
import sys

from cobalt import Dataset, EvalResult, Evaluator, experiment

circular = ["loop"]
circular.append(circular)
BAD = {
    10: lambda: float("nan"),
    20: lambda: {"output": "fine", "metadata": {"confidence": float("nan")}},
    30: lambda: {("a", "b"): 1},
    40: lambda: circular,
    50: lambda: "half a pair \\ud800 of surrogates",
    60: lambda: {"tags": {"x", "y"}},
    70: lambda: {"output": "fine", "metadata": {"cost": float("inf")}},
    80: lambda: sys.exit(3),
    90: lambda: (_ for _ in ()).throw(KeyboardInterrupt("from the agent")),
    150: lambda: {"output": "fine", "metadata": {"confidence": float("nan")}},
    160: lambda: "a NUL \\x00 inside",
    170: lambda: {"output": "fine", "metadata": {"usage": {"prompt_tokens": float("nan")}}},
}


def judged(ctx):
    if ctx.item["id"] == "q200":
        sys.exit("the evaluator exits")
    return EvalResult(score=1.0, reason="reason with a lone \\udc80 surrogate")


@experiment(
    "mistakes",
    Dataset(items=[{"id": f"q{i}", "n": i} for i in range(300)]),
    evaluators=[Evaluator(name="judged", type="function", fn=judged)],
    concurrency=8,
)
async def run(ctx):
    if ctx.index in BAD:
        return BAD[ctx.index]()
    return f"answer {ctx.index}"
"""
BAD = {
    10: "output is nan",
    20: "metadata.confidence is nan",
    30: "output[('a', 'b')] has a tuple as its key",
    40: "output[1] refers to itself",
    50: "output contains a lone surrogate",
    60: "output.tags is a set",
    70: "the cost (metadata.cost) is inf",
    80: "SystemExit(3): the runner raised it",
    90: "KeyboardInterrupt('from the agent'): the runner raised it",
    150: "metadata.confidence is nan",
    160: "output contains a NUL character",
    170: "metadata.usage.prompt_tokens is nan",
}


def check_mistakes_run(items: dict[int, dict], run: dict) -> None:
    """The 300-item run: every item recorded, the bad ones as errors naming the problem."""
    assert run["status"] == "completed"
    assert len(items) == 300
    for index, item in items.items():
        if index in BAD:
            assert item["status"] == "error", (index, item)
            assert BAD[index] in item["error"], (index, item["error"])
        else:
            assert item["status"] == "ok", (index, item)
            assert item["output"] == f"answer {index}"
    assert items[20]["output"] == "fine"  # what could be kept was kept
    assert items[20]["metadata"] == {"confidence": None}
    assert items[50]["output"] == "half a pair \\ud800 of surrogates"
    evaluations = {i: item["evaluations"] for i, item in items.items() if item["evaluations"]}
    assert set(evaluations) == set(range(300)) - set(BAD)  # errored items are not scored
    assert evaluations[0]["judged"]["reason"] == "reason with a lone \\udc80 surrogate"
    assert evaluations[200]["judged"]["status"] == "error"
    assert (
        "SystemExit('the evaluator exits'): the evaluator raised it"
        in (evaluations[200]["judged"]["error"])
    )


def stored_items(db_path, run_id: str) -> dict[int, dict]:
    with sqlite3.connect(db_path) as db:
        rows = db.execute(
            "SELECT id, item_index, status, output, metadata, error FROM cobalt_app_itemresult "
            "WHERE run_id = ?",
            [run_id],
        ).fetchall()
        evaluations = db.execute(
            "SELECT item_id, evaluator, status, reason, error FROM cobalt_app_evaluation "
            "WHERE run_id = ?",
            [run_id],
        ).fetchall()
    by_item: dict[int, dict] = {}
    for item_id, evaluator, status, reason, error in evaluations:
        by_item.setdefault(item_id, {})[evaluator] = {
            "status": status,
            "reason": reason,
            "error": error,
        }
    return {
        index: {
            "status": status,
            "output": json.loads(output) if output is not None else None,
            "metadata": json.loads(metadata),
            "error": error,
            "evaluations": by_item.get(item_id, {}),
        }
        for item_id, index, status, output, metadata, error in rows
    }


def test_values_json_cannot_hold_and_exits_are_item_errors_and_lose_no_other_item(
    project, cobalt_cli
):
    project.write("experiments/mistakes.cobalt.py", MISTAKES)
    result = cobalt_cli(project, "run")
    assert result.returncode == 0, result.stdout + result.stderr
    (results_file,) = project.results_files()
    document = json.loads(results_file.read_text(encoding="utf-8"))
    assert document["status"] == "completed"
    assert sum(1 for item in document["items"] if item["status"] == "error") == len(BAD)
    items = stored_items(project.db_path, document["id"])
    check_mistakes_run(items, {"status": document["status"]})
    assert f"{300 - len(BAD)} ok, {len(BAD)} errors" in result.stdout.replace("(", "")


pytestmark_db = pytest.mark.django_db(transaction=True)


@pytestmark_db
def test_a_sync_runner_that_exits_is_an_item_error_and_the_run_finishes(project):
    def runner(ctx):
        if ctx.index == 1:
            raise SystemExit("bye")
        if ctx.index == 2:
            raise KeyboardInterrupt
        return "ok"

    (run,) = execute(project, define("exits", Dataset(items=[{"n": i} for i in range(4)]), runner))
    run.refresh_from_db()
    assert run.status == "completed"
    rows = dict(ItemResult.objects.filter(run=run).values_list("item_index", "error"))
    assert rows[0] == rows[3] == ""
    assert rows[1].startswith("SystemExit('bye'): the runner raised it")
    assert rows[2].startswith("KeyboardInterrupt(): the runner raised it")


@pytestmark_db
def test_an_evaluator_that_never_returns_times_out_and_the_others_are_kept(project):
    async def forever(ctx):
        await asyncio.Event().wait()

    definition = define(
        "hanging-evaluator",
        Dataset(items=[{"n": 1}]),
        lambda ctx: "answer",
        evaluators=[
            Evaluator(name="hangs", type="function", fn=forever, timeout=0.2),
            Evaluator(name="fine", type="function", fn=lambda ctx: 1.0),
            Evaluator(name="bad-timeout", type="function", fn=lambda ctx: 1.0, timeout="soon"),
        ],
        timeout=30,
    )
    (run,) = execute(project, definition)
    evaluations = {
        e.evaluator: e for e in ItemResult.objects.get(run=run).evaluations.order_by("evaluator")
    }
    assert evaluations["hangs"].status == "error"
    assert evaluations["hangs"].error.startswith("timed out after 0.2s")
    assert evaluations["fine"].status == "ok" and evaluations["fine"].score == 1.0
    assert "`timeout=` must be a number of seconds above 0 (got 'soon')" in (
        evaluations["bad-timeout"].error
    )


@pytestmark_db
def test_an_evaluator_gets_the_items_timeout_when_it_has_none(project):
    async def forever(ctx):
        await asyncio.Event().wait()

    definition = define(
        "item-timeout",
        Dataset(items=[{"n": 1}]),
        lambda ctx: "answer",
        evaluators=[Evaluator(name="hangs", type="function", fn=forever)],
        timeout=0.3,
    )
    (run,) = execute(project, definition)
    evaluation = ItemResult.objects.get(run=run).evaluations.get()
    assert evaluation.error.startswith("timed out after 0.3s")


@pytestmark_db
def test_sync_evaluators_run_beside_each_other_off_the_event_loop(project):
    # All five evaluators of the item must be inside their function at once to pass the
    # barrier: one after another on the event loop, the first would wait alone and fail.
    barrier = threading.Barrier(5, timeout=10)
    loop_threads: set[str] = set()

    def meet(ctx):
        barrier.wait()
        return EvalResult(score=1.0, reason=threading.current_thread().name)

    async def runner(ctx):
        loop_threads.add(threading.current_thread().name)
        return "answer"

    evaluators = [Evaluator(name=f"sync-{i}", type="function", fn=meet) for i in range(5)]
    (run,) = execute(
        project, define("sync", Dataset(items=[{"n": 1}]), runner, evaluators=evaluators)
    )
    evaluations = list(ItemResult.objects.get(run=run).evaluations.all())
    assert [e.status for e in evaluations] == ["ok"] * 5, [e.error for e in evaluations]
    assert not {e.reason for e in evaluations} & loop_threads


@pytestmark_db
def test_a_failing_batch_write_is_retried_item_by_item_and_loses_no_neighbour(project):
    # A value only the database refuses (SQLite's JSON check on a raw NaN): it slips past
    # nothing in normal use, so it is handed to the recorder directly.
    from cobalt_app.engine import ItemOutcome
    from cobalt_app.runs.claims import items_claim
    from cobalt_app.runs.recorder import record_batch

    definition = define("batch", Dataset(items=[{"n": i} for i in range(3)]), lambda ctx: "x")
    (run,) = execute(project, definition)
    ids = list(
        ItemResult.objects.filter(run=run).order_by("item_index").values_list("id", flat=True)
    )
    ItemResult.objects.filter(run=run).update(status="pending")
    Run.objects.filter(id=run.id).update(finished_items=0)
    claims = items_claim(ids, "test")
    outcomes = [
        ItemOutcome(id=i, item_index=n, run_index=0, item_key=str(n), status="ok", output=f"v{n}")
        for n, i in enumerate(ids)
    ]
    outcomes[1].stored = ('"fine"', '{"x": NaN}')  # prepared wrongly: the database refuses it
    recorded = record_batch(list(zip(claims, outcomes, strict=True)))
    assert recorded.ids == set(ids) and not recorded.failed
    rows = {r.item_index: r for r in ItemResult.objects.filter(run=run)}
    assert rows[0].output == "v0" and rows[2].output == "v2" and rows[0].status == "ok"
    assert rows[1].status == "error" and rows[1].error.startswith("the result could not be stored")


ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=8)  # surrogates, NUL too
JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | ANY_TEXT,
    lambda children: (
        st.lists(children, max_size=3)
        | st.tuples(children, children)
        | st.frozensets(st.integers(), max_size=2)
        | st.dictionaries(
            st.text(max_size=4) | st.integers() | st.tuples(st.integers()), children, max_size=3
        )
    ),
    max_leaves=8,
)


@given(
    outputs=st.lists(
        st.tuples(JSONISH, st.dictionaries(ANY_TEXT, JSONISH, max_size=3), ANY_TEXT),
        min_size=1,
        max_size=6,
    )
)
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@pytestmark_db
def test_any_jsonish_output_metadata_and_reason_ends_in_exactly_one_recorded_state(
    project, outputs
):
    def runner(ctx):
        output, metadata, _ = outputs[ctx.index]
        return {"output": output, "metadata": metadata}

    def reason(ctx):
        return EvalResult(score=0.5, reason=outputs[ctx.item["n"]][2])

    definition = define(
        "property",
        Dataset(items=[{"n": i} for i in range(len(outputs))]),
        runner,
        evaluators=[Evaluator(name="reason", type="function", fn=reason)],
    )
    (run,) = execute(project, definition)
    run.refresh_from_db()
    rows = list(ItemResult.objects.filter(run=run))
    assert run.status == "completed"
    assert len(rows) == len(outputs) == run.finished_items == run.total_items
    assert all(row.status in ("ok", "error") for row in rows)
    for row in rows:
        output, metadata, _ = outputs[row.item_index]
        if row.status == "ok":
            assert row.output == json.loads(storable.dumps(output))
            assert row.evaluations.get().status == ("error" if output is None else "ok")
        else:
            assert "could not be stored as it is" in row.error
            assert not row.evaluations.exists()
    summary = run.summary["itemStatus"]
    assert summary.get("ok", 0) + summary.get("error", 0) == len(outputs)


def test_storable_names_the_path_of_each_problem():
    circular: list = []
    circular.append(circular)
    cases = {
        "value.a[2] is nan": {"a": [1, 2, math.nan]},
        "value['x y'] is inf": {"x y": math.inf},
        "value[(1,)] has a tuple as its key": {(1,): 2},
        "value[0] refers to itself": circular,
        "value.s is a set": {"s": {1}},
        "value.t contains a NUL character": {"t": "a\x00"},
    }
    for expected, value in cases.items():
        with pytest.raises(storable.Unstorable) as caught:
            storable.dumps(value)
        assert str(caught.value).startswith(expected), (expected, str(caught.value))
    assert storable.dumps({"text": "a \\u0000 escape, not a NUL"}) == (
        '{"text": "a \\\\u0000 escape, not a NUL"}'
    )
    assert storable.salvage({"a": math.nan, (1,): {2}}) == {"a": None, "(1,)": [2]}


# ------------------------------------------------------------------------------- team mode


def test_team_mode_records_the_same_mistakes_as_item_errors_and_the_worker_stays_up(team: Team):
    (team.folder / "experiments" / "mistakes.cobalt.py").write_text(MISTAKES)
    worker = team.start_worker("--concurrency", "8")
    result = team.cli("run", timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    run_id = team.latest_run()
    assert team.run_row(run_id)["status"] == "completed"
    rows = team.services.query(
        "SELECT i.item_index, i.status, i.output::text, i.metadata::text, i.error, "
        "coalesce(json_object_agg(e.evaluator, json_build_object('status', e.status, "
        "'reason', e.reason, 'error', e.error)) FILTER (WHERE e.id IS NOT NULL), '{}') "
        "FROM cobalt_app_itemresult i LEFT JOIN cobalt_app_evaluation e ON e.item_id = i.id "
        "WHERE i.run_id = %s GROUP BY i.id",
        [run_id],
    )
    items = {
        index: {
            "status": status,
            "output": json.loads(output) if output is not None else None,
            "metadata": json.loads(metadata),
            "error": error,
            "evaluations": evaluations,
        }
        for index, status, output, metadata, error, evaluations in rows
    }
    check_mistakes_run(items, {"status": "completed"})
    assert (
        max(
            r[0]
            for r in team.services.query(
                "SELECT attempts FROM cobalt_app_itemresult WHERE run_id = %s", [run_id]
            )
        )
        == 1
    )  # nothing was re-dispatched
    # The worker is still working: a second run completes on it.
    again = team.cli("run", timeout=180)
    assert again.returncode == 0
    assert team.run_row(team.latest_run())["status"] == "completed"
    assert worker.popen.poll() is None  # the worker is still up


def test_team_resume_refuses_a_run_its_workers_are_executing(team: Team):
    from tests.team_harness import wait_for

    # 18 s of work on 2 lanes: still running when the first item's line shows, however late
    # a loaded machine prints it (at 0.5 s an item the run once ended before `--resume`).
    team.write_experiment(items=24, delay=1.5, call_agent=False)
    team.start_worker("--concurrency", "2")
    first = team.cli_background("run")
    wait_for(lambda: "✓ Item" in first.out(), timeout=60, what="a first item")
    run_id = team.latest_run()
    refused = team.cli("run", "--resume", run_id)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"run {run_id} is still running on the workers" in refused.stderr
    assert first.wait(120) == 0
    executed = team.executions()
    assert len(executed) == len(set(executed)) == 24  # every item ran once


LOOP_STOPPER = """\
import asyncio
from pathlib import Path

from cobalt import Dataset, experiment

HERE = Path(__file__).resolve().parent.parent


@experiment("stops-the-loop", Dataset(items=[{"id": i} for i in range(6)]), concurrency=2)
async def run(ctx):
    flag = HERE / "stopped-once"
    if ctx.index == 2 and not flag.exists():
        flag.touch()
        asyncio.get_running_loop().stop()  # the worker's shared loop: no item can finish now
        await asyncio.sleep(3600)
    return "ok"
"""


def test_a_worker_whose_event_loop_stopped_exits_and_its_items_go_to_another(team: Team):
    from cobalt_app.worker_runtime import LOOP_STOPPED_EXIT
    from tests.team_harness import wait_for

    (team.folder / "experiments" / "loop.cobalt.py").write_text(LOOP_STOPPER)
    broken = team.start_worker("--concurrency", "2")
    run = team.cli_background("run")
    assert broken.wait(60) == LOOP_STOPPED_EXIT  # it left instead of renewing leases forever
    assert "the worker's event loop stopped" in broken.err()
    assert all(w["pid"] != broken.popen.pid for w in team.workers_on_queue())
    team.start_worker("--concurrency", "2")
    assert run.wait(120) == 0, run.out() + run.err()
    run_id = team.latest_run()
    wait_for(lambda: team.run_row(run_id)["status"] == "completed", timeout=30, what="completed")
    assert team.item_statuses(run_id) == {"ok": 6}


def test_a_stopping_worker_claims_nothing_more_hands_back_its_items_and_exits(team: Team):
    import signal

    from tests.team_harness import wait_for

    team.write_experiment(items=20, delay=1.0, call_agent=False, concurrency=2)
    # Each of its two lanes claims 20 // (2 * 2) = 5 items at a time: more than it starts.
    first = team.start_worker("--concurrency", "2", env={"COBALT_SHUTDOWN_GRACE": "0.5"})
    run = team.cli_background("run")
    wait_for(lambda: len(team.executions()) >= 3, timeout=60, what="a few items started")
    first.popen.send_signal(signal.SIGTERM)
    started_before = len(team.executions())
    assert first.wait(8) == 0, first.err()  # within Docker's 10 s, not at the end of the run
    mine = [line for line in team.executions() if line.endswith(f" {first.popen.pid}")]
    assert len(mine) <= started_before + 2  # at most what its two lanes had claimed
    run_id = team.latest_run()
    held = team.services.query(
        "SELECT count(*) FROM cobalt_app_itemresult WHERE run_id = %s AND status = 'running'",
        [run_id],
    )
    assert held == [(0,)]  # handed back, not left to expire

    team.start_worker("--concurrency", "2")
    assert run.wait(120) == 0, run.out() + run.err()
    assert team.item_statuses(run_id) == {"ok": 20}


@pytestmark_db
def test_credentials_quoted_in_an_error_are_not_stored(project):
    def runner(ctx):
        raise ConnectionError(
            "could not reach postgres://agent:hunter2@db.internal/x with key sk-live-abcdef123456"
        )

    (run,) = execute(project, define("secret-error", Dataset(items=[{"n": 1}]), runner))
    row = ItemResult.objects.get(run=run)
    assert "hunter2" not in row.error and "sk-live-abcdef123456" not in row.error
    assert "hunter2" not in row.traceback and "abcdef123456" not in row.traceback
    assert row.error.startswith("ConnectionError: could not reach postgres://agent:***@db.internal")
