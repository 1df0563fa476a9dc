"""The embedded executor, in-process: statuses, timeouts, errors, repetitions, concurrency."""

import asyncio
import json
import os
import socket
import threading
import time

import pytest

from cobalt import Dataset, EvalResult, Evaluator
from cobalt_app.models import Evaluation, ItemResult, Run
from tests.helpers import define, execute

pytestmark = pytest.mark.django_db(transaction=True)


def items(n):
    return Dataset(
        items=[{"id": f"item-{i}", "input": f"q{i}", "expected": f"a{i}"} for i in range(n)]
    )


def test_it_records_every_item_with_its_status_and_continues_after_failures(project):
    async def runner(ctx):
        if ctx.index == 1:
            raise ValueError("the agent broke")
        if ctx.index == 2:
            await asyncio.sleep(30)
        return {"output": f"a{ctx.index}", "metadata": {"model": "gpt-4o-mini", "tokens": 10}}

    definition = define(
        "statuses",
        items(4),
        runner,
        evaluators=[Evaluator(name="exact", type="exact-match", field="expected")],
        timeout=0.5,
    )
    (run,) = execute(project, definition)
    rows = {r.item_index: r for r in ItemResult.objects.filter(run=run)}
    assert [rows[i].status for i in range(4)] == ["ok", "error", "timeout", "ok"]
    assert rows[1].error == "ValueError: the agent broke"
    assert "Traceback" in rows[1].traceback and "the agent broke" in rows[1].traceback
    # It starts at the runner, not in the engine that awaited it.
    assert rows[1].traceback.splitlines()[1].startswith(f'  File "{__file__}", line ')
    assert "cobalt_app/engine.py" not in rows[1].traceback
    assert "timed out after 0.5s" in rows[2].error
    assert rows[0].output == "a0" and rows[0].metadata == {"model": "gpt-4o-mini", "tokens": 10}
    run.refresh_from_db()
    assert run.status == "completed"
    scores = run.summary["scores"]["exact"]
    assert scores["count"] == 2 and scores["avg"] == 1.0  # errors are not folded in as zeros
    assert run.summary["errors"] == 1 and run.summary["timeouts"] == 1
    assert run.finished_items == 4
    assert Evaluation.objects.filter(run=run).count() == 2


def test_a_timeout_cancels_the_async_runner(project):
    cancelled = threading.Event()

    async def runner(ctx):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    started = time.monotonic()
    (run,) = execute(project, define("hang", items(1), runner, timeout=0.3))
    assert time.monotonic() - started < 10
    assert cancelled.is_set()
    assert ItemResult.objects.get(run=run).status == "timeout"


def test_runs_greater_than_one_repeat_each_item(project):
    seen = []

    def runner(ctx):  # a sync runner
        seen.append((ctx.index, ctx.run_index, ctx.item_key))
        return ctx.item["expected"]

    (run,) = execute(project, define("repeat", items(3), runner, runs=3))
    assert sorted(seen) == [(i, r, f"item-{i}") for i in range(3) for r in range(3)]
    assert ItemResult.objects.filter(run=run, status="ok").count() == 9
    assert run.total_items == 9


def test_concurrency_is_honoured(project):
    active = 0
    peak = 0

    async def runner(ctx):
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.05)
        active -= 1
        return "ok"

    execute(project, define("parallel", items(24), runner, concurrency=4))
    assert peak == 4


def test_a_finished_item_is_recorded_while_the_next_one_still_runs(project):
    # The dashboard shows progress from the database: an outcome must not wait in a buffer
    # until a slow next item finishes.
    def runner(ctx):
        if ctx.index == 0:
            return "first"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if ItemResult.objects.filter(run__name="gated", item_index=0, status="ok").exists():
                return "saw the first item recorded"
            time.sleep(0.02)
        return "the first item was not recorded"

    (run,) = execute(project, define("gated", items(2), runner, concurrency=1))
    second = ItemResult.objects.get(run=run, item_index=1)
    assert second.output == "saw the first item recorded"


