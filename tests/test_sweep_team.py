"""A sweep in team mode: PostgreSQL, Redis, a real `cobalt worker`, the real CLI and
dashboard (tests/team_harness.py). Every variant's run is executed by the workers; nobody
following it, the worker that finalises its last run analyses the sweep and writes its
results file; an interrupted variant resumes with `cobalt run --resume SWEEP`."""

from __future__ import annotations

import json
import signal
import time

import httpx
import pytest

from tests.conftest import logged_in
from tests.team_harness import Team, wait_for

PASSWORD = "a long enough password"

pytestmark = pytest.mark.timeout(240)

SWEEP_FILE = """
import asyncio
import os
from pathlib import Path

from cobalt import Dataset, Evaluator, experiment

HERE = Path(__file__).resolve().parent.parent
LOG = HERE / "executions.log"
HOLD = HERE / "hold-k3"  # while it exists, k=3's items wait (up to a minute)


async def answer(ctx):
    with LOG.open("a") as fh:
        fh.write(f"{ctx.variant['k']} {ctx.item['id']} {os.getpid()}\\n")
    await asyncio.sleep(0.1)
    for _ in range(1200):
        if ctx.variant["k"] != 3 or not HOLD.exists():
            break
        await asyncio.sleep(0.05)
    return str(ctx.item["n"] * ctx.variant["k"])


experiment(
    "tsweep",
    Dataset(items=[{"id": f"t{i}", "n": i} for i in range(10)]),
    answer,
    evaluators=[Evaluator(name="even", type="function",
                          fn=lambda c: float(int(c.output) % 2 == 0))],
    variants={"k": [1, 2, 3]},
    concurrency=2,
)
"""


def runs_by_label(team: Team) -> dict[str, dict]:
    rows = team.services.query(
        "SELECT variant->>'label', id, status, mode, sweep_id FROM cobalt_app_run "
        "WHERE config->>'queue' = %s ORDER BY created_at",
        [team.queue],
    )
    return {r[0]: {"id": r[1], "status": r[2], "mode": r[3], "sweep": r[4]} for r in rows}


def stored_analysis(team: Team, sweep_id: str) -> tuple[dict, object]:
    summary, analysed_at = team.services.query(
        "SELECT summary, analysed_at FROM cobalt_app_sweep WHERE id = %s", [sweep_id]
    )[0]
    return summary, analysed_at


def sweep_file(team: Team, sweep_id: str) -> dict:
    (path,) = (team.folder / ".cobalt" / "results").glob(f"*_sweep_{sweep_id}.json")
    return json.loads(path.read_text())["sweep"]


def executions(team: Team) -> list[tuple[str, str, int]]:
    return [(k, item, int(pid)) for k, item, pid in (line.split() for line in team.executions())]


def dashboard(team: Team) -> httpx.Client:
    """`cobalt serve` on the team's database, and a client logged in to it (team mode asks
    for a login)."""
    team.create_user("ana", PASSWORD)
    return logged_in(team.serve(), "ana", PASSWORD)


def sweep_page(client: httpx.Client, sweep_id: str) -> str:
    response = client.get(f"/sweeps/{sweep_id}/")
    assert response.status_code == 200, response.text[:500]
    return response.text


def test_a_sweep_runs_on_the_workers_settles_there_and_resumes(team: Team):
    (team.folder / "experiments" / "sweep.cobalt.py").write_text(SWEEP_FILE)
    (team.folder / "hold-k3").write_text("")
    worker = team.start_worker()
    run = team.cli_background("run")
    wait_for(lambda: len(runs_by_label(team)) == 3, timeout=60, what="the three variant runs")
    wait_for(lambda: any(k == "3" for k, _, _ in executions(team)), timeout=60, what="k=3 to start")
    run.popen.send_signal(signal.SIGINT)  # detached: the runs go on on the workers
    assert run.wait(30) == 130
    runs = runs_by_label(team)
    (sweep_id,) = {r["sweep"] for r in runs.values()}
    cancelled = team.cli("cancel", runs["k=3"]["id"])  # the slowest variant, interrupted
    assert cancelled.returncode == 0, cancelled.stderr

    # Nobody follows the sweep: whoever finalises its last run (a worker, or the cancel)
    # analyses it and writes its results file.
    summary, analysed_at = wait_for(
        lambda: (found := stored_analysis(team, sweep_id))[1] is not None and found,
        timeout=90,
        what="the sweep to be analysed when its last run ended",
    )
    runs = runs_by_label(team)
    assert [runs[k]["status"] for k in ("k=1", "k=2", "k=3")] == [
        "completed", "completed", "cancelled"
    ]  # fmt: skip
    assert summary["unfinished"] == ["k=3"] and not summary["complete"]
    assert sweep_file(team, sweep_id)["unfinished"] == ["k=3"]
    client = dashboard(team)
    html = sweep_page(client, sweep_id)
    assert f"Resume with <code>cobalt run --resume {sweep_id}</code>" in html
    assert stored_analysis(team, sweep_id)[1] == analysed_at  # the page wrote nothing

    ok_before = {
        key
        for (key,) in team.services.query(
            "SELECT item_key FROM cobalt_app_itemresult WHERE run_id = %s AND status = 'ok'",
            [runs["k=3"]["id"]],
        )
    }
    count_before = len(team.executions())
    (team.folder / "hold-k3").unlink()
    resumed = team.cli("run", "--resume", sweep_id)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"Sweep tsweep ({sweep_id})" in resumed.stdout and "Best: k=2" in resumed.stdout
    again = executions(team)[count_before:]
    assert {k for k, _, _ in again} == {"3"}  # completed variants were left as they were
    assert {item for _, item, _ in again} == {f"t{i}" for i in range(10)} - ok_before

    # Every item of every variant was executed by the worker, once its run was resumed.
    assert {pid for _, _, pid in executions(team)} == {worker.popen.pid}
    runs = runs_by_label(team)
    assert {(r["status"], r["mode"]) for r in runs.values()} == {("completed", "team")}
    unassigned = team.services.query(
        "SELECT count(*) FROM cobalt_app_itemresult i JOIN cobalt_app_run r ON r.id = i.run_id "
        "WHERE r.sweep_id = %s AND (i.worker = '' OR i.status <> 'ok')",
        [sweep_id],
    )
    assert unassigned == [(0,)]
    summary, settled_at = stored_analysis(team, sweep_id)
    assert summary["complete"] and settled_at > analysed_at and summary["best"] == "k=2"
    written = sweep_file(team, sweep_id)
    assert written["complete"] and [v["items"] for v in written["variants"]] == [10, 10, 10]
    started = time.monotonic()
    html = sweep_page(client, sweep_id)
    assert time.monotonic() - started < 10
    assert "Resume with" not in html and html.count('<tr data-variant="k=') == 3
    assert stored_analysis(team, sweep_id)[1] == settled_at
