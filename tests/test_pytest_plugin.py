"""`pytest` in a Cobalt project: one test per dataset item, a thresholds test, `-k`, `--lf`,
`-p no:cobalt`, `cobalt.assert_scores`; the runs land in the history. Real pytest processes."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

from tests.conftest import Project, cli_env

QA = """
from cobalt import Dataset, Evaluator, experiment

dataset = Dataset(items=[
    {"id": "capital-france", "input": "France", "expected_output": "Paris"},
    {"id": "capital-canada", "input": "Canada", "expected_output": "Ottawa"},
    {"id": "capital-peru", "input": "Peru", "expected_output": "Lima"},
    {"id": "capital-chad", "input": "Chad", "expected_output": "N'Djamena"},
])
ANSWERS = {"France": "Paris", "Canada": "Toronto", "Peru": "Lima"}


@experiment(
    "qa-agent",
    dataset,
    evaluators=[Evaluator(name="exact", type="exact-match", pass_threshold=0.9)],
    thresholds={"exact": {"avg": 0.9}},
)
def run(ctx):
    if ctx.item["input"] == "Chad":
        raise RuntimeError("no idea about Chad")
    return ANSWERS[ctx.item["input"]]
"""

PLAIN_TEST = """
from cobalt import Dataset, Evaluator, assert_scores, experiment


def test_the_report_meets_its_scores():
    report = experiment(
        "plain",
        Dataset(items=[{"id": "a", "expected_output": "x"}, {"id": "b", "expected_output": "y"}]),
        lambda ctx: "x",
        evaluators=[Evaluator(name="exact", type="exact-match")],
    )
    assert_scores(report, {"exact": 0.9})
"""


# DeepEval's and LangSmith's pytest plugins, installed beside Cobalt in the dev virtualenv,
# import their whole libraries (DeepEval's takes seconds and reports the session to its
# telemetry): this suite turns them off in pyproject.toml, and so does the pytest it runs.
OTHER_PLUGINS_OFF = ("-p", "no:deepeval", "-p", "no:langsmith_plugin")


def pytest_in(project: Project, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", *OTHER_PLUGINS_OFF]
        + (["-p", "no:randomly", "-p", "no:cacheprovider"] if "--lf" not in args else [])
        + list(args),
        cwd=project.path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def history(project: Project) -> list[tuple[str, int]]:
    with sqlite3.connect(project.db_path) as db:
        return db.execute(
            "SELECT name, total_items FROM cobalt_app_run ORDER BY created_at"
        ).fetchall()


def test_each_item_is_a_test_that_fails_with_its_key_and_reason(project: Project):
    project.write("experiments/qa.cobalt.py", QA)
    result = pytest_in(project, "-v", "experiments")
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "experiments/qa.cobalt.py::qa-agent[capital-france] PASSED" in out
    assert "experiments/qa.cobalt.py::qa-agent[capital-peru] PASSED" in out
    assert "experiments/qa.cobalt.py::qa-agent[capital-canada] FAILED" in out
    assert "experiments/qa.cobalt.py::qa-agent[capital-chad] FAILED" in out
    assert "experiments/qa.cobalt.py::qa-agent::thresholds FAILED" in out
    assert "exact scored 0.00 (pass mark 0.90): output differs from expected 'Ottawa'" in out
    assert "error: RuntimeError: no idea about Chad" in out
    assert "exact avg 0.67 < 0.9" in out  # the thresholds test says which check failed
    assert "3 failed, 2 passed" in out
    assert history(project) == [("qa-agent", 4)]  # one run, in the history


RUNAWAY = """
import time
from cobalt import Dataset, experiment

calls = []


@experiment("runaway", Dataset(items=[{"id": "spins"}, {"id": "quick"}]), timeout=1)
def run(ctx):
    if ctx.item["id"] == "quick":
        return "done"
    while True:  # an agent loop that never ends: stopped at its next instruction
        calls.append(time.monotonic())
"""


def test_an_item_past_its_timeout_is_stopped_and_fails_its_test(project: Project):
    project.write("experiments/runaway.cobalt.py", RUNAWAY)
    result = pytest_in(project, "-v", "experiments")
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "experiments/runaway.cobalt.py::runaway[quick] PASSED" in out
    assert "experiments/runaway.cobalt.py::runaway[spins] FAILED" in out
    assert "timed out after 1s (its code was stopped)" in out
    assert "did not stop" not in out  # the thread was interrupted, not abandoned


def test_k_runs_only_the_selected_items_and_lf_reruns_the_failures(project: Project):
    project.write("experiments/qa.cobalt.py", QA)
    selected = pytest_in(project, "-v", "-k", "france or peru")
    assert selected.returncode == 0, selected.stdout + selected.stderr
    assert "2 passed, 3 deselected" in selected.stdout
    assert history(project) == [("qa-agent", 2)]  # the agent ran on the two selected items

    everything = pytest_in(project, "--lf", "-q")  # no last failures yet: all run
    assert everything.returncode == 1
    last_failed = pytest_in(project, "--lf", "-v")
    assert last_failed.returncode == 1
    assert "qa-agent[capital-canada] FAILED" in last_failed.stdout
    assert "qa-agent[capital-france]" not in last_failed.stdout
    assert history(project)[-1] == ("qa-agent", 2)  # canada and chad


def test_plain_tests_use_assert_scores_and_the_plugin_can_be_turned_off(project: Project):
    project.write("experiments/qa.cobalt.py", QA)
    project.write("tests/test_plain.py", PLAIN_TEST)
    plain = pytest_in(project, "tests/test_plain.py")
    assert plain.returncode == 1
    assert "misses its thresholds" in plain.stdout and "exact avg 0.5 < 0.9" in plain.stdout

    off = pytest_in(project, "-p", "no:cobalt", "experiments", "-q")
    assert "no tests ran" in off.stdout  # *.cobalt.py are not test files without the plugin
    assert [name for name, _ in history(project)] == ["plain"]