def test_function_evaluators_accept_dicts_results_floats_and_bools(project):
    evaluators = [
        Evaluator(name="dict", type="function", fn=lambda c: {"score": 0.25, "reason": "quarter"}),
        Evaluator(name="result", type="function", fn=lambda c: EvalResult(0.5, "half")),
        Evaluator(name="float", type="function", fn=lambda c: 0.75),
        Evaluator(name="bool", type="function", fn=lambda c: c.output == "yes"),
        Evaluator(name="range", type="function", fn=lambda c: 1.5),
        Evaluator(name="raises", type="function", fn=lambda c: 1 / 0),
        Evaluator(name="junk", type="function", fn=lambda c: "great"),
    ]

    async def check(ctx):
        return {"score": 1.0} if ctx.metadata["flag"] else 0.0

    evaluators.append(Evaluator(name="async", type="function", fn=check))
    (run,) = execute(
        project,
        define(
            "fn",
            items(1),
            lambda c: {"output": "yes", "metadata": {"flag": 1}},
            evaluators=evaluators,
        ),
    )
    found = {e.evaluator: e for e in Evaluation.objects.filter(run=run)}
    assert (found["dict"].score, found["dict"].reason) == (0.25, "quarter")
    assert (found["result"].score, found["result"].reason) == (0.5, "half")
    assert found["float"].score == 0.75
    assert found["bool"].score == 1.0
    assert found["async"].score == 1.0
    for name, message in (
        ("range", "between 0 and 1"),
        ("raises", "ZeroDivisionError"),
        ("junk", "returned str"),
    ):
        assert found[name].status == "error" and found[name].score is None
        assert message in found[name].error
    run.refresh_from_db()
    assert run.summary["scores"]["range"]["errors"] == 1
    assert run.summary["scores"]["range"]["avg"] is None


def test_exact_match_compares_with_the_configured_field(project):
    evaluators = [
        Evaluator(name="exact", type="exact-match", field="expected"),
        Evaluator(name="missing", type="exact-match"),  # default field expected_output is absent
    ]
    (run,) = execute(project, define("exact", items(2), lambda c: "a0", evaluators=evaluators))
    scores = dict(
        Evaluation.objects.filter(run=run, evaluator="exact").values_list(
            "item__item_index", "score"
        )
    )
    assert scores == {0: 1.0, 1: 0.0}
    missing = Evaluation.objects.filter(run=run, evaluator="missing").first()
    assert missing.status == "error" and "expected_output" in missing.error


def test_the_dataset_is_snapshotted_at_creation_with_item_keys(project):
    dataset = Dataset(items=[{"id": 7, "input": "a"}, {"input": "no id"}])
    (run,) = execute(project, define("snap", dataset, lambda c: "x"))
    rows = list(ItemResult.objects.filter(run=run).order_by("item_index"))
    assert rows[0].item_key == "7" and rows[0].input == {"id": 7, "input": "a"}
    assert rows[1].item_key.startswith("sha256:")
    assert run.config["dataset"]["size"] == 2


def test_the_results_file_follows_the_seed_format_with_statuses(project):
    def runner(ctx):
        if ctx.index == 1:
            raise RuntimeError("nope")
        return {
            "output": "a0",
            "metadata": {
                "model": "gpt-4o",
                "usage": {"prompt_tokens": 100, "completion_tokens": 50},
            },
        }

    evaluators = [
        Evaluator(name="exact", type="exact-match", field="expected"),
        Evaluator(name="bad", type="function", fn=lambda c: 7),
    ]
    (run,) = execute(
        project, define("format", items(2), runner, evaluators=evaluators, tags=["v2"])
    )
    (path,) = project.results_files()
    assert path.name.endswith(f"_format_{run.id}.json")
    data = json.loads(path.read_text())
    assert data["id"] == run.id and data["name"] == "format" and data["tags"] == ["v2"]
    assert data["timestamp"].endswith("Z")
    assert data["config"] == {
        "runs": 1,
        "concurrency": 5,
        "timeout": 30000,
        "evaluators": ["exact", "bad"],
        "dataset": data["config"]["dataset"],
    }
    summary = data["summary"]
    assert summary["totalItems"] == 2
    assert summary["scores"]["exact"]["avg"] == 1.0
    assert summary["agentTokens"] == 150
    assert summary["estimatedCost"] == pytest.approx((100 * 2.5 + 50 * 10) / 1e6)
    first, second = data["items"]
    assert first["index"] == 0 and first["runIndex"] == 0 and first["status"] == "ok"
    assert first["output"] == {"output": "a0", "metadata": first["output"]["metadata"]}
    assert first["evaluations"]["exact"] == {
        "score": 1.0,
        "verdict": "pass",
        "reason": "output equals the expected value",
    }
    assert (
        first["evaluations"]["bad"]["score"] is None
        and "between 0 and 1" in first["evaluations"]["bad"]["error"]
    )
    assert second["status"] == "error" and second["error"] == "RuntimeError: nope"
    assert second["evaluations"] == {}


def test_a_module_level_async_client_survives_several_experiments(project, fake_provider):
    from openai import AsyncOpenAI

    client = AsyncOpenAI()

    async def runner(ctx):
        reply = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": f"ECHO: {ctx.item['input']}"}],
        )
        return reply.choices[0].message.content

    first = define("client-1", items(3), runner)
    second = define("client-2", items(3), runner)
    execute(project, first)
    runs = execute(project, second)
    outputs = sorted(ItemResult.objects.filter(run=runs[0]).values_list("output", flat=True))
    assert outputs == ["q0", "q1", "q2"]
    assert fake_provider.request_count("/v1/chat") == 6


