"""`cobalt_run`: import the experiments, run them on the engine's event loop, stream progress.

A run this server starts is never left running: when the call is cancelled
(`notifications/cancelled`), the client goes away (stdin closes) or the server is stopped
(SIGTERM, SIGINT), the call's task is cancelled, which cancels the launcher's coroutine
(`launcher.launch`, the one way in) on the engine loop: its unfinished items are marked
`cancelled`, the run is finalised as `cancelled` (summary and results file) before the call
returns, shielded from further cancellation. In team mode the call stops following the run
and cancels it (`runs.lifecycle.cancel`): the workers drop its items.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
from mcp.types import CallToolResult, TextContent

from cobalt_app import recordings
from cobalt_cli.mcp.budget import estimate_tokens, value_tokens
from cobalt_cli.mcp.errors import database
from cobalt_cli.mcp.project import Project, Reimport
from cobalt_cli.mcp.reports import run_document
from cobalt_cli.mcp.sdk import Context, ToolError, tool_result

log = logging.getLogger("cobalt.mcp")

FINALISE_TIMEOUT = 30.0  # seconds a cancelled run may take to record and write its results
RUNNER_THREAD = "cobalt-runner"  # the engine's pool of synchronous runners
IDLE_EXIT = 0.2  # seconds an idle runner thread gets to end after its pool shut down
RUNNER_GRACE = 1.0  # seconds a busy one gets to end once asked to
LOAD_ERRORS_SHOWN = 10


class ActiveRuns:
    """How many `cobalt_run` calls are going (on the MCP loop); `idle()` waits for none."""

    def __init__(self) -> None:
        self.count = 0
        self.changed: anyio.Event | None = None

    @contextlib.contextmanager
    def tracking(self) -> Iterator[None]:
        self.count += 1
        try:
            yield
        finally:
            self.count -= 1
            if self.changed is not None:
                self.changed.set()

    async def idle(self) -> None:
        while self.count:
            self.changed = anyio.Event()
            await self.changed.wait()


active_runs = ActiveRuns()


class ProgressRelay:
    """Engine reporter that turns finished items into MCP progress notifications.

    `item_finished` is called on the engine's event-loop thread (or a worker's result thread
    in team mode); events cross to the MCP loop with `call_soon_threadsafe` and `forward()`
    sends them in order.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[tuple[int, int, str] | None] = asyncio.Queue()
        self.lock = threading.Lock()
        self.estimates: list[int] = []
        self.started = 0
        self.done = 0
        self.sent = 0
        self.run_ids: list[str] = []

    def expect(self, experiments: list[Any]) -> None:
        self.estimates = [len(e.dataset) * e.runs for e in experiments]

    def run_started(self, run: Any, experiment: Any) -> None:
        with self.lock:
            if self.started < len(self.estimates):
                self.estimates[self.started] = run.total_items
            else:
                self.estimates.append(run.total_items)
            self.started += 1
            self.run_ids.append(run.id)

    def item_finished(self, outcome: Any, done: int, total: int) -> None:
        try:
            self._relay(outcome, done, total)
        except Exception:  # progress is best effort; the run must go on
            log.exception("progress event dropped")

    def _relay(self, outcome: Any, done: int, total: int) -> None:
        scores = ", ".join(
            f"{e.evaluator} {e.score:.2f}" if e.score is not None else f"{e.evaluator} error"
            for e in outcome.evaluations
        )
        message = f"item {outcome.item_index + 1} {outcome.status}" + (
            f" · {scores}" if scores else ""
        )
        with self.lock:
            self.done += 1
            event = (self.done, max(sum(self.estimates), self.done), f"{done}/{total} {message}")
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)

    def run_finished(self, run: Any) -> None:
        pass

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, None)

    async def forward(self, ctx: Context) -> None:
        while (event := await self.queue.get()) is not None:
            progress, total, message = event
            try:
                await ctx.report_progress(progress, total, message)
                self.sent += 1
            except Exception as exc:  # a client that went away must not fail the run
                log.warning("progress notification not sent: %s", exc)


