"""An experiment's `concurrency` holds across team workers, on a quiet or a loaded machine (the
loaded one: tests/test_team_concurrency_loaded.py).

Every execution of the team experiment (tests/team_harness.py) appends its start and end to
spans.log — cancelled and failed ones too — so the most items in flight at once is read from
what the agents did, not from what the database says.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from cobalt_app import team_broker, team_lanes
from tests.team_harness import REDIS_URL, Team

pytestmark = pytest.mark.timeout(240)

SHORT_VISIBILITY = {"COBALT_VISIBILITY_TIMEOUT": "3"}


def most_at_once(spans_log: Path) -> tuple[int, int]:
    """(executions, the most that ran at the same time) from the experiment's spans.log."""
    spans = [tuple(map(float, line.split())) for line in spans_log.read_text().splitlines()]
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running, most = 0, 0
    for _, change in events:
        running += change
        most = max(most, running)
    return len(spans), most


def assert_each_item_ran_once(team: Team, items: int) -> None:
    """Every item executed once (no execution cancelled and redone) and recorded `ok`."""
    executions = team.executions()
    assert len(executions) == items, executions
    assert len({line.split()[0] for line in executions}) == items, executions
    assert team.item_statuses(team.latest_run()) == {"ok": items}


def test_the_experiments_concurrency_holds_across_workers(team: Team):
    team.write_experiment(items=12, delay=0.4, concurrency=2, call_agent=False)
    workers = [team.start_worker(), team.start_worker()]  # 8 threads in all, 2 asked for
    result = team.cli("run")
    assert result.returncode == 0, result.stderr
    for worker in workers:
        assert "raised unexpected" not in worker.err()  # no lane failed along the way
    assert most_at_once(team.folder / "spans.log") == (12, 2)
    assert_each_item_ran_once(team, 12)


def test_a_run_longer_than_the_visibility_timeout_keeps_its_concurrency(team: Team):
    # Redis gives an unacknowledged message to a worker again after the visibility timeout
    # (checked every 10 s): a lane that held its message for the whole run would gain a twin.
    team.write_experiment(items=36, delay=1.0, concurrency=2, call_agent=False)
    workers = [team.start_worker(env=SHORT_VISIBILITY), team.start_worker(env=SHORT_VISIBILITY)]
    result = team.cli("run", timeout=180)
    assert result.returncode == 0, result.stderr
    for worker in workers:
        assert "raised unexpected" not in worker.err()
    assert most_at_once(team.folder / "spans.log") == (36, 2)
    assert_each_item_ran_once(team, 36)


def test_a_runs_slots_go_to_one_lane_each_and_a_lane_that_lost_its_slot_learns_it(monkeypatch):
    client = redis.Redis.from_url(REDIS_URL)
    monkeypatch.setattr(team_broker, "_redis", client)
    monkeypatch.setenv("COBALT_LEASE_GRACE", "30")
    run_id = f"slots-{time.monotonic_ns()}"
    here, there = team_lanes.Slots("worker-a"), team_lanes.Slots("worker-b")
    first, second = here.take(run_id, 2), there.take(run_id, 2)
    assert first is not None and second is not None and first.key != second.key
    assert there.take(run_id, 2) is None  # a third lane of a run with concurrency 2
    assert team_lanes.lanes_held(run_id, 2) == 2
    assert 29_000 < client.pttl(first.key) <= 30_000

    client.delete(first.key)  # expired while nobody wanted it: renewing takes it back
    assert here.renew() == [] and client.get(first.key) == first.token.encode()
    client.set(first.key, "another lane")  # expired, and another lane took it
    assert here.renew() == [first]
    here.release(first)  # the lane stops; the other lane's slot stays its own
    assert client.get(first.key) == b"another lane"

    there.release(second)
    assert team_lanes.lanes_held(run_id, 2) == 1
    third = there.take(run_id, 2)
    assert third is not None and third.key == second.key
    there.release(third)
    client.delete(first.key)
    assert team_lanes.lanes_held(run_id, 2) == 0
