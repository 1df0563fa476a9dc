"""The user's code under a long-lived `cobalt mcp`: every edit is what runs next (also within
the same second, also outside the project), nothing it prints reaches the protocol, and a
runner that hangs is stopped or named."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.conftest import cli_env
from tests.test_mcp import ENV_KEY, run_session, text_of

WORD_EXPERIMENT = """\
import sys

sys.path.insert(0, {outside!r})

from agents.words import WORD
from shared_helper import SUFFIX
from cobalt import Dataset, Evaluator, experiment


def said(ctx):
    return {{"score": 1.0, "reason": "said"}}


@experiment("words", Dataset(items=[{{"id": "only", "input": "x"}}]),
            evaluators=[Evaluator(name="said", type="function", fn=said)])
def run(ctx):
    return WORD + SUFFIX
"""


def same_second_edit(path: Path, old: str, new: str) -> None:
    """Replace `old` by `new` (as long) and give the file back its modification time: Python's
    bytecode check (mtime and size) cannot see the edit."""
    assert len(old) == len(new)
    before = path.stat()
    path.write_text(path.read_text().replace(old, new))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (path.stat().st_mtime_ns, path.stat().st_size) == (before.st_mtime_ns, before.st_size)


def test_edits_in_the_same_second_inside_and_outside_the_project_are_what_runs(
    project, fake_provider_server, tmp_path
):
    outside = tmp_path / "shared"
    helper = outside / "shared_helper.py"
    outside.mkdir()
    helper.write_text("SUFFIX = '-one'\n")
    agent = project.write("agents/words.py", "WORD = 'alpha'\n")
    project.write("agents/__init__.py", "")
    project.write("experiments/words.cobalt.py", WORD_EXPERIMENT.format(outside=str(outside)))
    outputs: list[str] = []
    modules: list[dict[str, Any]] = []

    async def run_once(session: ClientSession) -> None:
        result = await session.call_tool("cobalt_run", {"filter": "words"})
        assert not result.is_error, text_of(result)
        outputs.append(result.structured_content["runs"][0]["items"][0]["output"]["output"])
        modules.append(result.structured_content["modules"])

    async def scenario(session: ClientSession) -> None:
        await run_once(session)
        same_second_edit(agent, "alpha", "omega")
        await run_once(session)
        same_second_edit(helper, "-one", "-two")
        await run_once(session)
        await run_once(session)

    # Python writes bytecode, as it does by default (the test environment turns it off).
    run_session(project, fake_provider_server, scenario, PYTHONDONTWRITEBYTECODE="")

    assert (project.path / "agents" / "__pycache__").is_dir()
    assert outputs == ["alpha-one", "omega-one", "omega-two", "omega-two"]
    assert [m["outsideProject"] for m in modules] == [["shared_helper"]] * 4
    assert [m["reloadedOutsideProject"] for m in modules] == [[], [], ["shared_helper"], []]


CHATTY_EXPERIMENT = """\
import os
import subprocess
import sys

from cobalt import Dataset, Evaluator, experiment

print("chatter while the experiment is imported")


def fine(ctx):
    return {"score": 1.0, "reason": "fine"}


@experiment("chatty", Dataset(items=[{"id": f"i{n}", "input": n} for n in range(6)]),
            evaluators=[Evaluator(name="fine", type="function", fn=fine)])
def run(ctx):
    print("a print without a newline", end="")  # left in a buffer until the process ends
    sys.stdout.write("a direct write ")
    os.write(1, b"a write to file descriptor 1\\n")
    subprocess.run([sys.executable, "-c", "print('a child process')"], check=True)
    return "done"
"""


def test_nothing_user_code_prints_reaches_the_protocol(project, fake_provider_server):
    project.write("experiments/chatty.cobalt.py", CHATTY_EXPERIMENT)
    wire = project.path.parent / "stdout.log"
    errlog = project.path.parent / "stderr.log"
    env = cli_env({"OPENAI_BASE_URL": fake_provider_server.openai_base_url})
    del env["PYTHONUNBUFFERED"]  # as a client starts it: `print()` is buffered
    # The server's stdout goes through `tee`, which keeps a copy of every byte sent.
    params = StdioServerParameters(
        command="sh",
        args=["-c", f'"{sys.executable}" -m cobalt_cli mcp | tee "{wire}"'],
        cwd=str(project.path),
        env=env,
    )
    seen: dict[str, Any] = {}

    async def main() -> None:
        with anyio.fail_after(60), errlog.open("w") as log:
            async with (
                stdio_client(params, errlog=log) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                seen["run"] = await session.call_tool("cobalt_run", {})
                seen["again"] = await session.call_tool("cobalt_run", {})

    anyio.run(main)

    assert not seen["run"].is_error and not seen["again"].is_error, text_of(seen["run"])
    sent = wire.read_text().splitlines()
    assert len(sent) >= 4  # initialize, two results, progress notifications
    assert all(json.loads(line)["jsonrpc"] == "2.0" for line in sent)
    stderr = errlog.read_text()
    assert stderr.count("chatter while the experiment is imported") == 2
    assert stderr.count("a write to file descriptor 1") == 12
    assert stderr.count("a child process") == 12
    assert stderr.count("a direct write") == 12
    assert stderr.count("a print without a newline") == 12  # flushed before the exit


HANGING_EXPERIMENT = """\
import time

from cobalt import Dataset, experiment

items = [{"id": "spins"}, {"id": "sleeps"}, {"id": "answers"}]


@experiment("hanging", Dataset(items=items), timeout=0.5, concurrency=3)
def run(ctx):
    if ctx.item["id"] == "spins":
        while True:  # Python code: the thread can be stopped
            pass
    if ctx.item["id"] == "sleeps":
        time.sleep(600)  # inside a C call: it cannot
    return "answered"
"""


def test_a_hanging_runner_is_stopped_where_python_can_and_named_where_it_cannot(
    project, fake_provider_server
):
    project.write("experiments/hanging.cobalt.py", HANGING_EXPERIMENT)
    seen: dict[str, Any] = {}

    async def scenario(session: ClientSession) -> None:
        seen["run"] = await session.call_tool("cobalt_run", {})

    stderr = run_session(project, fake_provider_server, scenario, OPENAI_API_KEY=ENV_KEY)

    result = seen["run"]
    assert not result.is_error, text_of(result)
    (document,) = result.structured_content["runs"]
    statuses = {item["key"]: item["status"] for item in document["items"]}
    assert statuses == {"spins": "timeout", "sleeps": "timeout", "answers": "ok"}
    assert document["status"] == "completed"
    (orphan,) = result.structured_content["orphanedThreads"]  # the sleeper only
    assert orphan.startswith("cobalt-runner")
    assert "1 synchronous runner threads are still in user code" in text_of(result)
    assert f"leaving runner threads still in user code: {orphan}" in stderr
    assert "cobalt mcp stopped" in stderr and "SIGTERM" not in stderr
