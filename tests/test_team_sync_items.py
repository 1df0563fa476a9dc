"""Team lanes run an all-sync step's items in batches on a runner thread (`sync_items`), as
embedded lanes do, and keep team mode's guarantees: a killed worker's items run again and are
recorded once, an item whose lease went to another worker is not run (or is stopped) and not
recorded by the lane that lost it, a stopping worker hands back what it had not begun.

Real PostgreSQL, Redis, `cobalt worker` and CLI (tests/team_harness.py).
"""

from __future__ import annotations

import signal

import pytest

from tests.team_harness import Team, wait_for

pytestmark = pytest.mark.timeout(180)

# A sync runner and a sync function evaluator (what `sync_items.applies` takes): each
# execution logged as "<item id> <pid> <batched>" (batched: run by `sync_items.Batch._work`),
# its end as "<item id> <end>" in ends.log ("stopped": its agent was stopped).
SYNC = """
import os
import sys
import time
from pathlib import Path

from cobalt import Dataset, Evaluator, experiment

HERE = Path(__file__).resolve().parent.parent
LOG = HERE / "executions.log"
ENDS = HERE / "ends.log"


def batched():
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_qualname == "Batch._work":
            return True
        frame = frame.f_back
    return False


def has_answer(ctx):
    return 1.0 if "answer" in ctx.output else 0.0


@experiment(
    "team-sync",
    Dataset(items=[{"id": f"q{i}"} for i in range(__ITEMS__)]),
    evaluators=[Evaluator(name="has-answer", type="function", fn=has_answer)],
    concurrency=__CONCURRENCY__,
    timeout=__TIMEOUT__,
)
def run(ctx):
    with LOG.open("a") as fh:
        fh.write(f"{ctx.item['id']} {os.getpid()} {batched()}\\n")
    end = "done"
    try:
        for _ in range(__STEPS__ * (100 if ctx.item["id"] == "__SLOW__" else 1)):
            time.sleep(0.05)
    except BaseException:
        end = "stopped"
        raise
    finally:
        with ENDS.open("a") as fh:
            fh.write(f"{ctx.item['id']} {end}\\n")
    return f"the answer to {ctx.item['id']}"
"""


def write_sync(
    team: Team, *, items: int, concurrency: int, seconds: float, timeout: float = 30, slow=""
) -> None:
    """The sync experiment: each item takes `seconds` (the `slow` one a hundred times that)."""
    source = SYNC.replace("__ITEMS__", str(items)).replace("__CONCURRENCY__", str(concurrency))
    source = source.replace("__STEPS__", str(round(seconds / 0.05)))
    source = source.replace("__TIMEOUT__", repr(timeout)).replace("__SLOW__", slow)
    (team.folder / "experiments" / "demo.cobalt.py").write_text(source)


def executed(team: Team) -> list[tuple[str, int, bool]]:
    return [
        (item, int(pid), batched == "True")
        for item, pid, batched in (line.split() for line in team.executions())
    ]


def ends(team: Team) -> dict[str, list[str]]:
    log = team.folder / "ends.log"
    found: dict[str, list[str]] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        item, end = line.split()
        found.setdefault(item, []).append(end)
    return found


def recorded_once(team: Team, run_id: str, items: int) -> None:
    """Every item ok, one row each, one verdict each, counted once on the run."""
    assert team.item_statuses(run_id) == {"ok": items}
    rows = team.services.query(
        "SELECT count(*), count(DISTINCT item_key) FROM cobalt_app_itemresult WHERE run_id = %s",
        [run_id],
    )[0]
    assert rows == (items, items)
    evaluations = team.services.query(
        "SELECT count(*), count(DISTINCT item_id), min(score) FROM cobalt_app_evaluation "
        "WHERE run_id = %s",
        [run_id],
    )[0]
    assert evaluations == (items, items, 1.0)
    assert team.run_row(run_id)["finished_items"] == items


