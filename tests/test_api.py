"""The REST API: runs, items, compare, trends, experiments, config; starting and cancelling runs.

Runs are produced by the real engine (launcher.execute) or started through the API itself;
the live-server test is a script speaking real HTTP with a token.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from cobalt.config import active_config, load_config, set_active_config
from cobalt_app import launcher
from cobalt_app.api import jobs
from cobalt_app.models import ItemResult, Run
from tests.conftest import TEST_REDIS_DB

pytestmark = pytest.mark.django_db(transaction=True)

DEADLINE = 30.0

QA = """
from cobalt import Dataset, Evaluator, experiment

ITEMS = [
    {"id": f"q{i}", "input": f"question {i}", "expected_output": "yes" if i % 2 == 0 else "no"}
    for i in range(6)
]


def long_enough(ctx):
    return {"score": min(1.0, len(str(ctx.output)) / 3), "reason": "length"}


@experiment(
    "qa",
    Dataset(items=ITEMS),
    evaluators=[
        Evaluator(name="exact", type="exact-match", field="expected_output"),
        Evaluator(name="length", type="function", fn=long_enough),
    ],
    tags=["nightly"],
)
def run(ctx):
    if ctx.item["id"] == "q5":
        raise RuntimeError("boom on q5")
    return {"output": "{ANSWER}", "metadata": {"model": "rules"}}
"""

SLOW = """
import asyncio

from cobalt import Dataset, Evaluator, experiment


@experiment(
    "slow",
    Dataset(items=[{"id": f"s{i}", "input": i} for i in range(20)]),
    evaluators=[Evaluator(name="ok", type="function", fn=lambda ctx: {"score": 1.0})],
    concurrency=2,
    timeout=120,
)
async def run(ctx):
    await asyncio.sleep(60)
    return "late"
"""

TWO = """
from cobalt import Dataset, experiment

