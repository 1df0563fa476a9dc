"""The MCP server of one project, or of a workspace: resources, prompts, and stdio.

stdout belongs to the protocol. From the start, file descriptor 1 points at stderr and
`sys.stdout` is `sys.stderr`, for the server's whole life: whatever user code prints (a
buffered `print()`, a C library, a subprocess) goes to stderr, and the protocol writes to a
private duplicate of the original stdout. SIGTERM and SIGINT cancel what is going on (a run
is finalised as `cancelled`) and then stop the server, as a closed stdin does.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import anyio
from mcp.server.stdio import stdio_server
from mcp.types import INVALID_PARAMS

from cobalt.config import NoProjectError, load_config
from cobalt.version import __version__
from cobalt_cli.mcp.errors import database, resource_errors
from cobalt_cli.mcp.project import Project
from cobalt_cli.mcp.resources import (
    GENERATE_TESTS,
    IMPROVE_AGENT,
    REGRESSION_CHECK,
    config_resource,
    experiments_resource,
    latest_results_resource,
)
from cobalt_cli.mcp.running import FINALISE_TIMEOUT, RUNNER_THREAD, active_runs
from cobalt_cli.mcp.sdk import MCPServer, lowlevel, new_server, protocol_error
from cobalt_cli.mcp.tools import tools
from cobalt_cli.mcp.workspace import Workspace, find_projects

log = logging.getLogger("cobalt.mcp")

INSTRUCTIONS = """\
Cobalt runs experiments on an AI agent: a dataset, a runner that calls the agent, evaluators
that score each output. Use cobalt_run to run experiments (all, or one file), read the failing
items and the judges' reasons, change the agent, run again, then cobalt_compare the two runs.
Results are kept within a token budget: when a result says items were left out, page through
them with cobalt_results (runId, status="failing", offset). cobalt_generate writes a new
experiment file for an agent. cobalt_labels reads what people said about a run's items (their
labels) and where they disagree with the judge. Paths are relative to the project."""


def build_server(target: Project | Workspace) -> MCPServer:
    """The MCP server of one project, or of a workspace: tools, resources and prompts."""
    server = new_server(
        "cobalt",
        version=__version__,
        instructions=INSTRUCTIONS,
        log_level="WARNING",
        tools=tools(target),
        lifespan=target.lifespan if isinstance(target, Workspace) else None,
    )
    add_resources(server, target)
    add_prompts(server)
    return server


def add_resources(server: MCPServer, target: Project | Workspace) -> None:
    """`cobalt://config`, `cobalt://experiments` and `cobalt://latest-results`."""
    per_project = " (in a workspace: by project)" if isinstance(target, Workspace) else ""

    async def read(uri: str, local_read: Callable[[Project], dict[str, Any]]) -> str:
        if isinstance(target, Workspace):
            return await target.resource(uri)

        def local_json() -> str:
            with resource_errors(uri), database():
                return json.dumps(local_read(target), indent=1, default=str)

        return await anyio.to_thread.run_sync(local_json)

    @server.resource(
        "cobalt://config",
        name="config",
        description="The project's Cobalt configuration (API keys redacted)" + per_project + ".",
        mime_type="application/json",
    )
    async def config_json() -> str:
        return await read("cobalt://config", config_resource)

    @server.resource(
        "cobalt://experiments",
        name="experiments",
        description="The experiment files of the project" + per_project + ".",
        mime_type="application/json",
    )
    async def experiments_json() -> str:
        return await read("cobalt://experiments", experiments_resource)

    @server.resource(
        "cobalt://latest-results",
        name="latest-results",
        description="The newest finished run of each experiment, with scores per evaluator"
        + per_project
        + ".",
        mime_type="application/json",
    )
    async def latest_results_json() -> str:
        return await read("cobalt://latest-results", latest_results_resource)


def add_prompts(server: MCPServer) -> None:
    """`improve-agent`, `generate-tests` and `regression-check`."""

    @server.prompt(
        name="improve-agent",
        description="Find an experiment's failing items and improve the agent until it passes.",
    )
    def improve_agent(experiment: str, threshold: str = "0.8") -> str:
        try:
            value = float(threshold)
        except ValueError:
            raise protocol_error(
                INVALID_PARAMS, f"threshold must be a number from 0 to 1 (got {threshold!r})"
            ) from None
        return IMPROVE_AGENT.format(experiment=experiment, threshold=value)

    @server.prompt(
        name="generate-tests",
        description="Write a Cobalt experiment for an agent file with cobalt_generate.",
    )
    def generate_tests(agentFile: str) -> str:
        return GENERATE_TESTS.format(agent_file=agentFile)

    @server.prompt(
        name="regression-check",
        description="Run the experiments, compare with the previous runs, explain regressions.",
    )
    def regression_check(experiment: str | None = None) -> str:
        scope = f" for {experiment!r} (cobalt_run with filter={experiment!r})" if experiment else ""
        return REGRESSION_CHECK.format(scope=scope)


class Wire(io.TextIOBase):
    """The protocol's stdout. Once the client has gone (a broken pipe), what is still written
    goes to the null device: the server then finishes as it does when stdin closes."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.text = io.TextIOWrapper(raw, encoding="utf-8")

    def write(self, text: str) -> int:
        try:
            return self.text.write(text)
        except BrokenPipeError:
            self.client_gone()
            return len(text)

    def flush(self) -> None:
        try:
            self.text.flush()
        except BrokenPipeError:
            self.client_gone()

    def client_gone(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.raw.fileno())
        os.close(devnull)
        log.warning("the client closed the protocol's stdout")


