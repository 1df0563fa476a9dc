"""Outside a project: no `.cobalt/` appears where there is no project; a file runs in its own.

The real `cobalt` command and `python file.cobalt.py`, started from folders that are not the
project's.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import psycopg
import pytest

from tests.conftest import Project, cli_env, start_server
from tests.team_harness import PG_ADMIN_URL
from tests.test_mcp import mcp_session

NO_PROJECT = "no Cobalt project here"

QA = """
from cobalt import Dataset, Evaluator, experiment

dataset = Dataset.from_file("datasets/qa.jsonl")

@experiment("qa", dataset, evaluators=[Evaluator(name="exact", type="exact-match",
                                                 field="expected")])
def run(ctx):
    return ctx.item["expected"]
"""


@pytest.fixture
def qa(project: Project) -> Project:
    project.write_jsonl("datasets/qa.jsonl", [{"id": "a", "input": "q", "expected": "yes"}])
    project.write("experiments/qa.cobalt.py", QA)
    return project


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    return folder


def runs_in(project: Project) -> list[tuple[str, str, int]]:
    with sqlite3.connect(project.db_path) as db:
        return db.execute("select name, status, finished_items from cobalt_app_run").fetchall()


@pytest.mark.parametrize(
    "command",
    [["history"], ["compare", "abcd", "efgh"], ["export", "abcd"], ["clean", "--cache"], ["mcp"]],
    ids=lambda command: command[0],
)
def test_a_command_outside_any_project_says_so_and_creates_nothing(cobalt_cli, elsewhere, command):
    result = cobalt_cli(elsewhere, *command, input="")

    assert result.returncode == 2, result.stderr
    assert NO_PROJECT in result.stderr and "cobalt init" in result.stderr
    assert list(elsewhere.iterdir()) == []


def test_cobalt_run_with_nothing_to_run_and_no_project_says_so_and_creates_nothing(
    cobalt_cli, elsewhere
):
    result = cobalt_cli(elsewhere, "run")

    assert result.returncode == 2, result.stderr
    assert NO_PROJECT in result.stderr
    assert list(elsewhere.iterdir()) == []


def test_cobalt_run_without_a_config_file_still_runs_the_experiments_of_this_folder(cobalt_cli, qa):
    (qa.path / "cobalt.toml").unlink()  # a project without configuration, as before

    result = cobalt_cli(qa, "run")

    assert result.returncode == 0, result.stderr
    assert runs_in(qa) == [("qa", "completed", 1)]


def test_cobalt_run_of_an_absolute_path_records_into_the_project_holding_the_file(
    cobalt_cli, qa, elsewhere
):
    result = cobalt_cli(elsewhere, "run", str(qa.path / "experiments" / "qa.cobalt.py"))

    assert result.returncode == 0, result.stderr
    assert runs_in(qa) == [("qa", "completed", 1)]
    assert len(qa.results_files()) == 1
    assert list(elsewhere.iterdir()) == []


def test_a_relative_path_given_to_cobalt_run_is_relative_to_the_current_folder(cobalt_cli, qa):
    result = cobalt_cli(qa.path / "experiments", "run", "qa.cobalt.py")

    assert result.returncode == 0, result.stderr
    assert runs_in(qa) == [("qa", "completed", 1)]


def test_history_from_a_subfolder_of_the_project_reads_the_project(cobalt_cli, qa):
    cobalt_cli(qa, "run")

    result = cobalt_cli(qa.path / "experiments", "history")

    assert result.returncode == 0, result.stderr
    assert "completed" in result.stdout
    assert not (qa.path / "experiments" / ".cobalt").exists()


def test_running_an_experiment_file_with_python_from_elsewhere_uses_its_project(qa, elsewhere):
    result = subprocess.run(
        [sys.executable, str(qa.path / "experiments" / "qa.cobalt.py")],
        cwd=elsewhere,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stderr  # datasets/qa.jsonl found from the project
    assert runs_in(qa) == [("qa", "completed", 1)]
    assert list(elsewhere.iterdir()) == []


# A folder where Cobalt ran is a project for every command; commands on the database the
# environment names need no project folder at all.

LONE = """
from cobalt import Dataset, Evaluator, experiment

@experiment("lone", Dataset(items=[{"id": "a", "input": "q", "expected": "yes"}]),
            evaluators=[Evaluator(name="exact", type="exact-match", field="expected")])
def run(ctx):
    return "yes"
"""


@pytest.fixture
def ran_here(cobalt_cli, tmp_path: Path) -> Path:
    """A folder holding only an experiment file (no cobalt.toml), where `cobalt run` just ran."""
    folder = tmp_path / "lone"
    (folder / "experiments").mkdir(parents=True)
    (folder / "experiments" / "lone.cobalt.py").write_text(LONE)
    done = cobalt_cli(folder, "run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "`cobalt serve`" in done.stdout
    assert sorted(p.name for p in folder.iterdir()) == [".cobalt", "experiments"]
    return folder


def test_history_and_serve_work_where_cobalt_ran_without_a_config_file(cobalt_cli, ran_here):
    history = cobalt_cli(ran_here, "history")
    assert history.returncode == 0, history.stderr
    assert "lone" in history.stdout and "completed" in history.stdout

    server, url = start_server(Project(ran_here))
    try:
        page = httpx.get(f"{url}/", timeout=30)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert page.status_code == 200 and "lone" in page.text


def test_mcp_serves_the_folder_where_cobalt_ran(ran_here):
    async def main() -> list[str]:
        async with mcp_session(ran_here, cli_env(), ran_here.parent / "mcp.log") as session:
            tools = await session.list_tools()
            return [tool.name for tool in tools.tools]

    assert "cobalt_run" in anyio.run(main)


def test_migrate_needs_no_project_folder_when_the_environment_names_the_database(
    cobalt_cli, elsewhere
):
    name = f"cobalt_test_migrate_{os.getpid()}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    try:
        deployment = {"COBALT_DATABASE_URL": url, "COBALT_SECRET_KEY": "k" * 50}
        done = cobalt_cli(elsewhere, "migrate", env=deployment)
        assert done.returncode == 0, done.stdout + done.stderr
        assert list(elsewhere.iterdir()) == []  # nothing of a project appeared
        with psycopg.connect(url) as db:
            (applied,) = db.execute(
                "select count(*) from django_migrations where app = 'cobalt_app'"
            ).fetchone()
        assert applied >= 10
        refused = cobalt_cli(elsewhere, "history")  # not a database command: still refused
        assert refused.returncode == 2 and NO_PROJECT in refused.stderr
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
