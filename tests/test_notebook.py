"""Experiments where an event loop already runs: a real Jupyter notebook (nbclient and an
IPython kernel), `asyncio.run(...)` in a script; the report renders itself in the notebook."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import REPO, Project, cli_env

AGENT = """
from cobalt import Dataset, Evaluator, experiment

dataset = Dataset(items=[{"id": f"q{i}", "input": f"question {i}", "expected_output": f"answer {i}"}
                         for i in range(12)])

def agent(ctx):
    i = int(ctx.item["id"][1:])
    if i == 7:
        raise RuntimeError("the agent broke on q7")
    return f"answer {i}" if i % 4 else "something else"

exact = Evaluator(name="exact", type="exact-match")
"""


def runs_in_history(project: Project) -> list[tuple[str, str]]:
    with sqlite3.connect(project.db_path) as db:
        return db.execute("SELECT name, status FROM cobalt_app_run ORDER BY created_at").fetchall()


@pytest.mark.timeout(240)
def test_a_notebook_runs_an_experiment_and_shows_its_report(project: Project):
    project.write("agent.py", AGENT)
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(
            "from agent import agent, dataset, exact\nfrom cobalt import experiment"
        ),
        nbformat.v4.new_code_cell(
            'report = experiment("notebook-run", dataset, agent, evaluators=[exact])\nreport'
        ),
        nbformat.v4.new_code_cell(
            'again = await experiment("awaited-run", dataset, agent, evaluators=[exact])\n'
            "print(again.status, len(again.items), [f['key'] for f in again.failures()])"
        ),
        nbformat.v4.new_code_cell(  # a runaway sync agent: stopped at its timeout
            "from cobalt import Dataset\n"
            "def spin(ctx):\n    while True:\n        pass\n"
            'two = Dataset(items=[{"id": "a"}, {"id": "b"}])\n'
            'stopped = experiment("runaway", two, spin, timeout=1)\n'
            "print([item['error'] for item in stopped.items])"
        ),
    ]
    client = NotebookClient(
        notebook,
        timeout=180,
        kernel_name="python3",
        resources={"metadata": {"path": str(project.path)}},  # the kernel's folder
    )
    client.execute(env=cli_env())  # the kernel's environment: nothing of this test's

    run_cell, awaited_cell = notebook.cells[1], notebook.cells[2]
    html = next(o for o in run_cell.outputs if o.output_type == "execute_result")["data"][
        "text/html"
    ]
    assert "notebook-run" in html and "95% CI" in html
    assert "12 items: 11 ok, 1 error, 0 timeouts" in html and "[0.43, 0.90]" in html
    assert "the agent broke on q7" in html and "q0" in html  # failing items with reasons
    progress = [o for o in run_cell.outputs if o.output_type == "display_data"]
    assert len(progress) == 1  # one line updated in place, not a line per item
    assert progress[0]["data"]["text/plain"].startswith(
        "notebook-run: 12/12 items · completed · 11 ok, 1 error, 0 timeouts · run "
    )
    printed = "".join(o.get("text", "") for o in awaited_cell.outputs if o.output_type == "stream")
    assert printed.strip() == "completed 12 ['q0', 'q4', 'q7', 'q8']"
    printed = "".join(o.get("text", "") for o in notebook.cells[3].outputs if "text" in o)
    assert printed.count("timed out after 1s (its code was stopped)") == 2, printed
    assert [name for name, _ in runs_in_history(project)] == [
        "notebook-run",
        "awaited-run",
        "runaway",
    ]


def test_experiment_inside_asyncio_run_returns_its_report(project: Project):
    project.write("agent.py", AGENT)
    project.write(
        "script.py",
        """
        import asyncio
        from agent import agent, dataset, exact
        from cobalt import experiment

        async def main():
            report = experiment("inside-a-loop", dataset, agent, evaluators=[exact])
            awaited = await experiment("awaited", dataset, agent, evaluators=[exact])
            print("RESULT", report.status, awaited.status, len(report.failures()))

        asyncio.run(main())
        """,
    )
    result = subprocess.run(
        [sys.executable, "script.py"],
        cwd=project.path,
        env=cli_env({"PYTHONPATH": f"{REPO}:{project.path}"}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "RESULT completed completed 4" in result.stdout
    assert "SynchronousOnlyOperation" not in result.stderr
    assert [name for name, _ in runs_in_history(project)] == ["inside-a-loop", "awaited"]
    document = json.loads(project.results_files()[0].read_text(encoding="utf-8"))
    assert document["summary"]["itemStatus"]["error"] == 1
