"""A run started through MCP is never left running: cancelled by the client, the client killed,
the client leaving, the server terminated — each ends with the run `cancelled` and finalised
(summary and results file), and no agent call after it. Each test drives the real server
through the official client; the agent calls the fake provider, which counts the calls."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession

from tests.conftest import Project, cli_env
from tests.test_mcp import ENV_KEY, mcp_session

CONCURRENCY = 2
ITEMS = 100  # 15 s of work at CONCURRENCY: no run ends before the test stops it, even under load
DEADLINE = 20  # seconds any awaited outcome may take before the test fails

SLOW_EXPERIMENT = f"""\
from openai import AsyncOpenAI
from cobalt import Dataset, Evaluator, experiment

client = AsyncOpenAI()
dataset = Dataset(items=[{{"id": f"q{{i:02d}}", "input": f"question {{i}}"}} for i in range({ITEMS})])


def answered(ctx):
    return {{"score": 1.0, "reason": "answered"}}


evaluators = [Evaluator(name="answered", type="function", fn=answered)]


@experiment("slow", dataset, evaluators=evaluators, concurrency={CONCURRENCY})
async def run(ctx):
    messages = [{{"role": "user", "content": "ECHO: " + ctx.item["input"]}}]
    reply = await client.chat.completions.create(model="fake", messages=messages)
    return reply.choices[0].message.content
"""

KILLABLE_CLIENT = """\
import os, sys
import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


async def main():
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "cobalt_cli", "mcp"], cwd=sys.argv[1], env=dict(os.environ)
    )
    with open(sys.argv[2], "a") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()

                async def on_progress(value, total, message):
                    print("progress", int(value), flush=True)

                await session.call_tool("cobalt_run", {"filter": "slow"}, progress_callback=on_progress)
                print("returned", flush=True)


anyio.run(main)
"""


@pytest.fixture
def slow(project: Project, fake_provider, monkeypatch) -> Project:
    """A project whose experiment makes one provider call per item, 0.3 s each."""
    project.write("experiments/slow.cobalt.py", SLOW_EXPERIMENT)
    monkeypatch.setattr(fake_provider, "latency", 0.3)
    return project


def environment(fake) -> dict[str, str]:
    return cli_env({"OPENAI_BASE_URL": fake.openai_base_url, "OPENAI_API_KEY": ENV_KEY})


def errlog_of(project: Project) -> Path:
    return project.path.parent / "mcp-server.log"


def poll(check, what: str) -> Any:
    """`check()` once it is truthy; fails after DEADLINE seconds."""
    deadline = time.monotonic() + DEADLINE
    while not (value := check()):
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.05)
    return value


def finalised(project: Project) -> dict[str, Any]:
    """The run's results file, once the run is finalised (written then, atomically)."""
    (path,) = poll(project.results_files, "the results file of the run")
    return json.loads(path.read_text())


def assert_cancelled_and_nothing_left_running(project: Project, fake) -> dict[str, Any]:
    results = finalised(project)
    statuses = [item["status"] for item in results["items"]]
    poll(lambda: "cobalt mcp stopped" in errlog_of(project).read_text(), "the server to exit")
    calls = fake.request_count("/v1/chat")
    assert results["status"] == "cancelled"
    assert set(statuses) == {"ok", "cancelled"} and len(statuses) == ITEMS
    # Items stopped: those that finished, plus at most the ones in flight when it was cancelled.
    assert calls <= statuses.count("ok") + CONCURRENCY < ITEMS
    assert results["summary"]["itemStatus"]["cancelled"] == statuses.count("cancelled")
    return results


async def call_until_three_items(session: ClientSession, done: dict[str, Any]) -> None:
    """Start a run and return once three items finished, leaving the call going in `done`."""
    three = anyio.Event()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        if value >= 3:
            three.set()

    async def call() -> None:
        try:
            done["result"] = await session.call_tool(
                "cobalt_run", {"filter": "slow"}, progress_callback=on_progress
            )
        except Exception as exc:  # the connection closed under the call
            done["error"] = exc

    done["group"].start_soon(call)
    await three.wait()


def test_a_cancelled_call_cancels_its_run_and_the_server_goes_on(slow, fake_provider):
    seen: dict[str, Any] = {}

    async def main() -> None:
        with anyio.fail_after(60):
            async with mcp_session(slow.path, environment(fake_provider), errlog_of(slow)) as s:
                async with anyio.create_task_group() as group:
                    await call_until_three_items(s, {"group": group})
                    group.cancel_scope.cancel()  # the client sends notifications/cancelled
                cancelled_at = time.monotonic()
                while (await s.call_tool("cobalt_results", {})).structured_content["runs"][0][
                    "status"
                ] != "cancelled":
                    assert time.monotonic() - cancelled_at < DEADLINE, "the run is not cancelled"
                    await anyio.sleep(0.05)
                seen["cancelling"] = time.monotonic() - cancelled_at
                seen["calls"] = fake_provider.request_count("/v1/chat")
                again = await s.call_tool("cobalt_results", {"runId": "no-such-run"})
                seen["next"] = again

    anyio.run(main)

    results = assert_cancelled_and_nothing_left_running(slow, fake_provider)
    assert seen["cancelling"] < 5
    assert fake_provider.request_count("/v1/chat") == seen["calls"]  # none after it ended
    assert seen["next"].is_error and "no run with id" in seen["next"].content[0].text
    assert f"run(s) ['{results['id']}'] finalised as cancelled" in errlog_of(slow).read_text()


def test_a_client_that_leaves_mid_run_leaves_no_run_running(slow, fake_provider):
    done: dict[str, Any] = {}

    async def main() -> None:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                done["group"] = group
                async with mcp_session(slow.path, environment(fake_provider), errlog_of(slow)) as s:
                    await call_until_three_items(s, done)
                # stdin is closed while the call is going; the client waits for the server

    anyio.run(main)

    assert "result" not in done
    assert_cancelled_and_nothing_left_running(slow, fake_provider)


def test_a_killed_client_leaves_no_run_running(slow, fake_provider):
    client = subprocess.Popen(
        [sys.executable, "-c", KILLABLE_CLIENT, str(slow.path), str(errlog_of(slow))],
        env=environment(fake_provider),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for line in client.stdout:
            if line.strip() == "progress 3":
                break
        client.kill()
    finally:
        client.wait(timeout=DEADLINE)

    assert_cancelled_and_nothing_left_running(slow, fake_provider)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_terminated_server_finalises_its_run_before_it_exits(slow, fake_provider, signum):
    done: dict[str, Any] = {}

    async def main() -> None:
        with anyio.fail_after(60):
            async with (
                mcp_session(slow.path, environment(fake_provider), errlog_of(slow)) as s,
                anyio.create_task_group() as group,
            ):
                done["group"] = group
                await call_until_three_items(s, done)
                log = errlog_of(slow).read_text()
                os.kill(int(re.search(r"pid (\d+)\)", log)[1]), signum)

    anyio.run(main)

    assert "result" not in done
    assert_cancelled_and_nothing_left_running(slow, fake_provider)
    assert f"{signum.name}: stopping" in errlog_of(slow).read_text()
