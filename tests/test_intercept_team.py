"""Team mode: a real worker process answers tools from the items' fixtures and the
experiment's stubs, keeps each item's state, and stops a runaway agent at its budget (the
budget given to `cobalt run --max-tool-calls`, stored with the run, read by the worker)."""

from __future__ import annotations

import pytest

from tests.team_harness import Team

EXPERIMENT = """
import cobalt
from cobalt import Dataset, Evaluator, experiment


@cobalt.tool
def search(q: str) -> str:
    return "live " + q


@cobalt.tool
def cancel(order: str) -> str:
    cobalt.state()["orders"][order] = "cancelled"
    return "done"


dataset = Dataset(items=[
    {"id": "stubbed", "input": "refund"},
    {"id": "down", "input": "refund",
     "fixtures": [{"tool": "search", "raises": "search is down", "times": 1}]},
    {"id": "state", "input": "cancel", "expected_state": {"orders": {"A1": "cancelled"}}},
    {"id": "runaway", "input": "loop"},
])


@experiment(
    "team-intercept",
    dataset,
    concurrency=4,
    tags=[TAG],
    intercept=[cobalt.stub("tool:search", returns="stubbed answer")],
    state=lambda item: {"orders": {"A1": "open"}},
    evaluators=[Evaluator(name="state", type="state")],
)
def run(ctx):
    if ctx.item["input"] == "cancel":
        return cancel("A1")
    if ctx.item["input"] == "loop":
        while True:
            try:
                search("again")
            except Exception:
                pass
    try:
        return search(ctx.item["input"])
    except Exception as exc:
        return f"recovered: {exc}"
"""


@pytest.mark.timeout(240)
def test_a_worker_answers_stubs_keeps_state_and_enforces_the_runs_budget(team: Team):
    source = EXPERIMENT.replace("TAG", repr(team.queue))
    (team.folder / "experiments" / "intercept.cobalt.py").write_text(source)
    team.start_worker("--concurrency", "4")
    done = team.cli("run", "--max-tool-calls", "3", timeout=180)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    run_id = team.latest_run()
    rows = team.services.query(
        "SELECT item_key, status, output, metadata, error FROM cobalt_app_itemresult "
        "WHERE run_id = %s",
        [run_id],
    )
    found = {
        key: (status, output, metadata, error) for key, status, output, metadata, error in rows
    }

    assert found["stubbed"][1] == "stubbed answer"
    assert found["down"][1] == "recovered: search is down"
    assert found["down"][2]["intercepted"] == {"injected": 1}
    assert found["state"][2]["state"] == {"orders": {"A1": "cancelled"}}
    status, _, _, error = found["runaway"]
    assert status == "error" and error.startswith("budget exceeded: max_tool_calls=3")
    (score,) = team.services.query(
        "SELECT e.score FROM cobalt_app_evaluation e JOIN cobalt_app_itemresult i "
        "ON e.item_id = i.id WHERE i.run_id = %s AND i.item_key = 'state'",
        [run_id],
    )[0]
    assert score == 1.0
