"""Team mode when things go wrong: workers killed mid-run (alone or with the processes of a
`cobalt worker --processes N`), messages lost, runs cancelled, the client interrupted or
detached, outcomes the database refuses. (Split from tests/test_team.py so that the two halves
run on two xdist workers at once.)

See tests/team_harness.py for how the services, queues and compose commands are set up.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.team_harness import Team, results_document, wait_for

pytestmark = pytest.mark.timeout(180)


def item_counts(team: Team, run_id: str) -> tuple[int, int, int]:
    """(rows, distinct items, most attempts of one item) of a run."""
    return team.services.query(
        "SELECT count(*), count(DISTINCT (item_index, run_index)), max(attempts) "
        "FROM cobalt_app_itemresult WHERE run_id = %s",
        [run_id],
    )[0]


def test_a_killed_worker_is_replaced_and_every_item_is_recorded_once(team: Team):
    team.write_experiment(items=20, delay=0.6)
    doomed = team.start_worker()
    run = team.cli_background("run")
    run_id = wait_for(lambda: team.services.query(
        "SELECT id FROM cobalt_app_run WHERE config->>'queue' = %s", [team.queue]
    ), timeout=60, what="the run")[0][0]  # fmt: skip

    def working() -> bool:
        statuses = team.item_statuses(run_id)
        return statuses.get("ok", 0) >= 4 and statuses.get("running", 0) >= 2

    wait_for(working, timeout=60, what="items in flight")
    doomed.popen.send_signal(signal.SIGKILL)
    doomed.popen.wait(timeout=10)
    held = team.item_statuses(run_id).get("running", 0)
    assert held >= 1  # the dead worker's items are still leased to it
    team.start_worker()

    assert run.wait(90) == 0, run.err()
    assert team.item_statuses(run_id) == {"ok": 20}
    counts = item_counts(team, run_id)
    assert counts[:2] == (20, 20)
    assert counts[2] == 2  # the items the killed worker held were claimed a second time
    evaluations = team.services.query(
        "SELECT count(*), count(DISTINCT (item_id, evaluator)) FROM cobalt_app_evaluation "
        "WHERE run_id = %s",
        [run_id],
    )[0]
    assert evaluations == (40, 40)
    assert team.run_row(run_id)["finished_items"] == 20
    assert len(team.executions()) > 20  # the agent did run twice for the redone items
    lines = [line for line in run.out().splitlines() if "✓ Item" in line]
    assert len(lines) == 20  # … but each item is reported once
    assert len(results_document(team, run_id)["items"]) == 20


def test_items_claimed_together_by_a_lane_survive_a_killed_worker(team: Team):
    # 24 items, 2 worker threads: each lane claims six items at a time, in one statement.
    team.write_experiment(items=24, delay=0.5)
    doomed = team.start_worker("--concurrency=2")
    run = team.cli_background("run")
    wait_for(lambda: team.executions(), timeout=60, what="the first item to start")
    run_id = team.latest_run()
    held = wait_for(
        lambda: team.item_statuses(run_id).get("running", 0) > 2, timeout=30, what="claims"
    )
    assert held  # more items leased than threads: each lane holds the items it claimed
    doomed.popen.send_signal(signal.SIGKILL)
    doomed.popen.wait(timeout=10)
    team.start_worker()

    assert run.wait(90) == 0, run.err()
    assert team.item_statuses(run_id) == {"ok": 24}
    counts = item_counts(team, run_id)
    assert counts == (24, 24, 2)
    assert team.run_row(run_id)["finished_items"] == 24
    assert len([line for line in run.out().splitlines() if "✓ Item" in line]) == 24


def test_cancel_stops_the_items_waiting_in_a_workers_lanes(team: Team):
    team.write_experiment(items=40, delay=1.0, timeout=10)
    worker = team.start_worker("--concurrency=2")  # lanes of 8 items at a time: 16 claimed
    run = team.cli_background("run")
    wait_for(lambda: team.executions(), timeout=60, what="the first item to start")
    run_id = team.latest_run()
    wait_for(lambda: team.item_statuses(run_id).get("running", 0) > 2, timeout=30, what="claims")
    assert team.cli("cancel", run_id).returncode == 0
    assert run.wait(30) == 1
    statuses = team.item_statuses(run_id)
    assert statuses.get("cancelled", 0) >= 30 and sum(statuses.values()) == 40
    # Each thread stops the item it is on, then skips the rest of what its lane claimed.
    started = team.wait_worker_idle(worker)
    assert started <= 6, team.executions()  # of the 16 items its two threads had claimed


def test_lost_messages_are_sent_again_and_an_item_that_kills_workers_is_abandoned(team: Team):
    team.write_experiment(items=5)
    run = team.cli_background("run")
    wait_for(lambda: "waiting for workers" in run.err(), timeout=60, what="the run to wait")
    run_id = team.latest_run()
    client = team.services.redis()
    for key in client.scan_iter(f"{team.queue}*"):  # the queued messages vanish
        client.delete(key)
    # One item was held by workers that died three times already.
    team.services.query(
        "UPDATE cobalt_app_itemresult SET status = 'running', attempts = 3, worker = 'ghost:1', "
        "lease_expires_at = now() - interval '1 minute' WHERE run_id = %s AND item_index = 2 "
        "RETURNING id",
        [run_id],
    )
    team.start_worker()
    assert run.wait(60) == 0, run.err()
    assert team.item_statuses(run_id) == {"ok": 4, "error": 1}
    error = team.services.query(
        "SELECT error FROM cobalt_app_itemresult WHERE run_id = %s AND status = 'error'",
        [run_id],
    )[0][0]
    assert error.startswith("abandoned: the worker executing this item stopped responding 3 times")
    assert "✗ Item 3/5 — error: abandoned" in run.out()
    assert sorted(line.split()[0] for line in team.executions()) == ["q0", "q1", "q3", "q4"]


def test_an_outcome_the_database_refuses_fails_alone(team: Team):
    (team.folder / "experiments" / "nul.cobalt.py").write_text(
        "from cobalt import Dataset, experiment\n\n"
        "@experiment('nul', Dataset(items=[{'id': i} for i in range(4)]))\n"
        "def run(ctx):\n"
        "    return 'bad \\u0000 byte' if ctx.index == 1 else 'fine'\n"
    )
    team.start_worker()
    result = team.cli("run")
    assert result.returncode == 0, result.stderr
    run_id = team.latest_run()
    assert team.item_statuses(run_id) == {"ok": 3, "error": 1}
    error = team.services.query(
        "SELECT error FROM cobalt_app_itemresult WHERE run_id = %s AND status = 'error'",
        [run_id],
    )[0][0]
    assert error.startswith("the agent's result could not be stored as it is")
    assert "output contains a NUL character" in error


def test_one_worker_command_can_run_several_processes(team: Team):
    team.write_experiment(items=12, delay=0.2)
    supervisor = team.start_worker_processes(2, concurrency=4)
    children = team.workers_on_queue
    assert {w["concurrency"] for w in children()} == {2}
    result = team.cli("run")
    assert result.returncode == 0, result.stderr
    per_worker = team.services.query(
        "SELECT count(DISTINCT worker) FROM cobalt_app_itemresult WHERE run_id = %s",
        [team.latest_run()],
    )
    assert per_worker == [(2,)]
    # A process killed (even right after it started) is replaced; the others go on.
    known = {w["pid"] for w in children()}
    for _ in range(2):
        os.kill(max(known), signal.SIGKILL)  # the second time: the replacement, just started
        fresh = wait_for(
            lambda known=frozenset(known): {w["pid"] for w in children()} - known,
            timeout=60,
            what="a replacement process",
        )
        known |= fresh
    assert supervisor.popen.poll() is None
    supervisor.popen.send_signal(signal.SIGTERM)
    assert supervisor.wait(30) == 0
    wait_for(lambda: not children(), timeout=10, what="the processes to unregister")


def test_the_processes_of_a_killed_worker_command_stop_too(team: Team):
    supervisor = team.start_worker_processes(2, concurrency=4)
    children = team.workers_on_queue
    pids = [w["pid"] for w in children()]
    supervisor.popen.send_signal(signal.SIGKILL)
    supervisor.popen.wait(timeout=10)
    wait_for(lambda: not children(), timeout=20, what="the orphaned processes to unregister")

    def gone(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        return state in ("Z", "X")  # exited, waiting to be reaped

    wait_for(lambda: all(gone(pid) for pid in pids), timeout=20, what="the processes to exit")


def test_cancel_stops_a_running_run_and_its_workers_drop_the_items(team: Team):
    team.write_experiment(items=60, delay=1.5, timeout=10)
    worker = team.start_worker()
    run = team.cli_background("run")
    wait_for(lambda: team.executions(), timeout=60, what="the first item to start")
    run_id = team.latest_run()

    cancelled = team.cli("cancel", run_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"Cancelled run {run_id}" in cancelled.stdout
    assert run.wait(30) == 1  # `cobalt run` reports the cancellation with exit code 1
    assert team.run_row(run_id)["status"] == "cancelled"
    statuses = team.item_statuses(run_id)
    assert statuses.get("cancelled", 0) >= 20 and sum(statuses.values()) == 60
    assert "pending" not in statuses and "running" not in statuses

    # The worker notices at its next heartbeat and stops the agents it was running.
    team.wait_worker_idle(worker)
    again = team.cli("cancel", run_id)
    assert "already cancelled" in again.stdout


def interrupted_run(team: Team, items: int, delay: float) -> str:
    """A team run left by its client (Ctrl-C after the first item) that tells how to re-attach;
    its id."""
    team.write_experiment(items=items, delay=delay)
    team.start_worker()
    run = team.cli_background("run")
    wait_for(lambda: "✓ Item" in run.out(), timeout=60, what="a first item line")
    run.popen.send_signal(signal.SIGINT)
    assert run.wait(30) == 130
    run_id = team.latest_run()
    assert f"re-attach with cobalt watch {run_id}" in run.err()
    return run_id


def test_ctrl_c_leaves_the_run_going_and_watch_reattaches(team: Team):
    run_id = interrupted_run(team, items=10, delay=0.4)
    assert team.run_row(run_id)["status"] in ("running", "completed")

    watched = team.cli("watch", run_id)
    assert watched.returncode == 0, watched.stderr
    assert sum("✓ Item" in line for line in watched.stdout.splitlines()) == 10
    assert f"Run ID: {run_id}" in watched.stdout
    assert team.run_row(run_id)["status"] == "completed"
    assert len(results_document(team, run_id)["items"]) == 10


def test_a_detached_runs_results_file_is_written_when_the_workers_finish_it(team: Team):
    # Nobody follows the run after Ctrl-C: its finalisation on the worker writes the file.
    run_id = interrupted_run(team, items=8, delay=0.3)
    row = wait_for(
        lambda: (row := team.run_row(run_id))["status"] == "completed" and row,
        timeout=60,
        what="the workers to finish the run",
    )
    assert row["results_path"].endswith(f"_{run_id}.json")
    document = results_document(team, run_id)
    assert [i["status"] for i in document["items"]] == ["ok"] * 8
    assert document["status"] == "completed"


def test_a_bad_processes_value_is_refused_before_anything_starts(team: Team):
    result = team.cli("worker", "--processes=many")
    assert result.returncode == 2
    assert "--processes must be `auto` or a number from 1 to 64, not 'many'" in result.stderr
