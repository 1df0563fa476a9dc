"""The doors of budgets and project-wide stubs: MCP `cobalt_run` with `maxToolCalls`, and
`[budget]` / `[[intercept]]` in cobalt.toml."""

from __future__ import annotations

import pytest
from mcp import ClientSession

import cobalt
from cobalt import Dataset
from cobalt.config import ConfigError, load_config
from cobalt_app.models import ItemResult, Run
from tests.conftest import Project
from tests.helpers import define, execute_one
from tests.test_api import api, api_project, token, user, wait_finished  # noqa: F401 - fixtures
from tests.test_mcp import run_session, text_of

RUNAWAY = """
import cobalt
from cobalt import Dataset, experiment


@cobalt.tool
def search(q: str) -> list:
    return []


@experiment("runaway", Dataset(items=[{"id": "a", "input": "x"}]))
def run(ctx):
    while True:
        search(ctx.item["input"])
"""


def test_mcp_cobalt_run_stops_a_runaway_agent_at_max_tool_calls(
    project: Project, fake_provider_server
):
    project.write("experiments/runaway.cobalt.py", RUNAWAY)
    seen = {}

    async def scenario(session: ClientSession) -> None:
        result = await session.call_tool(
            "cobalt_run", {"file": "experiments/runaway.cobalt.py", "maxToolCalls": 4}
        )
        assert not result.is_error, text_of(result)
        seen["run"] = result.structured_content["runs"][0]

    run_session(project, fake_provider_server, scenario)
    (item,) = seen["run"]["items"]
    assert item["status"] == "error"
    assert item["error"].startswith("budget exceeded: max_tool_calls=4 reached (4 tool calls made)")


@cobalt.tool
def search(q: str) -> str:
    return "live"


def loop(ctx):
    answers = []
    for _ in range(5):
        answers.append(search("q"))
    return answers


@pytest.mark.django_db(transaction=True)
def test_the_projects_intercept_and_budget_tables_apply_to_every_experiment(project: Project):
    project.write(
        "cobalt.toml",
        """
        test_dir = "experiments"

        [budget]
        max_tool_calls = 3

        [[intercept]]
        tool = "search"
        returns = "from the project"
        times = 2
        """,
    )
    data = Dataset(items=[{"id": "a"}])
    run = execute_one(project, define("project-wide", data, loop))
    (result,) = ItemResult.objects.filter(run=run)
    assert result.error.startswith("budget exceeded: max_tool_calls=3")
    assert run.config["maxToolCalls"] == 3
    generous = execute_one(project, define("own-budget", data, loop, max_tool_calls=10))
    (result,) = ItemResult.objects.filter(run=generous)
    assert result.output == ["from the project"] * 2 + ["live"] * 3


def test_bad_budget_and_intercept_tables_are_refused_with_their_names(tmp_path):
    (tmp_path / "cobalt.toml").write_text("[budget]\nmax_tool_calls = 0\n")
    with pytest.raises(ConfigError, match="`max_tool_calls` must be a whole number above 0"):
        load_config(tmp_path)
    (tmp_path / "cobalt.toml").write_text('[[intercept]]\ntool = "search"\nstatus = 500\n')
    with pytest.raises(ConfigError, match=r"intercept\[0\]: stub 'tool:search': `status`"):
        load_config(tmp_path)


@pytest.mark.django_db(transaction=True)
def test_the_api_starts_a_run_with_a_tool_call_budget(api_project, api):  # noqa: F811
    api_project.write("experiments/runaway.cobalt.py", RUNAWAY)
    response = api.post(
        "/api/runs/", {"file": "experiments/runaway.cobalt.py", "maxToolCalls": 2}, format="json"
    )
    assert response.status_code == 202, response.content
    body = wait_finished(api, response.json()["id"])
    assert Run.objects.get(id=body["id"]).config["maxToolCalls"] == 2
    (item,) = api.get(f"/api/runs/{body['id']}/items/").json()["results"]
    assert item["status"] == "error"
    assert item["error"].startswith("budget exceeded: max_tool_calls=2")
    refused = api.post(
        "/api/runs/", {"file": "experiments/runaway.cobalt.py", "maxToolCalls": 0}, format="json"
    )
    assert refused.status_code == 400 and "maxToolCalls" in refused.json()