def claim_stdout() -> Wire:
    """The protocol's own stdout; from now on fd 1 and `sys.stdout` write to stderr."""
    sys.stdout.flush()
    wire = Wire(os.fdopen(os.dup(1), "wb"))
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return wire


async def serve_stdio(server: MCPServer, wire: Wire) -> None:
    """Serve until stdin closes, or a signal stops the server (which then exits here)."""
    # The SDK's own in-memory client drives the low-level server the same way.
    base = lowlevel(server)
    stdout = anyio.wrap_file(wire)
    watcher = anyio.CancelScope(shield=True)  # a second signal must not kill the clean-up

    async def stop_on_signals(serving: anyio.CancelScope) -> None:
        with watcher, anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                log.warning("%s: stopping; runs in progress are cancelled and finalised", name)
                serving.cancel()
                # stdin may still be open, and its reader thread cannot be interrupted: leave
                # once the runs are finalised rather than wait for the client to close it.
                with anyio.move_on_after(FINALISE_TIMEOUT):
                    await active_runs.idle()
                finish(128 + signum)

    async with anyio.create_task_group() as group:
        group.start_soon(stop_on_signals, group.cancel_scope)
        try:
            async with stdio_server(stdout=stdout) as (read, write):
                await base.run(read, write, base.create_initialization_options())
        finally:
            watcher.cancel()


def finish(status: int) -> None:
    """Flush what was written and leave, without waiting for runner threads stuck in user
    code (Python would join them at exit)."""
    log.info("cobalt mcp stopped")
    stuck = [t.name for t in threading.enumerate() if t.name.startswith(RUNNER_THREAD)]
    if stuck:
        log.warning("leaving runner threads still in user code: %s", ", ".join(stuck))
    sys.stderr.flush()
    if status or stuck:
        os._exit(status)


def serve() -> None:
    """Serve MCP on stdio for the project found from the current folder (Django started for
    it), or, in a folder with projects below it and none above, for all of them."""
    try:
        config = load_config(require_project=True)
    except NoProjectError:
        root = Path.cwd().resolve()
        projects = find_projects(root)
        if not projects:
            raise
        serve_workspace(root, projects)
        return
    from cobalt_project import bootstrap

    wire = claim_stdout()  # nothing but protocol may reach stdout, for the server's whole life
    bootstrap.setup(config)
    level = os.environ.get("COBALT_LOG_LEVEL", "INFO").upper()
    log.setLevel(level if level in logging.getLevelNamesMapping() else "INFO")
    os.chdir(config.project_dir)  # experiment files open datasets relative to the project
    server = build_server(Project(config))
    # The SDK adds a handler to the root logger; Cobalt's loggers already write to stderr.
    logging.getLogger("cobalt").propagate = False
    log.info(
        "cobalt mcp serving %s (%s mode, pid %d)",
        config.project_dir,
        config.team_mode and "team" or "embedded",
        os.getpid(),
    )
    anyio.run(serve_stdio, server, wire)
    finish(0)


def serve_workspace(root: Path, projects: dict[str, Path]) -> None:
    """Workspace mode: each project is served by its own `cobalt mcp` (see `workspace`)."""
    wire = claim_stdout()
    from cobalt_app.log_redaction import redacting

    handler = redacting(logging.StreamHandler(sys.stderr))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    cobalt_log = logging.getLogger("cobalt")
    cobalt_log.addHandler(handler)
    cobalt_log.setLevel(os.environ.get("COBALT_LOG_LEVEL", "INFO").upper())
    cobalt_log.propagate = False
    server = build_server(Workspace(root, projects))
    log.info(
        "cobalt mcp serving the workspace %s: %s (pid %d)",
        root,
        ", ".join(projects),
        os.getpid(),
    )
    anyio.run(serve_stdio, server, wire)
    finish(0)