@dataclass
class Loaded:
    """Experiments imported for one call, and the files that failed to import."""

    config: Any
    experiments: list[Any]
    failures: list[str] = field(default_factory=list)
    modules: Reimport = field(default_factory=Reimport)


def load(project: Project, *, file: str | None, name_filter: str | None) -> Loaded:
    """Import the experiments (a worker thread; the caller holds the project's lock); what
    can be checked before any agent call is, by the launcher."""
    from cobalt_app import discovery, launcher

    config = project.config()
    paths = [str(discovery.runnable_file(file, config, what="file"))] if file else None
    with database(), project.importing() as modules:
        experiments, errors, files = launcher.load_experiments(
            config, paths, name_filter=name_filter
        )
    failures = [
        f"{project.relative(e.path)} failed to import: {e.error}\n"
        + "\n".join((e.traceback or "").strip().splitlines()[-8:])
        for e in errors
    ]
    if not files:
        raise ToolError(
            f"no experiment files under {project.relative(config.test_dir)} (looking for "
            f"{', '.join(config.get('test_match'))}); cobalt_generate can write one"
        )
    if not experiments:
        if failures:
            raise ToolError("\n\n".join(failures))
        raise ToolError(f"no experiment matched filter {name_filter!r}")
    return Loaded(config, experiments, failures, modules)


async def execute(loaded: Loaded, relay: ProgressRelay, overrides: dict[str, Any]) -> list[Any]:
    """Await the launcher's way in on the engine's loop, for the experiments one after another;
    cancelled, the current run ends `cancelled`."""
    from cobalt_app import aio, launcher

    ended = threading.Event()

    async def launched() -> list[Any]:
        try:
            return await launcher.launch(
                loaded.experiments, loaded.config, reporter=relay, overrides=overrides
            )
        finally:
            ended.set()

    future = asyncio.run_coroutine_threadsafe(launched(), aio.loop_thread().loop)
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:  # the call, the client or the server went away
        future.cancel()  # the run's items stop; it records `cancelled` and writes its file
        with anyio.CancelScope(shield=True):
            finished = await anyio.to_thread.run_sync(ended.wait, FINALISE_TIMEOUT)
            if loaded.config.team_mode:  # the workers would go on: stop them
                await anyio.to_thread.run_sync(cancel_team_runs, relay.run_ids)
            orphans = await anyio.to_thread.run_sync(stop_runner_threads)
        if finished:
            log.warning("cobalt_run cancelled: run(s) %s finalised as cancelled", relay.run_ids)
        else:
            log.error("run(s) %s did not finalise within %ss", relay.run_ids, FINALISE_TIMEOUT)
        if orphans:
            log.warning("orphaned runner threads still in user code: %s", ", ".join(orphans))
        raise


def cancel_team_runs(run_ids: list[str]) -> None:
    """Cancel the team runs a cancelled call followed (finalised as any cancel)."""
    from cobalt_app.runs import lifecycle

    with database():
        for run_id in run_ids:
            lifecycle.cancel(run_id)


class RunnerAbandoned(BaseException):
    """Raised inside a synchronous runner still going after its run ended."""


def stop_runner_threads() -> list[str]:
    """Stop the synchronous runners still going after their run ended (a hanging runner the
    engine timed out); returns the threads that could not be stopped.

    An idle pool thread ends by itself once its pool is shut down (within IDLE_EXIT). A busy
    one then gets `RunnerAbandoned` raised in it, which Python delivers at its next bytecode:
    a runner looping in Python stops; one blocked inside a C call (a socket read, a sleep)
    only when that returns, so it is reported as orphaned.
    """
    started = time.monotonic()
    asked: set[int] = set()
    while busy := [t for t in threading.enumerate() if t.name.startswith(RUNNER_THREAD)]:
        waited = time.monotonic() - started
        if waited >= IDLE_EXIT + RUNNER_GRACE:
            return [t.name for t in busy]
        for thread in busy if waited >= IDLE_EXIT else []:
            if thread.ident is not None and thread.ident not in asked:
                asked.add(thread.ident)
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(thread.ident), ctypes.py_object(RunnerAbandoned)
                )
        time.sleep(0.02)
    return []


