"""The MCP server of one project: its tools, resources and prompts, served on stdio.

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
from typing import Annotated, BinaryIO

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.tools.base import Tool
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, CallToolResult, ToolAnnotations
from pydantic import ConfigDict, Field

import cobalt
from cobalt.config import Config, load_config
from cobalt_cli.mcp import resources, schemas
from cobalt_cli.mcp.authoring import cobalt_generate_tool
from cobalt_cli.mcp.errors import database, resource_errors, tool_errors
from cobalt_cli.mcp.project import Project
from cobalt_cli.mcp.reads import COMPARE_SHOWN, cobalt_compare_tool, cobalt_results_tool
from cobalt_cli.mcp.reports import STATUS_FILTERS, ItemFilter
from cobalt_cli.mcp.running import (
    FINALISE_TIMEOUT,
    RUNNER_THREAD,
    active_runs,
    cobalt_run_tool,
)

log = logging.getLogger("cobalt.mcp")

INSTRUCTIONS = """\
Cobalt runs experiments on an AI agent: a dataset, a runner that calls the agent, evaluators
that score each output. Use cobalt_run to run experiments (all, or one file), read the failing
items and the judges' reasons, change the agent, run again, then cobalt_compare the two runs.
Results are kept within a token budget: when a result says items were left out, page through
them with cobalt_results (runId, status="failing", offset). cobalt_generate writes a new
experiment file for an agent. Paths are relative to the project."""

StatusFilter = Annotated[
    str | None,
    Field(
        description="Only items that are: failing (error, timeout, evaluation error or a score "
        "below 0.5), passing, or of this item status: ok, error, timeout, cancelled, pending.",
        json_schema_extra={"enum": [*STATUS_FILTERS, None]},
    ),
]


def strict(tool: Tool) -> Tool:
    """Refuse arguments the tool does not declare (a tool error naming them), and say so in
    the input schema (`additionalProperties: false`)."""
    base = tool.fn_metadata.arg_model
    model = type(base.__name__, (base,), {"model_config": ConfigDict(extra="forbid")})
    tool.fn_metadata.arg_model = model
    tool.parameters = model.model_json_schema(by_alias=True)
    return tool


def tools(project: Project) -> list[Tool]:
    async def cobalt_run(
        ctx: Context,
        file: Annotated[
            str | None,
            Field(description="Experiment file inside the project. Default: every experiment."),
        ] = None,
        filter: Annotated[
            str | None, Field(description="Only experiments whose name matches (substring/glob).")
        ] = None,
        concurrency: Annotated[
            int | None, Field(ge=1, le=256, description="Items in parallel (overrides config).")
        ] = None,
    ) -> Annotated[CallToolResult, schemas.RunOutput]:
        with tool_errors("cobalt_run"):
            return await cobalt_run_tool(
                project, ctx, file=file, name_filter=filter, concurrency=concurrency
            )

    def cobalt_results(
        runId: Annotated[
            str | None, Field(description="A run id (or a unique prefix) to get its results.")
        ] = None,
        limit: Annotated[
            int | None,
            Field(
                ge=1,
                le=1000,
                description="Without runId: runs to list (default 10). With runId: items per "
                "page (default: as many as fit in the token budget).",
            ),
        ] = None,
        experiment: Annotated[
            str | None, Field(description="List only runs whose experiment name contains this.")
        ] = None,
        status: StatusFilter = None,
        evaluator: Annotated[
            str | None,
            Field(
                description="Only items this evaluator scored; status failing/passing and "
                "maxScore then look at its verdict only."
            ),
        ] = None,
        maxScore: Annotated[
            float | None, Field(description="Only items with a score at or below this.")
        ] = None,
        offset: Annotated[
            int | None, Field(ge=0, description="Skip this many matching items (paging).")
        ] = None,
    ) -> Annotated[CallToolResult, schemas.ResultsOutput]:
        with tool_errors("cobalt_results"), database():
            return cobalt_results_tool(
                project,
                run_id=runId,
                limit=limit,
                experiment=experiment,
                where=ItemFilter(status=status, evaluator=evaluator, max_score=maxScore),
                offset=offset,
            )

    def cobalt_compare(
        runA: Annotated[str, Field(description="Baseline run id.")],
        runB: Annotated[str, Field(description="Candidate run id.")],
        offset: Annotated[
            int, Field(ge=0, description="Skip this many regressions and improvements.")
        ] = 0,
        limit: Annotated[
            int, Field(ge=1, le=200, description="Regressions and improvements to return.")
        ] = COMPARE_SHOWN,
    ) -> Annotated[CallToolResult, schemas.CompareOutput]:
        with tool_errors("cobalt_compare"), database():
            return cobalt_compare_tool(project, run_a=runA, run_b=runB, offset=offset, limit=limit)

    def cobalt_generate(
        agentFile: Annotated[
            str, Field(description="The agent's Python source file, inside the project.")
        ],
        outputFile: Annotated[
            str | None,
            Field(
                description="Where to write (*.cobalt.py). Default experiments/<agent>.cobalt.py"
            ),
        ] = None,
        datasetSize: Annotated[
            int, Field(ge=1, le=50, description="Dataset items to generate.")
        ] = 10,
        context: Annotated[
            str | None,
            Field(description="What the agent does, expected behaviour, edge cases to cover."),
        ] = None,
        overwrite: Annotated[bool, Field(description="Replace an existing file.")] = False,
        runOneItem: Annotated[
            bool, Field(description="Also run the first item (not recorded) to check it works.")
        ] = False,
    ) -> Annotated[CallToolResult, schemas.GenerateOutput]:
        with tool_errors("cobalt_generate"):
            return cobalt_generate_tool(
                project,
                agent_file=agentFile,
                output_file=outputFile,
                dataset_size=datasetSize,
                context=context,
                overwrite=overwrite,
                run_one_item=runOneItem,
            )

    writes = ToolAnnotations(read_only_hint=False, destructive_hint=False)
    reads = ToolAnnotations(read_only_hint=True)
    return [
        strict(Tool.from_function(function, description=description, annotations=annotations))
        for function, annotations, description in (
            (
                cobalt_run,
                writes,
                "Run cobalt experiments and return, within the token budget, each run's "
                "summary, every failing item with its reasons, then the other items "
                "(results-file format); what did not fit is named with the cobalt_results call "
                "that fetches it. Sends a progress notification per finished item. Cancelling "
                "the call cancels the run.",
            ),
            (
                cobalt_results,
                reads,
                "List past experiment runs (newest first), or get one run's results; filter "
                "its items (status, evaluator, maxScore) and page through them (offset, limit).",
            ),
            (
                cobalt_compare,
                reads,
                "Compare two runs: per-evaluator deltas and the items that regressed or "
                "improved (matched by item key) with both outputs and the judges' reasons; "
                "page with offset and limit.",
            ),
            (
                cobalt_generate,
                writes,
                "Read an agent's source, ask the configured LLM for a dataset (normal, edge "
                "and adversarial cases) and evaluators suited to it, and write a runnable "
                "experiment file (default experiments/<agent>.cobalt.py) that imports the "
                "agent. Verifies the file imports. Refuses to overwrite an existing file unless "
                "overwrite is true.",
            ),
        )
    ]


def build_server(config: Config) -> MCPServer:
    """The MCP server of one project: tools, resources and prompts."""
    project = Project(config)
    server: MCPServer = MCPServer(
        "cobalt",
        version=cobalt.__version__,
        instructions=INSTRUCTIONS,
        log_level="WARNING",
        tools=tools(project),
    )

    @server.resource(
        "cobalt://config",
        name="config",
        description="The project's Cobalt configuration (API keys redacted).",
        mime_type="application/json",
    )
    def config_json() -> str:
        with resource_errors("cobalt://config"):
            return json.dumps(resources.config_resource(project), indent=1)

    @server.resource(
        "cobalt://experiments",
        name="experiments",
        description="The experiment files of the project.",
        mime_type="application/json",
    )
    def experiments_json() -> str:
        with resource_errors("cobalt://experiments"):
            return json.dumps(resources.experiments_resource(project), indent=1)

    @server.resource(
        "cobalt://latest-results",
        name="latest-results",
        description="The newest finished run of each experiment, with scores per evaluator.",
        mime_type="application/json",
    )
    def latest_results_json() -> str:
        with resource_errors("cobalt://latest-results"), database():
            return json.dumps(resources.latest_results_resource(project), indent=1, default=str)

    @server.prompt(
        name="improve-agent",
        description="Find an experiment's failing items and improve the agent until it passes.",
    )
    def improve_agent(experiment: str, threshold: str = "0.8") -> str:
        try:
            value = float(threshold)
        except ValueError:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"threshold must be a number from 0 to 1 (got {threshold!r})",
            ) from None
        return resources.IMPROVE_AGENT.format(experiment=experiment, threshold=value)

    @server.prompt(
        name="generate-tests",
        description="Write a Cobalt experiment for an agent file with cobalt_generate.",
    )
    def generate_tests(agentFile: str) -> str:
        return resources.GENERATE_TESTS.format(agent_file=agentFile)

    @server.prompt(
        name="regression-check",
        description="Run the experiments, compare with the previous runs, explain regressions.",
    )
    def regression_check(experiment: str | None = None) -> str:
        scope = f" for {experiment!r} (cobalt_run with filter={experiment!r})" if experiment else ""
        return resources.REGRESSION_CHECK.format(scope=scope)

    return server


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
    lowlevel = server._lowlevel_server  # noqa: SLF001 - the SDK's stdio runner takes no streams
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
                await lowlevel.run(read, write, lowlevel.create_initialization_options())
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
    """Start Django for the project found from the current folder and serve MCP on stdio."""
    from cobalt_project import bootstrap

    config = load_config(require_project=True)
    wire = claim_stdout()  # nothing but protocol may reach stdout, for the server's whole life
    bootstrap.setup(config)
    level = os.environ.get("COBALT_LOG_LEVEL", "INFO").upper()
    log.setLevel(level if level in logging.getLevelNamesMapping() else "INFO")
    os.chdir(config.project_dir)  # experiment files open datasets relative to the project
    server = build_server(config)
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
