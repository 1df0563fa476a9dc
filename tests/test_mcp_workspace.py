"""Workspace mode: `cobalt mcp` started at the root of a monorepo serves every project below
it, each with its own database, configuration and confinement."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession

from tests.conftest import Project, cli_env
from tests.test_mcp import ENV_KEY, mcp_session, text_of
from tests.test_mcp_lifecycle import (
    SLOW_EXPERIMENT,
    assert_cancelled_and_nothing_left_running,
    environment,
    errlog_of,
)

EXPERIMENT = """\
from cobalt import Dataset, Evaluator, experiment


def right(ctx):
    good = ctx.output == ctx.item["expected"]
    return {{"score": float(good), "reason": "right" if good else "wrong"}}


@experiment("{name}", Dataset(items={items!r}),
            evaluators=[Evaluator(name="right", type="function", fn=right)])
def run(ctx):
    return ctx.item["input"].upper()
"""


def make_project(folder: Path, name: str, items: list[dict[str, str]], concurrency: int) -> None:
    project = Project(folder)
    project.write("cobalt.toml", f'test_dir = "experiments"\nconcurrency = {concurrency}\n')
    project.write(f"experiments/{name}.cobalt.py", EXPERIMENT.format(name=name, items=items))


def test_a_workspace_serves_each_project_with_its_own_database_and_confinement(
    tmp_path, fake_provider_server
):
    root = tmp_path / "monorepo"
    make_project(root / "search", "search-qa", [{"input": "a", "expected": "A"}], 3)
    make_project(
        root / "services" / "billing",
        "billing-qa",
        [{"input": "b", "expected": "B"}, {"input": "c", "expected": "x"}],
        7,
    )
    (root / "node_modules" / "pkg").mkdir(parents=True)
    (root / "node_modules" / "pkg" / "cobalt.toml").write_text("")  # vendored: not a project
    errlog = tmp_path / "mcp-server.log"
    env = cli_env({"OPENAI_BASE_URL": fake_provider_server.openai_base_url})
    env["OPENAI_API_KEY"] = ENV_KEY
    seen: dict[str, Any] = {}

    async def resource(session: ClientSession, uri: str) -> dict[str, Any]:
        return json.loads((await session.read_resource(uri)).contents[0].text)

    async def main() -> None:
        with anyio.fail_after(90):
            async with mcp_session(root, env, errlog) as session:
                tools = {t.name: t for t in (await session.list_tools()).tools}
                seen["properties"] = {
                    n: set(t.input_schema["properties"]) for n, t in tools.items()
                }
                seen["experiments"] = await resource(session, "cobalt://experiments")
                seen["config"] = await resource(session, "cobalt://config")
                seen["ambiguous"] = await session.call_tool("cobalt_run", {})
                seen["unknown"] = await session.call_tool("cobalt_run", {"project": "nope"})
                seen["escape"] = await session.call_tool(
                    "cobalt_run",
                    {
                        "project": "search",
                        "file": "../services/billing/experiments/billing-qa.cobalt.py",
                    },
                )
                seen["search"] = await session.call_tool("cobalt_run", {"project": "search"})
                seen["billing"] = await session.call_tool(
                    "cobalt_run", {"project": "./services/billing/"}
                )
                seen["search_runs"] = await session.call_tool(
                    "cobalt_results", {"project": "search"}
                )
                seen["latest"] = await resource(session, "cobalt://latest-results")

    anyio.run(main)

    assert all("project" in properties for properties in seen["properties"].values())
    projects = seen["experiments"]["projects"]
    assert set(projects) == {"search", "services/billing"}
    assert projects["search"]["experiments"] == [
        {"path": "experiments/search-qa.cobalt.py", "name": "search-qa"}
    ]
    config = seen["config"]["projects"]
    assert (config["search"]["concurrency"], config["services/billing"]["concurrency"]) == (3, 7)

    assert seen["ambiguous"].is_error
    assert "name one as project: search, services/billing" in text_of(seen["ambiguous"])
    assert seen["unknown"].is_error and "no project 'nope'" in text_of(seen["unknown"])
    assert seen["escape"].is_error and "resolves outside the project folder" in text_of(
        seen["escape"]
    )

    search, billing = seen["search"], seen["billing"]
    assert not search.is_error and not billing.is_error, text_of(search) + text_of(billing)
    assert search.structured_content["project"] == "search"
    assert billing.structured_content["project"] == "services/billing"
    assert billing.structured_content["runs"][0]["itemCounts"]["failing"] == 1
    # Each project keeps its own database and results.
    listed = seen["search_runs"].structured_content["runs"]
    assert [run["name"] for run in listed] == ["search-qa"]
    assert len(list((root / "search" / ".cobalt" / "results").glob("*.json"))) == 1
    assert len(list((root / "services" / "billing" / ".cobalt" / "results").glob("*.json"))) == 1
    assert (root / "search" / ".cobalt" / "history.db").exists()
    assert not (root / ".cobalt").exists()
    latest = seen["latest"]["projects"]
    assert [r["name"] for r in latest["services/billing"]["results"]] == ["billing-qa"]
    assert "cobalt mcp serving the workspace" in errlog.read_text()


def test_a_workspace_forwards_progress_and_cancellation_to_the_project(
    tmp_path, fake_provider, monkeypatch
):
    root = tmp_path / "monorepo"
    slow = Project(root / "slow")
    slow.write("cobalt.toml", 'test_dir = "experiments"\n')
    slow.write("experiments/slow.cobalt.py", SLOW_EXPERIMENT)
    make_project(root / "other", "other-qa", [{"input": "a", "expected": "A"}], 2)
    monkeypatch.setattr(fake_provider, "latency", 0.3)
    env = environment(fake_provider)

    async def main() -> None:
        with anyio.fail_after(60):
            async with mcp_session(root, env, errlog_of(slow)) as session:
                three = anyio.Event()

                async def on_progress(value: float, total: float | None, message: str | None):
                    if value >= 3:
                        three.set()

                async def call() -> None:
                    await session.call_tool(
                        "cobalt_run", {"project": "slow"}, progress_callback=on_progress
                    )

                async with anyio.create_task_group() as group:
                    group.start_soon(call)
                    await three.wait()  # progress came through the workspace server
                    group.cancel_scope.cancel()

    anyio.run(main)

    assert_cancelled_and_nothing_left_running(slow, fake_provider)
    assert "finalised as cancelled" in errlog_of(slow).read_text()
