"""Timeouts that stop: an item's agent is stopped when its timeout passes (issue 33).

The real `cobalt run` in a throwaway project, its agents calling the fake provider with the
real OpenAI SDK; the provider's log of requests (with their times) shows when the calls
stopped. Each runner writes the moment it started, so "after the timeout" is measured from
the agent's own start.
"""

import sqlite3
import time

import pytest

from tests.team_harness import Team

pytestmark = pytest.mark.timeout(240)

SLACK = 1.0  # seconds past the timeout: the call in flight then, and the loop's own lag

HEAD = """
import asyncio
import time
from pathlib import Path

from openai import AsyncOpenAI, OpenAI

from cobalt import Dataset, Evaluator, experiment

STARTS = Path(__file__).resolve().parent.parent / "starts.log"


def started(ctx):
    with STARTS.open("a") as log:
        log.write(f"{ctx.index} {time.time()}\\n")


def ask(client, ctx):
    return client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": f"ECHO: item {ctx.index}"}]
    )
"""


def write(project, body: str, *, items: int = 1, grace: float | None = None) -> None:
    config = 'test_dir = "experiments"\n'
    if grace is not None:
        config += f"timeout_grace = {grace}\n"
    (project.path / "cobalt.toml").write_text(config)
    dataset = f'dataset = Dataset(items=[{{"id": i, "input": f"q{{i}}"}} for i in range({items})])'
    project.write("experiments/agent.cobalt.py", HEAD + "\n" + dataset + "\n" + body)


def items(project) -> dict[int, tuple[str, str]]:
    """item index -> (status, error), from the project's database."""
    with sqlite3.connect(project.path / ".cobalt" / "history.db") as db:
        rows = db.execute("SELECT item_index, status, error FROM cobalt_app_itemresult").fetchall()
    return {index: (status, error) for index, status, error in rows}


def starts(project) -> dict[int, float]:
    lines = (project.path / "starts.log").read_text().split()
    return {int(index): float(at) for index, at in zip(lines[::2], lines[1::2], strict=True)}


def calls_after(fake_provider, moment: float) -> list[float]:
    return [r["wall_time"] for r in fake_provider.requests if r["wall_time"] > moment]


def test_a_sync_agent_looping_on_model_calls_is_stopped_at_its_timeout(
    project, fake_provider, cobalt_cli
):
    fake_provider.latency = 0.05
    write(
        project,
        """
@experiment("loop", dataset, timeout=2, evaluators=[Evaluator(name="c", type="contains", value="x")])
def run(ctx):
    started(ctx)
    client = OpenAI()
    while True:
        ask(client, ctx)
""",
    )
    result = cobalt_cli(project, "run", timeout=90)
    assert "Run ID:" in result.stdout, result.stderr
    status, error = items(project)[0]
    assert status == "timeout"
    assert error == "timed out after 2s (its code was stopped)"
    begun = starts(project)[0]
    assert len(calls_after(fake_provider, begun)) > 3  # it was looping
    assert calls_after(fake_provider, begun + 2 + SLACK) == []  # and the process is gone
    assert "item #1 timeout: timed out after 2s (its code was stopped)" in result.stdout


def test_an_async_agent_that_swallows_cancellation_is_stopped(project, fake_provider, cobalt_cli):
    fake_provider.latency = 0.05
    write(
        project,
        """
@experiment("swallow", dataset, timeout=2)
async def run(ctx):
    started(ctx)
    client = AsyncOpenAI()
    while True:
        try:
            await client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "ECHO: hi"}]
            )
        except asyncio.CancelledError:
            pass  # keeps going, as badly written agents do
        except Exception:
            pass
""",
    )
    result = cobalt_cli(project, "run", timeout=90)
    assert "Run ID:" in result.stdout, result.stderr
    assert items(project)[0] == ("timeout", "timed out after 2s (its code was stopped)")
    begun = starts(project)[0]
    assert len(calls_after(fake_provider, begun)) > 3
    assert calls_after(fake_provider, begun + 2 + SLACK) == []