def item_row(team: Team, run_id: str, item_key: str) -> tuple[int, str, str, int]:
    return team.services.query(
        "SELECT id, status, worker, attempts FROM cobalt_app_itemresult "
        "WHERE run_id = %s AND item_key = %s",
        [run_id, item_key],
    )[0]


def test_a_worker_killed_mid_batch_loses_nothing_and_records_nothing_twice(team: Team):
    # 2 lanes claiming 24 // (2 * 2) = 6 items at a time, each claim one batch on a thread.
    write_sync(team, items=24, concurrency=2, seconds=0.4)
    doomed = team.start_worker("--concurrency=2")
    run = team.cli_background("run")
    wait_for(lambda: len(team.executions()) >= 5, timeout=60, what="items in flight")
    run_id = team.latest_run()
    doomed.popen.send_signal(signal.SIGKILL)
    doomed.popen.wait(timeout=10)
    assert team.item_statuses(run_id).get("running", 0) >= 2  # its batches' items, leased
    team.start_worker("--concurrency=2")

    assert run.wait(90) == 0, run.err()
    recorded_once(team, run_id, 24)
    runs = executed(team)
    assert all(batched for _, _, batched in runs)  # every item ran in a batch, not on the loop
    assert {item for item, _, _ in runs} == {f"q{i}" for i in range(24)}
    assert len(runs) > 24  # the killed worker's items ran again on the other one
    redone = team.services.query(
        "SELECT count(*) FROM cobalt_app_itemresult WHERE run_id = %s AND attempts = 2",
        [run_id],
    )[0][0]
    assert redone >= 2
    assert len([line for line in run.out().splitlines() if "✓ Item" in line]) == 24


def test_an_item_whose_lease_is_lost_mid_batch_is_skipped_and_its_new_claim_records_it(
    team: Team,
):
    # One lane: its first claim, 16 // 2 = 8 items, is one batch of 8 × 0.5 s.
    write_sync(team, items=16, concurrency=1, seconds=0.5)
    team.start_worker("--concurrency=1")
    run = team.cli_background("run")
    wait_for(lambda: team.executions(), timeout=60, what="the first item to start")
    run_id = team.latest_run()
    # Another worker takes the batch's last item (as if the lease had run out and the sweeper
    # had given it away): the heartbeat finds it gone, the batch's thread never begins it.
    item_id, status, worker, attempts = item_row(team, run_id, "q7")
    assert (status, attempts) == ("running", 1) and worker
    taken = team.services.query(
        "UPDATE cobalt_app_itemresult SET worker = 'another', attempts = attempts + 1 "
        "WHERE id = %s AND status = 'running' AND attempts = 1 RETURNING id",
        [item_id],
    )
    assert taken == [(item_id,)]

    # Its stolen lease is not renewed: it expires, the sweeper puts the item back, and the
    # lane claims it again (a third attempt) and records it.
    assert run.wait(90) == 0, run.err()
    recorded_once(team, run_id, 16)
    assert item_row(team, run_id, "q7")[1:] != ("running", "another", 2)
    assert item_row(team, run_id, "q7")[3] == 3
    assert all(batched for _, _, batched in executed(team))
    runs = [item for item, _, _ in executed(team)]
    assert runs.count("q7") == 1  # the batch skipped it; only its new claim ran it
    assert sorted(runs) == sorted(f"q{i}" for i in range(16))


def test_an_item_whose_lease_is_lost_while_it_runs_is_stopped_and_not_recorded(team: Team):
    write_sync(team, items=2, concurrency=1, seconds=20)
    team.start_worker("--concurrency=1")
    run = team.cli_background("run")
    wait_for(lambda: team.executions(), timeout=60, what="the first item to start")
    run_id = team.latest_run()
    item_id, status, _, attempts = item_row(team, run_id, "q0")
    assert (status, attempts) == ("running", 1)
    team.services.query(
        "UPDATE cobalt_app_itemresult SET worker = 'another', attempts = 2 WHERE id = %s "
        "RETURNING id",
        [item_id],
    )
    # The heartbeat finds the lease gone: the running agent is stopped, long before its 20 s.
    wait_for(lambda: ends(team).get("q0"), timeout=15, what="the agent to stop")
    assert ends(team)["q0"] == ["stopped"]
    assert executed(team)[0][::2] == ("q0", True)
    assert item_row(team, run_id, "q0")[1:] == ("running", "another", 2)  # not recorded
    assert team.cli("cancel", run_id).returncode == 0
    assert run.wait(30) == 1


