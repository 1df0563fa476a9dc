"""`cobalt run --watch`: a rerun when the agent module the experiment imports is edited, the
change per evaluator since the previous run, and a clean stop on Ctrl-C. The real command."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time

from tests.conftest import Project, cli_env

EXPERIMENT = """
from agent import answer
from cobalt import Dataset, Evaluator, experiment

experiment(
    "watched",
    Dataset.from_file("datasets/qa.jsonl"),
    lambda ctx: answer(ctx.item["input"]),
    evaluators=[Evaluator(name="exact", type="exact-match")],
)
"""


def runs(project: Project) -> list[tuple[str, str]]:
    if not project.db_path.exists():
        return []
    with sqlite3.connect(project.db_path) as db:
        try:
            return db.execute(
                "SELECT id, status FROM cobalt_app_run ORDER BY created_at"
            ).fetchall()
        except sqlite3.OperationalError:
            return []


def wait_until(condition, *, timeout: float, what: str, process: subprocess.Popen) -> float:
    started = time.monotonic()
    while not condition():
        assert process.poll() is None, f"cobalt run --watch exited: {process.communicate()}"
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - started


def test_an_edit_to_the_agent_reruns_the_experiment_and_ctrl_c_stops_watching(project: Project):
    project.write_jsonl(
        "datasets/qa.jsonl",
        [{"id": f"q{i}", "input": f"q{i}", "expected_output": f"a{i}"} for i in range(4)],
    )
    project.write("agent.py", "def answer(question):\n    return 'wrong'\n")
    project.write("experiments/watched.cobalt.py", EXPERIMENT)
    log = project.path / "watch.out"
    process = subprocess.Popen(
        [sys.executable, "-m", "cobalt_cli", "run", "--watch"],
        cwd=project.path,
        env=cli_env({"PYTHONPATH": f"{project.path}"}),
        stdout=log.open("w"),
        stderr=subprocess.PIPE,
        text=True,
    )

    def watching(times: int) -> bool:
        return log.read_text(encoding="utf-8").count("for changes (Ctrl-C to stop)") >= times

    try:
        wait_until(lambda: watching(1), timeout=60, what="the first run", process=process)
        project.write("agent.py", "def answer(question):\n    return 'a' + question[1:]\n")
        reacted = wait_until(
            lambda: len(runs(project)) == 2, timeout=60, what="a rerun", process=process
        )
        print(f"rerun started {reacted:.2f}s after the edit")
        wait_until(lambda: watching(2), timeout=60, what="the rerun to finish", process=process)
        project.write("datasets/qa.jsonl", '{"id": "q9", "input": "q9", "expected_output": "a9"}\n')
        wait_until(
            lambda: len(runs(project)) == 3, timeout=60, what="a dataset rerun", process=process
        )
        wait_until(lambda: watching(3), timeout=60, what="the third run", process=process)
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    out = log.read_text(encoding="utf-8")
    assert process.returncode == 0, err
    first, second, _ = runs(project)
    assert f"watched since run {first[0]}: exact 0.00 → 1.00 (+1.00)" in out
    assert "Changed: agent.py" in out and "Changed: datasets/qa.jsonl" in out
    assert "Stopped watching." in out