def test_a_timed_out_agents_next_tool_call_raises_inside_it(project, fake_provider, cobalt_cli):
    # No HTTP at all: the tool step it starts after its timeout is what stops it (without
    # that, it would loop on until the grace period and be left running).
    write(
        project,
        """
import cobalt

@cobalt.tool
def lookup(order):
    return {"order": order}

@experiment("tools", dataset, timeout=1)
async def run(ctx):
    started(ctx)
    while True:
        try:
            lookup("o-1")
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            pass
""",
        grace=30,
    )
    result = cobalt_cli(project, "run", timeout=90)
    assert "Run ID:" in result.stdout, result.stderr
    assert items(project)[0] == ("timeout", "timed out after 1s (its code was stopped)")


def test_a_busy_sync_agent_is_interrupted_and_its_neighbours_are_not(
    project, fake_provider, cobalt_cli
):
    # Item 0 spins in pure Python; the others, on the same two threads, sleep a little in
    # Python code (where an interruption meant for item 0 would land if it strayed).
    write(
        project,
        """
@experiment("busy", dataset, timeout=1, concurrency=2)
def run(ctx):
    started(ctx)
    if ctx.index == 0:
        n = 0
        while True:
            n += 1
    until = time.monotonic() + 0.2
    while time.monotonic() < until:
        pass
    return "done"
""",
        items=12,
    )
    result = cobalt_cli(project, "run", timeout=90)
    assert "Run ID:" in result.stdout, result.stderr
    found = items(project)
    assert found[0] == ("timeout", "timed out after 1s (its code was stopped)")
    assert {index: status for index, (status, _) in found.items() if index} == {
        index: "ok" for index in range(1, 12)
    }


def test_an_agent_blocked_in_c_is_left_after_the_grace_and_the_run_ends(
    project, fake_provider, cobalt_cli
):
    # Item 0 sleeps for an hour (no Python instruction to interrupt); with concurrency 1 the
    # other items run only if the pool starts a thread in place of the one left behind.
    write(
        project,
        """
@experiment("blocked", dataset, timeout=1, concurrency=1)
def run(ctx):
    started(ctx)
    if ctx.index == 0:
        time.sleep(3600)
    return "done"
""",
        items=3,
        grace=1,
    )
    result = cobalt_cli(project, "run", timeout=90)
    assert "Run ID:" in result.stdout, result.stderr
    found = items(project)
    status, error = found[0]
    assert status == "timeout"
    assert error.startswith("timed out after 1s and its code did not stop within 1s")
    assert "thread cobalt-runner_0 was left running" in error
    assert [found[1][0], found[2][0]] == ["ok", "ok"]
    assert "the code of 1 item did not stop after the timeout (#1)" in result.stdout


def test_an_agent_that_swallows_the_interruption_is_left_after_the_grace(
    project, fake_provider, cobalt_cli
):
    write(
        project,
        """
@experiment("stubborn", dataset, timeout=1)
def run(ctx):
    started(ctx)
    while True:
        try:
            while True:
                pass
        except BaseException:
            pass  # swallows even Cobalt's interruption
""",
        grace=1.5,
    )
    result = cobalt_cli(project, "run", timeout=90)
    assert "Run ID:" in result.stdout, result.stderr
    status, error = items(project)[0]
    assert status == "timeout" and "its code did not stop within 1.5s" in error