def test_a_stopping_worker_hands_back_the_batch_items_it_had_not_begun(team: Team):
    # Two lanes of 20 // (2 * 2) = 5 items at a time, 1 s each.
    write_sync(team, items=20, concurrency=2, seconds=1.0)
    first = team.start_worker("--concurrency", "2", env={"COBALT_SHUTDOWN_GRACE": "5"})
    run = team.cli_background("run")
    wait_for(lambda: len(team.executions()) >= 3, timeout=60, what="a few items started")
    first.popen.send_signal(signal.SIGTERM)
    assert first.wait(8) == 0, first.err()
    mine = [item for item, pid, _ in executed(team) if pid == first.popen.pid]
    assert len(mine) <= 6  # the two items running, perhaps the next two: not the batches
    run_id = team.latest_run()
    statuses = team.item_statuses(run_id)
    assert statuses.get("running", 0) == 0  # handed back, not left to expire
    assert statuses.get("ok", 0) >= len(mine) - 2  # what it ran within the grace, recorded

    team.start_worker("--concurrency", "2")
    assert run.wait(120) == 0, run.out() + run.err()
    recorded_once(team, run_id, 20)
    assert all(batched for _, _, batched in executed(team))
    runs = [item for item, _, _ in executed(team)]
    assert sorted(set(runs)) == sorted(f"q{i}" for i in range(20))
    assert len(runs) == 20  # nothing began twice: the started items finished within the grace


def test_a_batch_recorded_as_one_json_value_reads_back_as_the_values_sent(team: Team):
    # `bulk_sql._records` / `_recordset`: what `items_record_claimed` sends PostgreSQL.
    from datetime import UTC, datetime

    from cobalt_app import bulk_sql

    names = ("f", "t", "s", "j", "i", "b")
    types = ("float8", "timestamptz", "text", "jsonb", "int4", "bool")
    now = datetime.now(UTC)
    rows = [
        (float("nan"), now, 'é "q" \\ {x}', '{"k": [1, "é"]}', 3.0, True),
        (float("-inf"), None, None, None, 2, False),
        (0.5, now, "", "null", 0, None),
    ]
    sql = f"SELECT f::text, t, s, j::jsonb, i, b FROM {bulk_sql._recordset(names, types)}"
    got = team.services.query(sql, [bulk_sql._records(rows, names, types)])
    assert got == [
        ("NaN", now, 'é "q" \\ {x}', {"k": [1, "é"]}, 3, True),
        ("-Infinity", None, None, None, 2, False),
        ("0.5", now, "", None, 0, None),
    ]
    assert bulk_sql._records([], names, types) == "[]"


def test_an_item_timing_out_in_a_workers_batch_fails_as_through_the_loop_and_the_rest_run(
    team: Team,
):
    write_sync(team, items=6, concurrency=1, seconds=0.1, timeout=1, slow="q2")
    team.start_worker("--concurrency=1")
    result = team.cli("run")
    assert result.returncode == 0, result.stderr  # the run ends; its item failed alone
    run_id = team.latest_run()
    assert team.item_statuses(run_id) == {"ok": 5, "timeout": 1}
    error = team.services.query(
        "SELECT error FROM cobalt_app_itemresult WHERE run_id = %s AND status = 'timeout'",
        [run_id],
    )[0][0]
    assert error == "timed out after 1s (its code was stopped)"
    assert ends(team)["q2"] == ["stopped"]
    assert all(batched for _, _, batched in executed(team))
    assert sorted(item for item, _, _ in executed(team)) == [f"q{i}" for i in range(6)]
