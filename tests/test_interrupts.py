"""Interrupted runs never stay `running`: SIGTERM, SIGHUP, a closed pipe, a killed process.

The real `cobalt run` in a subprocess. The experiment's first items finish at once; the others
wait for a `release` file, so a signal always finds the run with some items done and some not.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from cobalt_app import liveness, services
from cobalt_app.models import Run
from tests.conftest import Project, cli_env

DEADLINE = 60.0
ITEMS = 8
QUICK = 3  # items 0..2 finish at once, with concurrency 3 the next three block

BLOCKING = f"""
import asyncio
from pathlib import Path
from cobalt import Dataset, Evaluator, experiment

HERE = Path(__file__).resolve().parent.parent

@experiment("blocking", Dataset(items=[{{"id": i}} for i in range({ITEMS})]), concurrency=3,
            evaluators=[Evaluator(name="f", type="function", fn=lambda c: 1.0)])
async def run(ctx):
    while ctx.item["id"] >= {QUICK} and not (HERE / "release").exists():
        await asyncio.sleep(0.02)
    with open(HERE / "executed.log", "a") as log:
        log.write(f"{{ctx.item['id']}}\\n")
    return "ok"
"""


@pytest.fixture
def blocking(project: Project) -> Project:
    project.write("experiments/blocking.cobalt.py", BLOCKING)
    return project


def start(project: Project, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cobalt_cli", "run", *args],
        cwd=project.path,
        env=cli_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def query(project: Project, sql: str) -> list[tuple]:
    if not project.db_path.exists():
        return []
    with sqlite3.connect(project.db_path) as db:
        try:
            return db.execute(sql).fetchall()
        except sqlite3.OperationalError:  # the tables are not there yet
            return []


def wait_for_quick_items(project: Project, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + DEADLINE
    ok = "select count(*) from cobalt_app_itemresult where status = 'ok'"
    while query(project, ok) != [(QUICK,)]:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the quick items were not recorded"
        time.sleep(0.05)


def item_statuses(project: Project) -> dict[str, int]:
    rows = query(project, "select status, count(*) from cobalt_app_itemresult group by status")
    return dict(rows)


def resume_completes_only_the_missing_items(project: Project, run_id: str) -> None:
    (project.path / "release").touch()
    resumed = start(project, "--resume", run_id)
    out, err = resumed.communicate(timeout=DEADLINE)
    assert resumed.returncode == 0, err
    assert query(project, "select status, finished_items from cobalt_app_run") == [
        ("completed", ITEMS)
    ]
    executed = (project.path / "executed.log").read_text().split()
    assert sorted(executed, key=int) == [str(i) for i in range(ITEMS)]  # each item once


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_and_sighup_cancel_the_run_like_ctrl_c_and_name_it_for_resume(
    blocking, signum, code
):
    process = start(blocking)
    wait_for_quick_items(blocking, process)
    process.send_signal(signum)
    out, err = process.communicate(timeout=DEADLINE)

    assert process.returncode == code, err
    [(run_id, status)] = query(blocking, "select id, status from cobalt_app_run")
    assert status == "cancelled"
    assert f"cobalt run --resume {run_id}" in err
    assert item_statuses(blocking) == {"ok": QUICK, "cancelled": ITEMS - QUICK}
    resume_completes_only_the_missing_items(blocking, run_id)


def test_a_closed_output_pipe_cancels_the_run_and_exits_at_once(project):
    project.write(
        "experiments/chatty.cobalt.py",
        """
        import asyncio
        from cobalt import Dataset, experiment

        @experiment("chatty", Dataset(items=[{"id": i} for i in range(2000)]), concurrency=2)
        async def run(ctx):
            await asyncio.sleep(0.01)
            return "ok"
        """,
    )
    command = f"{shlex.quote(sys.executable)} -m cobalt_cli run | head -3"
    pipeline = subprocess.Popen(
        ["bash", "-c", command],
        cwd=project.path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a hung `cobalt run` is killed too
    )
    try:
        out, err = pipeline.communicate(timeout=20)
    except subprocess.TimeoutExpired:  # before the fix: the event-loop thread died, it hung
        os.killpg(pipeline.pid, signal.SIGKILL)
        pipeline.communicate()
        pytest.fail("`cobalt run | head -3` did not exit within 20 s")
    assert len(out.splitlines()) == 3
    [(run_id, status)] = query(project, "select id, status from cobalt_app_run")
    assert status == "cancelled"
    assert f"cobalt run --resume {run_id}" in err


def test_a_killed_run_reads_as_interrupted_after_the_grace_period_and_resumes(blocking, cobalt_cli):
    grace = {"COBALT_RUN_GRACE": "1"}
    process = start(blocking, env=grace)
    wait_for_quick_items(blocking, process)
    process.kill()
    process.communicate(timeout=DEADLINE)
    [(run_id, status)] = query(blocking, "select id, status from cobalt_app_run")
    assert status == "running"  # nobody could say otherwise before dying

    deadline = time.monotonic() + DEADLINE
    while True:
        shown = cobalt_cli(blocking, "history", env=grace)
        assert shown.returncode == 0, shown.stderr
        if "interrupted" in shown.stdout:
            break
        assert "running" in shown.stdout
        assert time.monotonic() < deadline, "the killed run still reads as running"
    assert query(blocking, "select status from cobalt_app_run") == [("interrupted",)]
    assert item_statuses(blocking) == {"ok": QUICK, "pending": ITEMS - QUICK}
    resume_completes_only_the_missing_items(blocking, run_id)


def test_resume_refuses_a_run_another_process_is_executing_and_keeps_both_durations(blocking):
    first = start(blocking)
    wait_for_quick_items(blocking, first)
    [(run_id,)] = query(blocking, "select id from cobalt_app_run")

    second = start(blocking, "--resume", run_id)
    out, err = second.communicate(timeout=DEADLINE)
    assert second.returncode == 2, out + err
    assert f"run {run_id} is still being executed by another process" in err
    assert (blocking.path / "executed.log").read_text().split() == ["0", "1", "2"]

    first.send_signal(signal.SIGTERM)  # cancelled after some seconds of work
    first.communicate(timeout=DEADLINE)
    [(before,)] = query(blocking, "select duration_ms from cobalt_app_run")
    assert before > 0
    resume_completes_only_the_missing_items(blocking, run_id)
    [(after,)] = query(blocking, "select duration_ms from cobalt_app_run")
    assert after > before  # the resumed part is added, not put in the place of the first


def test_cobalt_cancel_stops_an_embedded_run_started_in_another_terminal(blocking, cobalt_cli):
    process = start(blocking)
    wait_for_quick_items(blocking, process)
    [(run_id,)] = query(blocking, "select id from cobalt_app_run")

    cancelled = cobalt_cli(blocking, "cancel", run_id[:6])
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert f"Cancelled run {run_id}" in cancelled.stdout
    out, err = process.communicate(timeout=DEADLINE)  # it notices within its beat (2 s)
    assert process.returncode == 1, out + err  # the cancelled status, not a crash or a hang
    assert query(blocking, "select status from cobalt_app_run") == [("cancelled",)]
    assert item_statuses(blocking) == {"ok": QUICK, "cancelled": ITEMS - QUICK}
    assert (blocking.path / "executed.log").read_text().split() == ["0", "1", "2"]
    assert f"Run {run_id} was cancelled: 5 items did not run" in out
    resume_completes_only_the_missing_items(blocking, run_id)


# In-process: the rule and the doors ---------------------------------------------------------


def silent_run(*, seconds: float, mode: str = Run.Mode.EMBEDDED) -> Run:
    from tests.test_pages import make_run

    run = make_run("silent", keys=["a", "b"], finish=False, done=1)
    beat = timezone.now() - timedelta(seconds=seconds)
    Run.objects.filter(id=run.id).update(mode=mode, heartbeat_at=beat)
    return Run.objects.get(id=run.id)


@pytest.mark.django_db
def test_only_an_embedded_run_silent_past_the_grace_period_is_interrupted(monkeypatch):
    monkeypatch.setenv("COBALT_RUN_GRACE", "30")
    quiet = silent_run(seconds=10)
    gone = silent_run(seconds=40)
    team = silent_run(seconds=40, mode=Run.Mode.TEAM)  # workers' leases cover those

    shown = liveness.settle(Run.objects.filter(id__in=[quiet.id, gone.id, team.id]))

    statuses = {run.id: run.status for run in shown}
    assert statuses == {quiet.id: "running", gone.id: "interrupted", team.id: "running"}
    assert Run.objects.get(id=gone.id).status == "interrupted"
    assert Run.objects.get(id=gone.id).is_finished


@pytest.mark.django_db
def test_a_heartbeat_takes_back_an_interrupted_that_came_too_early():
    run = liveness.settled(silent_run(seconds=3600))
    assert run.status == "interrupted"

    assert services.run_heartbeat(run.id)
    assert Run.objects.get(id=run.id).status == "running"
    Run.objects.filter(id=run.id).update(status=Run.Status.CANCELLED)
    assert not services.run_heartbeat(run.id)  # ended elsewhere: stays as it is


@pytest.mark.django_db
def test_every_door_shows_a_vanished_run_as_interrupted():
    from cobalt.config import active_config
    from cobalt_cli.mcp.project import Project as McpProject
    from cobalt_cli.mcp.reads import cobalt_results_tool

    client = Client(HTTP_HOST="127.0.0.1")
    mcp = McpProject(active_config())
    run = silent_run(seconds=3600)
    doors = {
        "API run": lambda: client.get(f"/api/runs/{run.id}/").json()["status"],
        "API runs": lambda: client.get("/api/runs/").json()["results"][0]["status"],
        "run page": lambda: re.search(r'id="run-status">(\w+)<', page(f"/runs/{run.id}/"))[1],
        "runs page": lambda: re.search(r'class="status status-(\w+)"', page("/"))[1],
        "MCP run": lambda: result(
            cobalt_results_tool(mcp, run_id=run.id, limit=1, experiment=None)
        )["status"],
        "MCP runs": lambda: result(cobalt_results_tool(mcp, run_id=None, limit=1, experiment=None))[
            "runs"
        ][0]["status"],
    }

    def page(url: str) -> str:
        return client.get(url).content.decode()

    def result(called) -> dict:
        return called.structured_content

    for door, status in doors.items():
        Run.objects.filter(id=run.id).update(status=Run.Status.RUNNING)  # read by nobody yet
        assert status() == "interrupted", door


@pytest.mark.django_db
def test_clean_deletes_a_run_whose_process_vanished_but_not_a_live_one(tmp_path):
    from cobalt.config import load_config
    from cobalt_app.housekeeping import delete_results

    silent_run(seconds=3600)
    live = silent_run(seconds=0)

    delete_results(load_config(tmp_path))

    assert list(Run.objects.values_list("id", flat=True)) == [live.id]