def test_recording_a_batch_of_outcomes_takes_a_constant_number_of_queries(
    project, django_assert_max_num_queries
):
    from cobalt_app import services
    from cobalt_app.engine import ItemOutcome
    from cobalt_app.evaluators import EvalOutcome

    definition = define("batch", items(500), lambda c: "x")
    run = services.run_create(
        experiment=definition, settings={"runs": 1, "concurrency": 5, "timeout": 30}
    )
    snapshots = services.item_snapshots(run.id)
    outcomes = [
        ItemOutcome(
            id=s.id,
            item_index=s.item_index,
            run_index=0,
            item_key=s.item_key,
            status="ok",
            output="x",
            evaluations=[EvalOutcome("f", 1.0)],
        )
        for s in snapshots
    ]
    with django_assert_max_num_queries(12):
        assert services.record_item_outcomes(run.id, outcomes) == 500
    assert Evaluation.objects.filter(run=run).count() == 500
    assert Run.objects.get(id=run.id).finished_items == 500
    # recording the same outcomes again (a redelivered task) changes nothing
    assert services.record_item_outcomes(run.id, outcomes) == 0
    assert Run.objects.get(id=run.id).finished_items == 500


def test_a_batch_stores_each_items_own_values_whether_its_rows_share_them_or_not(project):
    # On SQLite a column with the same value in every row of a batch is sent once (`bulk_sql`):
    # what is stored is what each outcome held, of its type.
    from cobalt_app import services
    from cobalt_app.engine import ItemOutcome
    from cobalt_app.evaluators import EvalOutcome

    definition = define("shared", items(4), lambda c: "x")
    run = services.run_create(
        experiment=definition, settings={"runs": 1, "concurrency": 5, "timeout": 30}
    )
    snapshots = services.item_snapshots(run.id)
    # The first batch shares every column but the id; the second its items' scores (1 and
    # 1.0: of two types) and tokens (7 and 0) differ.
    varied = {2: (1, 7), 3: (1.0, 0)}

    def outcome(s, shared):
        score, tokens = (1.0, 7) if shared else varied[s.item_index]
        return ItemOutcome(
            id=s.id,
            item_index=s.item_index,
            run_index=0,
            item_key=s.item_key,
            status="ok",
            output={"n": 1},
            latency_ms=12.5,
            tokens=tokens,
            cost=0.5,
            evaluations=[EvalOutcome("f", score, reason="same", cached=True, tokens=tokens)],
        )

    first, second = snapshots[:2], snapshots[2:]
    assert services.record_item_outcomes(run.id, [outcome(s, True) for s in first]) == 2
    assert services.record_item_outcomes(run.id, [outcome(s, False) for s in second]) == 2
    stored = ItemResult.objects.filter(run=run).order_by("item_index")
    assert [(i.status, i.error, i.output, i.latency_ms, i.tokens, i.cost) for i in stored] == [
        ("ok", "", {"n": 1}, 12.5, 7, 0.5),
        ("ok", "", {"n": 1}, 12.5, 7, 0.5),
        ("ok", "", {"n": 1}, 12.5, 7, 0.5),
        ("ok", "", {"n": 1}, 12.5, 0, 0.5),
    ]
    scores = Evaluation.objects.filter(run=run).order_by("item__item_index")
    assert [(e.score, e.reason, e.cached, e.tokens) for e in scores] == [
        (1.0, "same", True, 7),
        (1.0, "same", True, 7),
        (1.0, "same", True, 7),
        (1.0, "same", True, 0),
    ]


def test_a_utc_datetime_is_sent_to_sqlite_as_the_text_django_would_send(project):
    from datetime import UTC, datetime

    from django.db import connection

    from cobalt_app import bulk_sql

    quick = bulk_sql.datetime_adapter()
    for value in (
        datetime(2026, 11, 27, 17, 0, 5, 123, tzinfo=UTC),
        datetime(2026, 1, 2, tzinfo=UTC),
    ):
        assert quick(value) == connection.ops.adapt_datetimefield_value(value)
    assert quick(None) is None


def test_an_embedded_run_claims_and_records_its_items_as_team_workers_do(project):
    # One engine: the embedded lanes take items with the claim of team mode (each item
    # claimed once, by this process) and never hold more than `concurrency` at once.
    running: list[int] = []
    most = 0
    lock = threading.Lock()

    def runner(ctx):
        nonlocal most
        with lock:
            running.append(ctx.index)
            most = max(most, len(running))
        time.sleep(0.02)
        with lock:
            running.remove(ctx.index)
        return "x"

    (run,) = execute(project, define("claimed", items(30), runner, concurrency=3))
    rows = list(ItemResult.objects.filter(run=run).values_list("status", "attempts", "worker"))
    assert {status for status, _, _ in rows} == {"ok"} and len(rows) == 30
    assert {attempts for _, attempts, _ in rows} == {1}
    assert {worker for _, _, worker in rows} == {f"{socket.gethostname()}:{os.getpid()}"}
    assert 1 < most <= 3
    assert Run.objects.get(id=run.id).status == "completed"