def test_a_team_worker_stops_a_looping_agent_at_its_timeout(team: Team, fake_provider_server):
    fake_provider_server.latency = 0.05
    source = HEAD.replace(
        'Path(__file__).resolve().parent.parent / "starts.log"',
        f'Path({str(team.folder)!r}) / "starts.log"',
    )
    (team.folder / "experiments" / "loop.cobalt.py").write_text(
        source
        + f"""
dataset = Dataset(items=[{{"id": 0, "input": "q0"}}])

@experiment("team-loop", dataset, timeout=4, tags=[{team.queue!r}])
def run(ctx):
    started(ctx)
    client = OpenAI()
    while True:
        ask(client, ctx)
"""
    )
    worker = team.start_worker()
    result = team.cli("run", timeout=120)
    assert "Run ID:" in result.stdout, result.stderr
    run_id = team.latest_run()
    (error,) = team.services.query(
        "SELECT error FROM cobalt_app_itemresult WHERE run_id = %s", [run_id]
    )[0]
    assert error == "timed out after 4s (its code was stopped)"
    begun = float((team.folder / "starts.log").read_text().split()[1])
    # A worker's first model call can take seconds on a loaded machine (its client, the
    # instrumentation): the item has 4 s, and calls until then.
    assert len(calls_after(fake_provider_server, begun)) >= 1
    assert calls_after(fake_provider_server, begun + 4 + SLACK) == []
    time.sleep(1)  # the worker lives on: seeing that it calls no more needs a stretch of time
    assert calls_after(fake_provider_server, begun + 4 + SLACK) == []
    assert worker.popen.poll() is None


def test_timeout_grace_is_a_checked_setting_stored_with_the_run(tmp_path):
    from cobalt.config import ConfigError, load_config
    from cobalt.run_settings import RunSettings

    (tmp_path / "cobalt.toml").write_text('timeout_grace = "soon"\n')
    with pytest.raises(ConfigError) as error:
        load_config(tmp_path)
    assert "`timeout_grace` must be a number of seconds above 0 (got 'soon')" in str(error.value)
    (tmp_path / "cobalt.toml").write_text("timeout_grace = 2.5\n")
    assert RunSettings.from_config(load_config(tmp_path)).timeout_grace == 2.5
    assert RunSettings.from_run_config({"timeoutGrace": 2.5}).timeout_grace == 2.5
    assert RunSettings.from_run_config({}).timeout_grace == 5


def run_on(threads, *calls):
    """Each (fn, RunningCall) on `threads`, one after another, on the engine's loop."""
    from cobalt_app import aio

    async def all_of() -> list:
        done = []
        for fn, running in calls:
            try:
                done.append(await threads.call(fn, running=running))
            except BaseException as exc:  # noqa: BLE001 - what the call raised is the result
                done.append(exc)
        return done

    return aio.run(all_of())


def test_an_interruption_reaches_only_the_call_it_was_meant_for():
    from cobalt_app.aio import Threads
    from cobalt_app.runaway import AgentStopped, RunningCall

    threads = Threads("runaway-test", 1)  # one thread: every call runs on it
    first, second = RunningCall(), RunningCall()
    try:

        def spin_until_stopped():
            threads.interrupt(first)  # from another thread, as the loop does
            while True:
                pass

        def busy_then_answer():
            threads.interrupt(first)  # late: its call ended, this one must not be hit
            until = time.monotonic() + 0.3
            while time.monotonic() < until:
                pass
            return "answered"

        stopped, answered = run_on(threads, (spin_until_stopped, first), (busy_then_answer, second))
        assert isinstance(stopped, AgentStopped)
        assert answered == "answered"
        assert not threads.interrupt(first) and not threads.running(first)
        # A call given up before a thread takes it never starts.
        never = RunningCall()
        threads.interrupt(never)
        ran = []
        (refused,) = run_on(threads, (lambda: ran.append(1), never))
        assert isinstance(refused, AgentStopped) and ran == []
    finally:
        threads.shutdown()


def test_an_interruption_that_arrives_after_its_call_never_reaches_the_next_one():
    import threading

    from cobalt_app.aio import Threads
    from cobalt_app.runaway import RunningCall

    # The call is a C function (no Python frame of its own): an interruption sent while it
    # sleeps is raised only once it has returned, in the pool's code, before the next call.
    threads = Threads("runaway-test", 1)
    sleeping, after = RunningCall(), RunningCall()
    try:
        timer = threading.Timer(0.1, lambda: threads.interrupt(sleeping))
        timer.start()

        def answer():
            until = time.monotonic() + 0.3
            while time.monotonic() < until:
                pass
            return "answered"

        first, second = run_on(threads, (lambda: time.sleep(0.3), sleeping), (answer, after))
        timer.join()
        assert second == "answered"
    finally:
        threads.shutdown()
