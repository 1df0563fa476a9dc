"""Team mode's claim cursor (`team_cursor`): lanes take a run's next items by primary-key range,
and whatever the cursor skips or forgets is still claimed, once.

Real PostgreSQL, Redis, `cobalt worker` and CLI (tests/team_harness.py).
"""

from __future__ import annotations

import pytest

from tests.team_harness import Team, wait_for

pytestmark = pytest.mark.timeout(180)


def created_run(team: Team) -> str | None:
    """The run `cobalt run` created (no worker is started yet), once it exists."""
    rows = team.services.query(
        "SELECT id FROM cobalt_app_run WHERE config->>'queue' = %s", [team.queue]
    )
    return rows[0][0] if rows else None


def test_items_the_claim_cursor_skipped_are_still_claimed_once_each(team: Team):
    # 60 items, 4 lanes: the first messages name the first few, the cursor hands out the rest.
    team.write_experiment(items=60, concurrency=4, call_agent=False)
    run = team.cli_background("run")  # no worker yet: the lanes wait in the queue
    run_id = wait_for(lambda: created_run(team), timeout=60, what="the run")
    client = team.services.redis()
    key = f"cobalt:cursor:{run_id}"
    wait_for(lambda: client.exists(key), timeout=60, what="the run's claim cursor")
    first, end = (int(client.hget(key, field)) for field in ("next", "end"))
    ids = [
        row[0]
        for row in team.services.query(
            "SELECT id FROM cobalt_app_itemresult WHERE run_id = %s ORDER BY id", [run_id]
        )
    ]
    assert ids[0] < first < ids[-1] and end == ids[-1] + 1
    client.hincrby(key, "next", 10)  # as if lanes had taken 10 ids and died before claiming

    team.start_worker()
    assert run.wait(150) == 0, run.err()
    assert team.item_statuses(run_id) == {"ok": 60}
    assert team.services.query(
        "SELECT max(attempts), min(attempts) FROM cobalt_app_itemresult WHERE run_id = %s",
        [run_id],
    )[0] == (1, 1)
    assert team.run_row(run_id)["finished_items"] == 60
    evaluations = team.services.query(
        "SELECT count(*), count(DISTINCT item_id) FROM cobalt_app_evaluation WHERE run_id = %s",
        [run_id],
    )[0]
    assert evaluations == (120, 60)  # the judge and has-answer, once per item
    assert int(client.hget(key, "next")) >= end  # the lanes went through the whole range


def test_a_run_whose_claim_cursor_vanished_finishes_by_query(team: Team):
    team.write_experiment(items=40, concurrency=4, call_agent=False)
    run = team.cli_background("run")
    run_id = wait_for(lambda: created_run(team), timeout=60, what="the run")
    client = team.services.redis()
    wait_for(lambda: client.exists(f"cobalt:cursor:{run_id}"), timeout=60, what="the cursor")
    client.delete(f"cobalt:cursor:{run_id}")  # Redis restarted, or evicted it

    team.start_worker()
    assert run.wait(150) == 0, run.err()
    assert team.item_statuses(run_id) == {"ok": 40}
    assert team.run_row(run_id)["finished_items"] == 40