def documents(
    runs: list[Any], project: Project, tokens: int, budget: int
) -> tuple[list[str], list[dict[str, Any]]]:
    """Each run's summary and document, within `tokens` together. With several runs, every
    run's failing items come before any run's passing ones: a first layout without passing
    items measures what each run needs; what is left goes to the runs whose failing items did
    not all fit, or else is shared out for the passing items."""
    with database():
        if len(runs) == 1:
            text, doc = run_document(runs[0], project, tokens, budget=budget)
            return [text], [doc]
        share = tokens // len(runs)
        first = [run_document(run, project, share, budget=budget, passing=False) for run in runs]
        needs = [size(*report) for report in first]
        spare = max(0, tokens - sum(needs))
        short = [
            i for i, (_, doc) in enumerate(first) if (doc["omitted"] or {}).get("failingItems")
        ]
        grow = short or list(range(len(runs)))
        reports = [
            run_document(run, project, needs[i] + spare // len(grow), budget=budget)
            if i in grow
            else first[i]
            for i, run in enumerate(runs)
        ]
    return [text for text, _ in reports], [doc for _, doc in reports]


def size(text: str, document: dict[str, Any]) -> int:
    return estimate_tokens(text) + value_tokens(document)


async def cobalt_run_tool(
    project: Project,
    ctx: Context,
    *,
    file: str | None,
    name_filter: str | None,
    concurrency: int | None,
    replay: str | None = None,
    budget: dict[str, Any] | None = None,
) -> CallToolResult:
    relay = ProgressRelay(asyncio.get_running_loop())
    with active_runs.tracking():
        return await run_and_report(
            project,
            ctx,
            relay,
            file=file,
            name_filter=name_filter,
            concurrency=concurrency,
            replay=replay,
            budget=budget,
        )


async def run_and_report(
    project: Project,
    ctx: Context,
    relay: ProgressRelay,
    *,
    file: str | None,
    name_filter: str | None,
    concurrency: int | None,
    replay: str | None = None,
    budget: dict[str, Any] | None = None,
) -> CallToolResult:
    """`budget`: the items' budgets as the run stores them (`maxToolCalls`, ...)."""
    failure: Exception | None = None
    recordings.stand_in_keys(replay)
    async with project.lock:
        loaded = await anyio.to_thread.run_sync(
            lambda: load(project, file=file, name_filter=name_filter)
        )
        relay.expect(loaded.experiments)
        async with anyio.create_task_group() as group:
            group.start_soon(relay.forward, ctx)
            try:
                overrides = {"concurrency": concurrency, "replay": replay, **(budget or {})}
                runs = await execute(loaded, relay, overrides)
            except Exception as exc:  # re-raised outside the task group, unwrapped
                failure = exc
            finally:
                relay.close()
        if failure is not None:
            raise failure
        orphans = await anyio.to_thread.run_sync(stop_runner_threads)
    data: dict[str, Any] = {
        "runs": [],
        "loadErrors": [text[:1_000] for text in loaded.failures[:LOAD_ERRORS_SHOWN]],
        "modules": loaded.modules.to_dict(),
        "orphanedThreads": orphans,
    }
    budget = project.result_tokens(loaded.config)
    tokens = budget - value_tokens(data) - 200
    texts, data["runs"] = await anyio.to_thread.run_sync(
        lambda: documents(runs, project, tokens, budget)
    )
    text = "\n\n".join(texts)
    if loaded.failures:
        text += f"\n\n{len(loaded.failures)} experiment files could not be imported (loadErrors)."
    if loaded.modules.changed_outside:
        text += "\nReloaded, edited outside the project: " + ", ".join(
            loaded.modules.changed_outside
        )
    if orphans:
        text += (
            f"\n{len(orphans)} synchronous runner threads are still in user code after "
            "their items timed out (orphaned; Python cannot stop a thread blocked in a C call)."
        )
    log.info(
        "cobalt_run: %d run(s), %d progress notifications, ~%d tokens",
        len(data["runs"]),
        relay.sent,
        estimate_tokens(text) + value_tokens(data),
    )
    return tool_result([TextContent(type="text", text=text)], data)