def test_no_item_waits_in_a_lane_while_another_lane_is_free(project):
    # The lanes share one queue of claimed items: towards the end a lane takes one item at a
    # time, so an item never waits behind a slow one while another lane has nothing to do.
    # Item 36 of 40 returns only once items 37-39 have finished: they must run beside it
    # (with a lane claiming for itself, its last claim held them behind it: it timed out).
    finished: set[int] = set()

    async def runner(ctx):
        if ctx.index == 36:
            deadline = time.monotonic() + 20
            while not {37, 38, 39} <= finished:
                if time.monotonic() > deadline:
                    return "37-39 waited behind 36"
                await asyncio.sleep(0.01)
        else:
            await asyncio.sleep(0.005)
        finished.add(ctx.index)
        return "x"

    (run,) = execute(project, define("pooled", items(40), runner, concurrency=2))
    outputs = dict(ItemResult.objects.filter(run=run).values_list("item_index", "output"))
    assert outputs[36] == "x"
    assert set(outputs.values()) == {"x"} and len(outputs) == 40
    assert Run.objects.get(id=run.id).status == "completed"


def test_lanes_do_not_wait_for_the_runs_status_while_its_last_answer_is_fresh():
    # A run's status is read again in the background once half a second old: a lane asking
    # after a second gets that newer answer at once (it waited for a read behind a commit,
    # every lane with it); a cancel is still seen within a second of a read.
    from cobalt_app.runs.lane import STATUS_TTL, RunStatuses

    status = {"r": "running"}

    async def db(fn, run_id):  # a read that waits 0.6 s behind a commit
        found = status[run_id]
        await asyncio.sleep(0.6)
        return found

    async def scenario() -> tuple[float, float]:
        statuses = RunStatuses(db)
        began = time.monotonic()
        assert await statuses.stopped("r") is False  # the first read is awaited
        await asyncio.sleep(max(0.0, began + 0.65 - time.monotonic()))
        assert await statuses.stopped("r") is False  # half a second old: read again, behind
        await asyncio.sleep(max(0.0, began + 1.4 - time.monotonic()))
        asked = time.monotonic()
        assert await statuses.stopped("r") is False
        waited = time.monotonic() - asked
        status["r"] = "cancelled"
        cancelled = time.monotonic()
        while not await statuses.stopped("r"):
            assert time.monotonic() - cancelled < 10, "the cancel was never seen"
            await asyncio.sleep(0.01)
        return waited, time.monotonic() - cancelled

    waited, seen_after = asyncio.run(scenario())
    assert waited < 0.3, waited
    assert seen_after < STATUS_TTL + 2 * 0.6 + 0.5, seen_after


def test_a_claim_on_sqlite_finds_its_items_by_id_not_by_scanning_every_pending_item(project):
    # SQLite planned the claim's "still pending" check from the (status, lease) index, which
    # visits every pending item of every run at each claim: a 50,000-item run claimed slowly.
    from django.db import connection

    from cobalt_app.runs import claims

    statements = {
        "pick by ids": (claims.SQLITE_PICK_IDS, 2, "INTEGER PRIMARY KEY"),
        "pick next": (claims.SQLITE_PICK_NEXT, 3, "item_run_status"),
        "claim": (claims.SQLITE_CLAIM, 5, "INTEGER PRIMARY KEY"),
        "read back": (claims.SQLITE_CLAIMED, 1, "INTEGER PRIMARY KEY"),
        "record's check": (claims.SQLITE_CURRENT, 1, "INTEGER PRIMARY KEY"),
    }
    for name, (sql, params, index) in statements.items():
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}", ["x"] * params)
            plan = " | ".join(str(row[-1]) for row in cursor.fetchall())
        assert "item_lease" not in plan, (name, plan)
        assert index in plan, (name, plan)


def test_a_run_gives_the_garbage_collector_back_as_it_found_it(project):
    # A run freezes what exists out of the collector's passes and collects less often; a
    # notebook or the MCP server running experiments keeps its own settings afterwards.
    import gc

    before = gc.get_threshold()
    seen: list[tuple] = []

    def runner(ctx):
        seen.append((gc.get_threshold(), gc.get_freeze_count() > 0))
        return "x"

    (run,) = execute(project, define("collector", items(3), runner))
    assert Run.objects.get(id=run.id).status == "completed"
    assert seen and all(threshold[0] > before[0] and frozen for threshold, frozen in seen)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
