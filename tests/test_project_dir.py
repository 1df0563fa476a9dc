"""Outside a project: no `.cobalt/` appears where there is no project; a file runs in its own.

The real `cobalt` command and `python file.cobalt.py`, started from folders that are not the
project's.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Project, cli_env

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
