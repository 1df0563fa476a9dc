"""The same length limits on every database, checked before a run starts (issue 14, finding 8).

PostgreSQL refuses a value longer than its column, SQLite keeps it: `cobalt run` (a real
subprocess) refuses the same names on both, before any agent call, naming the file and line.
Results file names stay short for any experiment name.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest

from cobalt_app import results
from cobalt_app.models import Run
from tests.team_harness import PG_ADMIN_URL, REDIS_URL

LONG_NAME = "n" * 250
LONG_TAG = "t" * 120
LONG_EVALUATOR = "e" * 130
LONG_ID = "i" * 201

EXPERIMENT = f"""
from pathlib import Path

from cobalt import Dataset, Evaluator, experiment


def run(ctx):
    with open(Path(__file__).parent / "agent-calls.txt", "a") as calls:
        calls.write("called\\n")
    return "ok"


experiment(
    "{LONG_NAME}",
    Dataset(items=[{{"id": "short", "input": 1}}, {{"id": "{LONG_ID}", "input": 2}}]),
    run,
    evaluators=[Evaluator(name="{LONG_EVALUATOR}", type="contains", value="o")],
    tags=["ok", "{LONG_TAG}"],
)
"""


@pytest.fixture
def postgres_url() -> Iterator[str]:
    name = f"cobalt_test_limits_{os.getpid()}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def runs_in_sqlite(project) -> int:
    if not project.db_path.exists():
        return 0
    with sqlite3.connect(project.db_path) as conn:
        return conn.execute("SELECT count(*) FROM cobalt_app_run").fetchone()[0]


def runs_in_postgres(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM cobalt_app_run").fetchone()[0]


def assert_refused_before_the_run(project, done) -> None:
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert f"experiment '{LONG_NAME}' (experiments/long.cobalt.py:12) cannot start:" in output
    assert (
        "the experiment name is 250 characters long; Cobalt stores at most 200 on every "
        "database. Shorten it"
    ) in output
    assert f"the tag '{'t' * 39}…' is 120 characters long; Cobalt stores at most 100" in output
    assert (
        f"experiments/long.cobalt.py:16: evaluator '{'e' * 39}…': the evaluator name is 130 "
        "characters long; Cobalt stores at most 100"
    ) in output
    assert (
        "the id of item at index 1 (in the inline dataset) is 201 characters long; Cobalt "
        "stores at most 200"
    ) in output
    assert "Nothing ran and no agent was called" in output
    assert not (project.path / "experiments" / "agent-calls.txt").exists()
    assert project.results_files() == []


def test_on_sqlite_long_names_tags_and_ids_are_refused_before_the_run(project, cobalt_cli):
    project.write("experiments/long.cobalt.py", EXPERIMENT)

    done = cobalt_cli(project, "run")

    assert_refused_before_the_run(project, done)
    assert runs_in_sqlite(project) == 0


@pytest.mark.parametrize("team", [False, True], ids=["embedded", "team"])
def test_on_postgresql_the_same_names_are_refused_the_same_way(
    project, cobalt_cli, postgres_url, team
):
    project.write("experiments/long.cobalt.py", EXPERIMENT)
    env = {"COBALT_DATABASE_URL": postgres_url}
    if team:  # Redis answers, no worker is needed: nothing may be enqueued
        env |= {"COBALT_BROKER_URL": REDIS_URL, "COBALT_QUEUE": f"limits-{os.getpid()}"}
    migrated = cobalt_cli(project, "migrate", env=env)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr

    done = cobalt_cli(project, "run", env=env)

    assert_refused_before_the_run(project, done)
    assert runs_in_postgres(postgres_url) == 0


def test_ci_lists_each_length_problem_as_a_configuration_error(project, cobalt_cli):
    project.write("experiments/long.cobalt.py", EXPERIMENT)

    done = cobalt_cli(project, "run", "--ci")

    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert (
        f"experiment '{LONG_NAME}' (experiments/long.cobalt.py:12): the experiment name is 250 "
        "characters long"
    ) in output
    assert not (project.path / "experiments" / "agent-calls.txt").exists()


@pytest.mark.django_db
def test_a_results_file_name_is_short_for_any_experiment_name(tmp_path):
    run = Run.objects.create(
        name="é" * 10 + LONG_NAME, created_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    )

    path = results.write_results_file(run, tmp_path)

    assert path.exists()
    assert path.name == f"2026-01-02T03-04-05_{'n' * results.RESULTS_NAME_MAX}_{run.id}.json"
    assert len(path.name.encode()) < 255