data = Dataset(items=[{"id": "a", "input": 1}])
experiment("alpha", data, lambda ctx: "a")
experiment("beta", data, lambda ctx: "b")
"""


def qa_source(answer: str = "yes") -> str:
    return QA.replace("{ANSWER}", answer)


@pytest.fixture
def api_project(project, settings, monkeypatch):
    """A project with experiment files, active for the API (embedded, served on loopback)."""
    project.write("experiments/qa.cobalt.py", qa_source("yes"))
    project.write("experiments/qa_v2.cobalt.py", qa_source("no").replace('"qa"', '"qa-v2"'))
    project.write("experiments/slow.cobalt.py", SLOW)
    project.write("experiments/two.cobalt.py", TWO)
    settings.TEAM_MODE = False
    monkeypatch.delenv("COBALT_SERVE_HOST", raising=False)
    previous = active_config()
    set_active_config(load_config(project.path))
    yield project
    wait_for_background_runs()
    set_active_config(previous)


def wait_for_background_runs() -> None:
    """Runs started by a test finish (or are cancelled) before its database goes away."""
    deadline = time.monotonic() + DEADLINE
    with jobs._running_lock:
        tasks = list(jobs._running.values())
    for running in tasks:
        running.loop.call_soon_threadsafe(running.task.cancel)
    while jobs.in_flight():
        assert time.monotonic() < deadline, "a background run did not stop"
        time.sleep(0.05)


@pytest.fixture
def user(settings):
    # The default hasher is deliberately slow; these tests log in dozens of times.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    return get_user_model().objects.create_user("alice", password="correct-horse-battery")


@pytest.fixture
def token(user) -> str:
    return Token.objects.create(user=user).key


@pytest.fixture
def api(token) -> APIClient:
    client = APIClient(HTTP_HOST="127.0.0.1")
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def execute(name: str, *, tags: list[str] | None = None) -> Run:
    """Run one experiment of the active project with the real engine."""
    config = active_config()
    experiments, errors, _ = launcher.load_experiments(config, name_filter=name)
    assert not errors, errors
    chosen = [e for e in experiments if e.name == name]
    (run,) = launcher.execute(chosen, config, tags=tags)
    return run


def wait_finished(client, run_id: str) -> dict:
    deadline = time.monotonic() + DEADLINE
    while True:
        body = client.get(f"/api/runs/{run_id}/").json()
        if body["status"] in ("completed", "failed", "cancelled"):
            return body
        assert time.monotonic() < deadline, f"run {run_id} still {body['status']}"
        time.sleep(0.05)


# Reading ------------------------------------------------------------------------------------


def test_the_run_list_filters_by_name_tag_status_and_date_and_paginates(api_project, api):
    first = execute("qa")
    second = execute("qa-v2", tags=["candidate"])
    Run.objects.filter(id=first.id).update(created_at="2024-01-01T00:00:00Z")

    everything = api.get("/api/runs/").json()
    assert [r["id"] for r in everything["results"]] == [second.id, first.id]
    assert everything["count"] == 2

    by_name = api.get("/api/runs/", {"name": "v2"}).json()["results"]
    assert [r["id"] for r in by_name] == [second.id]
    assert [r["id"] for r in api.get("/api/runs/", {"tag": "candidate"}).json()["results"]] == [
        second.id
    ]
    assert api.get("/api/runs/", {"status": "failed"}).json()["count"] == 0
    old = api.get("/api/runs/", {"created_before": "2024-06-01T00:00:00Z"}).json()["results"]
    assert [r["id"] for r in old] == [first.id]
    recent = api.get("/api/runs/", {"created_after": "2024-06-01T00:00:00Z"}).json()["results"]
    assert [r["id"] for r in recent] == [second.id]

    page = api.get("/api/runs/", {"page_size": 1}).json()
    assert len(page["results"]) == 1 and page["next"].endswith("page=2&page_size=1")
    assert api.get("/api/runs/", {"page_size": 1, "page": 2}).json()["results"][0]["id"] == first.id

    row = by_name[0]
    assert row["tags"] == ["nightly", "candidate"]
    assert row["scores"] == {"exact": pytest.approx(2 / 5), "length": pytest.approx(2 / 3)}
    assert row["errorCount"] == 1 and row["totalItems"] == 6 and row["status"] == "completed"


def test_a_bad_filter_value_is_a_400_naming_the_field(api_project, api):
    response = api.get("/api/runs/", {"status": "exploded", "created_after": "yesterday"})
    assert response.status_code == 400
    assert set(response.json()) == {"status", "created_after"}
    assert "exploded" in response.json()["status"][0]


def test_the_run_detail_is_the_results_file_header_plus_progress(api_project, api):
    run = execute("qa")
    body = api.get(f"/api/runs/{run.id}/").json()
    results_file = json.loads(Path(run.results_path).read_text())
    del results_file["items"]
    for key, value in results_file.items():
        assert body[key] == value, key
    assert body["progress"]["totalItems"] == 6 and body["progress"]["finishedItems"] == 6
    assert body["summary"]["scores"]["exact"]["count"] == 5
    assert body["summary"]["errors"] == 1
    # A unique prefix works like the CLI's.
    assert api.get(f"/api/runs/{run.id[:6]}/").json()["id"] == run.id


def test_items_are_paginated_and_filter_by_status_evaluator_and_score(api_project, api):
    run = execute("qa")
    url = f"/api/runs/{run.id}/items/"

    page = api.get(url, {"page_size": 4}).json()
    assert page["count"] == 6
    assert [i["key"] for i in page["results"]] == ["q0", "q1", "q2", "q3"]
    rest = api.get(url, {"page_size": 4, "page": 2}).json()["results"]
    assert [i["key"] for i in rest] == ["q4", "q5"]

    errored = api.get(url, {"status": "error"}).json()["results"]
    assert [(i["key"], i["error"]) for i in errored] == [("q5", "RuntimeError: boom on q5")]
    assert errored[0]["evaluations"] == {}

    wrong = api.get(url, {"evaluator": "exact", "max_score": 0.5}).json()["results"]
    assert [i["key"] for i in wrong] == ["q1", "q3"]
    assert wrong[0]["evaluations"]["exact"]["score"] == 0.0
    assert wrong[0]["output"] == {"output": "yes", "metadata": {"model": "rules"}}
    right = api.get(url, {"evaluator": "exact", "min_score": 1}).json()["results"]
    assert [i["key"] for i in right] == ["q0", "q2", "q4"]
    assert api.get(url, {"evaluator": "nope"}).json()["count"] == 0


def test_unknown_runs_are_json_404s_that_say_how_to_find_runs(api_project, api):
    for url in ("/api/runs/nosuchrun/", "/api/runs/nosuchrun/items/"):
        response = api.get(url)
        assert response.status_code == 404, url
        assert "no run with id 'nosuchrun'" in response.json()["detail"]
    response = api.post("/api/runs/nosuchrun/cancel/")
    assert response.status_code == 404 and "cobalt history" in response.json()["detail"]
    response = api.get("/api/compare/", {"a": "nosuchrun", "b": "other"})
    assert response.status_code == 404
    response = api.get("/api/nothing/here/")
    assert response.status_code == 404
    assert response.json()["detail"].startswith("no API endpoint at /api/nothing/here/")
    assert api.get("/api/runs").status_code == 301  # the slash is added, as everywhere


def test_compare_matches_items_by_key_and_lists_regressions(api_project, api):
    base = execute("qa")
    candidate = execute("qa-v2")
    body = api.get("/api/compare/", {"a": base.id, "b": candidate.id}).json()
    assert body["runA"]["id"] == base.id and body["runB"]["id"] == candidate.id
    assert body["matchedItems"] == 6
    assert body["evaluators"]["exact"]["a"] == pytest.approx(0.6)
    assert body["evaluators"]["exact"]["b"] == pytest.approx(0.4)
    assert body["evaluators"]["exact"]["delta"] == pytest.approx(-0.2)
    exact_down = sorted(r["key"] for r in body["regressions"] if r["evaluator"] == "exact")
    assert exact_down == ["q0", "q2", "q4"]
    assert sorted((r["key"], r["evaluator"]) for r in body["improvements"]) == [
        ("q1", "exact"),
        ("q3", "exact"),
    ]
    # "yes" → "no" also shortened every answer: the length evaluator regressed on q0–q4.
    assert body["regressionCount"] == 3 + 5

    missing = api.get("/api/compare/", {"a": base.id})
    assert missing.status_code == 400 and "b" in missing.json()


def test_trends_come_from_the_stored_summaries(api_project, api):
    first = execute("qa", tags=["v1"])
    second = execute("qa", tags=["v2"])
    execute("qa-v2")
    # The summary stored at finalisation is what trends show, not an aggregate of item rows.
    stored = dict(second.summary)
    stored["scores"] = {**stored["scores"], "exact": {**stored["scores"]["exact"], "avg": 0.123}}
    Run.objects.filter(id=second.id).update(summary=stored)

    body = api.get("/api/trends/", {"experiment": "qa", "evaluator": "exact"}).json()
    (series,) = body["series"]
    assert series["experiment"] == "qa" and series["evaluators"] == ["exact"]
    assert [p["runId"] for p in series["points"]] == [first.id, second.id]
    assert [p["scores"]["exact"]["avg"] for p in series["points"]] == [pytest.approx(0.6), 0.123]
    assert set(series["points"][0]["scores"]) == {"exact"}

    tagged = api.get("/api/trends/", {"experiment": "qa", "tag": "v1"}).json()["series"][0]
    assert [p["runId"] for p in tagged["points"]] == [first.id]
    every = api.get("/api/trends/").json()["series"]
    assert sorted(s["experiment"] for s in every) == ["qa", "qa-v2"]


def test_experiments_lists_files_under_the_test_dir_and_import_errors(api_project, api):
    api_project.write("experiments/broken.cobalt.py", "raise ValueError('bad file')\n")
    api_project.write("experiments/notes.py", "x = 1\n")
    body = api.get("/api/experiments/").json()
    assert body["testDir"] == "experiments"
    files = {f["file"]: f for f in body["files"]}
    assert set(files) == {
        "experiments/broken.cobalt.py",
        "experiments/qa.cobalt.py",
        "experiments/qa_v2.cobalt.py",
        "experiments/slow.cobalt.py",
        "experiments/two.cobalt.py",
    }
    assert files["experiments/broken.cobalt.py"]["error"] == "ValueError: bad file"
    assert [e["name"] for e in files["experiments/two.cobalt.py"]["experiments"]] == [
        "alpha",
        "beta",
    ]
    qa = files["experiments/qa.cobalt.py"]["experiments"][0]
    assert qa == {
        "name": "qa",
        "tags": ["nightly"],
        "evaluators": ["exact", "length"],
        "datasetSize": 6,
        "runs": 1,
        "concurrency": None,
        "timeout": None,
    }


def test_config_is_redacted_and_no_response_carries_an_api_key(api_project, api, monkeypatch):
    secret = "sk-file-SECRET-9f8e7d"
    api_project.write(
        "cobalt.toml",
        f'test_dir = "experiments"\n[judge]\napi_key = "{secret}"\n',
    )
    set_active_config(load_config(api_project.path))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-SECRET-123456")
    run = execute("qa")
    body = api.get("/api/config/").json()
    assert body["config"]["judge"]["api_key"] == "***"
    assert body["teamMode"] is False
    for url in (
        "/api/config/",
        "/api/runs/",
        f"/api/runs/{run.id}/",
        f"/api/runs/{run.id}/items/",
        "/api/experiments/",
        "/api/trends/",
        "/api/schema/",
    ):
        text = api.get(url).content.decode()
        assert secret not in text and "sk-env-SECRET" not in text, url


def test_a_missing_plugin_file_is_a_json_500_naming_it(api_project, api):
    api_project.write("cobalt.toml", 'test_dir = "experiments"\nplugins = ["plugins/gone.py"]\n')
    set_active_config(load_config(api_project.path))
    for response in (
        api.get("/api/experiments/"),
        api.post("/api/runs/", {"file": "experiments/qa.cobalt.py"}, format="json"),
    ):
        assert response.status_code == 500
        assert "plugin file 'plugins/gone.py'" in response.json()["detail"]
        assert "does not exist" in response.json()["detail"]


# Starting and cancelling ----------------------------------------------------------------------


def test_starting_a_run_answers_202_with_its_id_and_the_run_completes(api_project, api):
    response = api.post(
        "/api/runs/",
        {"file": "experiments/qa.cobalt.py", "concurrency": 3, "tags": ["api", "smoke"]},
        format="json",
    )
    assert response.status_code == 202, response.content
    started = response.json()
    assert started["name"] == "qa" and started["file"] == "experiments/qa.cobalt.py"
    assert started["url"].endswith(f"/api/runs/{started['id']}/")
    body = wait_finished(api, started["id"])
    assert body["status"] == "completed"
    assert body["tags"] == ["nightly", "api", "smoke"]
    assert body["config"]["concurrency"] == 3
    assert body["summary"]["scores"]["exact"]["avg"] == pytest.approx(0.6)
    assert api.get("/api/runs/", {"tag": "smoke"}).json()["results"][0]["id"] == started["id"]


def test_a_file_with_several_experiments_needs_a_filter_naming_one(api_project, api):
    response = api.post("/api/runs/", {"file": "experiments/two.cobalt.py"}, format="json")
    assert response.status_code == 400
    assert "registers 2 matching experiments ('alpha', 'beta')" in response.json()["filter"][0]
    response = api.post(
        "/api/runs/", {"file": "experiments/two.cobalt.py", "filter": "gamma"}, format="json"
    )
    assert response.status_code == 400
    assert (
        "no experiment in experiments/two.cobalt.py matches 'gamma'"
        in (response.json()["filter"][0])
    )
    response = api.post(
        "/api/runs/", {"file": "experiments/two.cobalt.py", "filter": "beta"}, format="json"
    )
    assert response.status_code == 202
    assert wait_finished(api, response.json()["id"])["name"] == "beta"


def test_invalid_start_requests_get_field_messages(api_project, api):
    response = api.post("/api/runs/", {}, format="json")
    assert response.status_code == 400 and response.json()["file"] == ["This field is required."]
    response = api.post(
        "/api/runs/",
        {"file": "experiments/qa.cobalt.py", "concurrency": 0, "tags": "x"},
        format="json",
    )
    assert response.status_code == 400
    assert set(response.json()) == {"concurrency", "tags"}
    api_project.write("experiments/broken.cobalt.py", "import not_a_module_anywhere\n")
    response = api.post("/api/runs/", {"file": "experiments/broken.cobalt.py"}, format="json")
    assert response.status_code == 400
    assert response.json()["file"][0].startswith(
        "experiments/broken.cobalt.py failed to import: ModuleNotFoundError"
    )
    assert Run.objects.count() == 0


@pytest.mark.parametrize(
    ("given", "rule"),
    [
        ("../outside.cobalt.py", "resolves outside the project folder"),
        ("experiments/../../outside.cobalt.py", "resolves outside the project folder"),
        ("/etc/passwd", "resolves outside the project folder"),
        ("experiments/escape.cobalt.py", "resolves outside the project folder"),
        ("elsewhere/side.cobalt.py", "is not under the test directory experiments/"),
        ("experiments/helper.py", "is not an experiment file"),
        ("experiments/missing.cobalt.py", "does not exist"),
    ],
)
def test_file_arguments_must_stay_inside_the_project_and_under_the_test_dir(
    api_project, api, given, rule
):
    outside = api_project.path.parent / "outside.cobalt.py"
    outside.write_text(TWO)
    os.symlink(outside, api_project.path / "experiments" / "escape.cobalt.py")
    api_project.write("elsewhere/side.cobalt.py", TWO)
    api_project.write("experiments/helper.py", TWO)
    response = api.post("/api/runs/", {"file": given, "filter": "alpha"}, format="json")
    assert response.status_code == 400, response.content
    (message,) = response.json()["file"]
    assert rule in message
    assert Run.objects.count() == 0


def test_cancelling_a_running_run_stops_it_and_a_second_cancel_is_409(api_project, api):
    response = api.post("/api/runs/", {"file": "experiments/slow.cobalt.py"}, format="json")
    run_id = response.json()["id"]
    cancelled = api.post(f"/api/runs/{run_id}/cancel/")
    assert cancelled.status_code == 200, cancelled.content
    assert cancelled.json()["status"] == "cancelled"
    statuses = set(ItemResult.objects.filter(run_id=run_id).values_list("status", flat=True))
    assert statuses == {"cancelled"}
    again = api.post(f"/api/runs/{run_id}/cancel/")
    assert again.status_code == 409
    assert again.json()["detail"] == (
        f"run {run_id} is already cancelled; only a running run can be cancelled"
    )


def test_a_run_executing_elsewhere_is_cancelled_in_the_database(api_project, api):
    from cobalt_app import services

    config = active_config()
    experiments, _, _ = launcher.load_experiments(config, name_filter="slow")
    run = services.run_create(experiment=experiments[0], settings={"runs": 1, "concurrency": 1})
    services.run_start(run.id)
    response = api.post(f"/api/runs/{run.id}/cancel/")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    assert response.json()["summary"]["itemStatus"]["cancelled"] == 20
    assert api.post(f"/api/runs/{run.id}/cancel/").status_code == 409


def test_a_run_cancelled_by_another_server_process_stops_here(api_project, api):
    from cobalt_app.runs import lifecycle

    run_id = api.post("/api/runs/", {"file": "experiments/slow.cobalt.py"}, format="json").json()[
        "id"
    ]
    lifecycle.cancel(run_id)  # what a cancel request served by another worker process does
    deadline = time.monotonic() + DEADLINE
    while jobs.in_flight():
        assert time.monotonic() < deadline, "the run went on executing"
        time.sleep(0.05)
    run = Run.objects.get(id=run_id)
    assert run.status == "cancelled" and Path(run.results_path).is_file()
    assert set(ItemResult.objects.filter(run=run).values_list("status", flat=True)) == {"cancelled"}


def test_cancelling_a_finished_run_is_409(api_project, api):
    run = execute("qa")
    response = api.post(f"/api/runs/{run.id}/cancel/")
    assert response.status_code == 409
    assert "already completed" in response.json()["detail"]


# A script over real HTTP ----------------------------------------------------------------------


def test_a_script_with_a_token_lists_starts_polls_and_reads_items(api_project, token, live_server):
    headers = {"Authorization": f"Token {token}"}
    with httpx.Client(base_url=live_server.url, headers=headers, timeout=30) as http:
        assert http.get("/api/runs/").json()["count"] == 0
        anonymous = httpx.post(f"{live_server.url}/api/runs/", json={"file": "x"})
        assert anonymous.status_code == 401
        assert anonymous.headers["WWW-Authenticate"] == "Token"

        started = http.post("/api/runs/", json={"file": "experiments/qa.cobalt.py"})
        assert started.status_code == 202
        run_id = started.json()["id"]
        deadline = time.monotonic() + DEADLINE
        while (detail := http.get(f"/api/runs/{run_id}/").json())["status"] != "completed":
            assert time.monotonic() < deadline and detail["status"] in ("queued", "running")
            time.sleep(0.05)
        assert detail["progress"]["finishedItems"] == 6

        listed = http.get("/api/runs/").json()["results"]
        assert [r["id"] for r in listed] == [run_id]
        items = http.get(f"/api/runs/{run_id}/items/", params={"page_size": 100}).json()
        assert [i["key"] for i in items["results"]] == [f"q{i}" for i in range(6)]
        assert items["results"][5]["status"] == "error"

        docs = http.get("/api/docs/")
        assert docs.status_code == 200 and "swagger-ui" in docs.text
        assert "cdn" not in docs.text.lower() and "unpkg" not in docs.text
        schema = http.get("/api/schema/", headers={"Accept": "application/json"})
        assert "/api/runs/{run_id}/items/" in schema.json()["paths"]


# Team mode: PostgreSQL, Redis, a real `cobalt worker` and `cobalt serve` ----------------------

# The team tests' Redis DB (COBALT_TEST_REDIS_DB): a module at a time uses it, each flushing it
# at its start and end; a suite running beside this one has its own.
API_REDIS_URL = f"redis://127.0.0.1:6379/{TEST_REDIS_DB}"


@pytest.fixture(scope="module")
def team_services():
    import psycopg
    import redis

    from tests import team_harness as harness

    name = f"cobalt_test_api_{os.getpid()}"
    with psycopg.connect(harness.PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    redis.Redis.from_url(API_REDIS_URL).flushdb()
    services = harness.Services(
        name, f"postgresql://postgres@127.0.0.1:5432/{name}", broker_url=API_REDIS_URL
    )
    try:
        yield services
    finally:
        with psycopg.connect(harness.PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        redis.Redis.from_url(API_REDIS_URL).flushdb()


@pytest.fixture
def team_server(team_services, fake_provider_server, tmp_path):
    """A team-mode project with one worker and `cobalt serve`; yields (team, base url)."""
    from tests import team_harness as harness

    fake_provider_server.reset()
    folder = tmp_path / "team-proj"
    (folder / "experiments").mkdir(parents=True)
    (folder / "cobalt.toml").write_text('test_dir = "experiments"\n')
    provider_env = {
        "OPENAI_BASE_URL": fake_provider_server.openai_base_url,
        "OPENAI_API_KEY": "sk-test-openai-SECRET-0001",
    }
    compose = harness.compose_config({"COBALT_WORKER_CONCURRENCY": "4"})
    team = harness.Team(team_services, compose, folder, f"api-{os.getpid()}", provider_env)
    try:
        migrated = team.cli("migrate")
        assert migrated.returncode == 0, migrated.stderr
        team.start_worker()
        yield team, team.serve("/api/runs/", 401)
    finally:
        team.stop_all()


@pytest.mark.timeout(180)
def test_in_team_mode_the_api_needs_a_token_and_runs_go_to_the_workers(team_server):
    team, base = team_server
    team.write_experiment(items=6)
    team.write_experiment("slow", items=40, delay=0.5, call_agent=False)
    team.create_user("ops", "team-pass-123")
    key = team.cli("token", "create", "ops").stdout.strip()

    assert httpx.get(f"{base}/api/experiments/").status_code == 401
    refused = httpx.post(f"{base}/api/runs/", json={"file": "experiments/demo.cobalt.py"})
    assert refused.status_code == 401
    with httpx.Client(base_url=base, headers={"Authorization": f"Token {key}"}, timeout=30) as api:
        started = api.post("/api/runs/", json={"file": "experiments/demo.cobalt.py"})
        assert started.status_code == 202, started.text
        run_id = started.json()["id"]
        deadline = time.monotonic() + 60
        while (detail := api.get(f"/api/runs/{run_id}/").json())["status"] != "completed":
            assert time.monotonic() < deadline, detail
            time.sleep(0.1)
        assert team.run_row(run_id)["mode"] == "team"
        items = api.get(f"/api/runs/{run_id}/items/").json()
        assert items["count"] == 6
        assert {i["evaluations"]["judge"]["score"] for i in items["results"]} == {0.8}
        assert len(team.executions()) == 6  # executed by the worker, once each

        long_run = api.post("/api/runs/", json={"file": "experiments/slow.cobalt.py"}).json()
        cancelled = api.post(f"/api/runs/{long_run['id']}/cancel/")
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled"
        assert team.item_statuses(long_run["id"]).get("cancelled", 0) > 0
        assert api.post(f"/api/runs/{long_run['id']}/cancel/").status_code == 409
