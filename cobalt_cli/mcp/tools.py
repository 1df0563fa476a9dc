"""The tools' declarations: typed arguments (unknown ones refused), output schemas, and
whether each works on this server's project or forwards to a workspace's project."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

import anyio
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import ConfigDict, Field

from cobalt_cli.mcp.authoring import cobalt_generate_tool
from cobalt_cli.mcp.calibration import DISAGREEMENTS_SHOWN, judge_disagreements_tool, pairwise_tool
from cobalt_cli.mcp.errors import database, tool_errors
from cobalt_cli.mcp.labels import LABELS_SHOWN, cobalt_labels_tool
from cobalt_cli.mcp.project import Project
from cobalt_cli.mcp.reads import COMPARE_SHOWN, cobalt_compare_tool, cobalt_results_tool
from cobalt_cli.mcp.reports import ItemFilter, StatusName
from cobalt_cli.mcp.running import cobalt_run_tool
from cobalt_cli.mcp.schemas import (
    CompareOutput,
    DisagreementsOutput,
    GenerateOutput,
    LabelsOutput,
    PairwiseOutput,
    ResultsOutput,
    RunOutput,
    SweepOutput,
)
from cobalt_cli.mcp.sdk import Context, Tool, ToolError
from cobalt_cli.mcp.sweeps import cobalt_sweep_tool
from cobalt_cli.mcp.workspace import Workspace

StatusFilter = Annotated[
    StatusName | None,
    Field(
        description="Only items that are: failing (error, timeout, evaluation error or a score "
        "below its evaluator's pass mark, pass_threshold: 0.5 unless set), passing, or of this "
        "item status."
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


ProjectArgument = Annotated[
    str | None,
    Field(
        description="In a workspace (several projects below the server's folder): the project's "
        "folder, relative to the workspace root. Needed only when there are several."
    ),
]


def local(target: Project | Workspace, project: str | None) -> Project:
    """The project a local call works on: this server serves one, at `.`."""
    assert isinstance(target, Project)
    if project not in (None, "", "."):
        raise ToolError(f"this server serves one project ({target.dir}); leave project out")
    return target


# By the protocol's names: mcp 1.x's model has only those (2.x accepts both).
WRITES = ToolAnnotations.model_validate({"readOnlyHint": False, "destructiveHint": False})
READS = ToolAnnotations.model_validate({"readOnlyHint": True})


def tools(target: Project | Workspace) -> list[Tool]:
    """The tools, working on one project, or forwarding to a workspace's projects."""
    return [
        run_tool(target),
        results_tool(target),
        compare_tool(target),
        labels_tool(target),
        disagreements_tool(target),
        pairwise_compare_tool(target),
        generate_tool(target),
        sweep_tool(target),
    ]


def declare(function: Callable[..., Any], annotations: ToolAnnotations, description: str) -> Tool:
    return strict(Tool.from_function(function, description=description, annotations=annotations))


async def answer(
    target: Project | Workspace,
    ctx: Context,
    project: str | None,
    tool: str,
    arguments: dict[str, Any],
    call: Callable[[Project], Any],
    *,
    on_thread: bool = True,
    orm: bool = True,
) -> CallToolResult:
    """One tool call: forwarded with its `arguments` to a workspace's project, or made here:
    `call(project)` awaited (`on_thread=False`), or on a worker thread (with fresh database
    connections when it uses the ORM). Its failures become tool errors (`tool_errors`)."""
    if isinstance(target, Workspace):
        with tool_errors(tool):
            return await target.call(ctx, project, tool, arguments)
    if not on_thread:
        with tool_errors(tool):
            return await call(local(target, project))

    def work() -> CallToolResult:
        with tool_errors(tool), database() if orm else contextlib.nullcontext():
            return call(local(target, project))

    return await anyio.to_thread.run_sync(work)


def run_tool(target: Project | Workspace) -> Tool:
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
        replay: Annotated[
            Literal["record", "replay", "new-only"] | None,
            Field(
                description="The agent's model calls and HTTP requests: `record` them, "
                "`replay` them from the "
                "recordings (offline; a changed request fails its item), or `new-only` "
                "(replay what is recorded, record the rest). Default: live."
            ),
        ] = None,
        maxLlmCalls: Annotated[
            int | None, Field(ge=1, description="Per item: stop the agent past N model calls.")
        ] = None,
        maxToolCalls: Annotated[
            int | None, Field(ge=1, description="Per item: stop the agent past N tool calls.")
        ] = None,
        maxTokens: Annotated[
            int | None, Field(ge=1, description="Per item: stop the agent once N tokens are used.")
        ] = None,
        maxCost: Annotated[
            float | None, Field(gt=0, description="Per item: stop the agent once $X is spent.")
        ] = None,
        project: ProjectArgument = None,
    ) -> Annotated[CallToolResult, RunOutput]:
        arguments = {"file": file, "filter": filter, "concurrency": concurrency}
        if replay is not None:
            arguments["replay"] = replay
        budget = {
            "maxLlmCalls": maxLlmCalls,
            "maxToolCalls": maxToolCalls,
            "maxTokens": maxTokens,
            "maxCost": maxCost,
        }
        budget = {k: v for k, v in budget.items() if v is not None}
        arguments.update(budget)

        def run(here: Project) -> Awaitable[CallToolResult]:
            return cobalt_run_tool(
                here,
                ctx,
                file=file,
                name_filter=filter,
                concurrency=concurrency,
                replay=replay,
                budget=budget,
            )

        return await answer(target, ctx, project, "cobalt_run", arguments, run, on_thread=False)

    return declare(
        cobalt_run,
        WRITES,
        "Run cobalt experiments and return, within the token budget, each run's "
        "summary, every failing item with its reasons, then the other items "
        "(results-file format); what did not fit is named with the cobalt_results call "
        "that fetches it. Sends a progress notification per finished item. Cancelling "
        "the call cancels the run.",
    )


def results_tool(target: Project | Workspace) -> Tool:
    async def cobalt_results(
        ctx: Context,
        runId: Annotated[
            str | None, Field(description="A run id (or a unique prefix) to get its results.")
        ] = None,
        limit: Annotated[
            int | None,
            Field(
                ge=1,
                le=1000,
                description="Without runId: runs to list (default 10). With runId: items per "
                "page (default 50; fewer when they do not fit in the token budget).",
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
        project: ProjectArgument = None,
    ) -> Annotated[CallToolResult, ResultsOutput]:
        arguments = {
            "runId": runId,
            "limit": limit,
            "experiment": experiment,
            "status": status,
            "evaluator": evaluator,
            "maxScore": maxScore,
            "offset": offset,
        }

        def read(here: Project) -> CallToolResult:
            return cobalt_results_tool(
                here,
                run_id=runId,
                limit=limit,
                experiment=experiment,
                where=ItemFilter(status=status, evaluator=evaluator, max_score=maxScore),
                offset=offset,
            )

        return await answer(target, ctx, project, "cobalt_results", arguments, read)

    return declare(
        cobalt_results,
        READS,
        "List past experiment runs (newest first), or get one run's results; filter "
        "its items (status, evaluator, maxScore) and page through them (offset, limit).",
    )


def compare_tool(target: Project | Workspace) -> Tool:
    async def cobalt_compare(
        ctx: Context,
        runA: Annotated[str, Field(description="Baseline run id.")],
        runB: Annotated[str, Field(description="Candidate run id.")],
        offset: Annotated[
            int, Field(ge=0, description="Skip this many regressions and improvements.")
        ] = 0,
        limit: Annotated[
            int, Field(ge=1, le=200, description="Regressions and improvements to return.")
        ] = COMPARE_SHOWN,
        project: ProjectArgument = None,
    ) -> Annotated[CallToolResult, CompareOutput]:
        arguments = {"runA": runA, "runB": runB, "offset": offset, "limit": limit}

        def read(here: Project) -> CallToolResult:
            return cobalt_compare_tool(here, run_a=runA, run_b=runB, offset=offset, limit=limit)

        return await answer(target, ctx, project, "cobalt_compare", arguments, read)

    return declare(
        cobalt_compare,
        READS,
        "Compare two runs: per-evaluator deltas and the items that regressed or "
        "improved (matched by item key) with both outputs and the judges' reasons; "
        "page with offset and limit.",
    )


def labels_tool(target: Project | Workspace) -> Tool:
    async def cobalt_labels(
        ctx: Context,
        runId: Annotated[str, Field(description="A run id (or a unique prefix).")],
        evaluator: Annotated[
            str | None, Field(description="Only the labels of this evaluator.")
        ] = None,
        disagreements: Annotated[
            bool, Field(description="Only the current labels that disagree with the judge.")
        ] = False,
        offset: Annotated[int, Field(ge=0, description="Skip this many labels (paging).")] = 0,
        limit: Annotated[
            int, Field(ge=1, le=500, description="Labels to return (fewer if they do not fit).")
        ] = LABELS_SHOWN,
        project: ProjectArgument = None,
    ) -> Annotated[CallToolResult, LabelsOutput]:
        arguments = {
            "runId": runId,
            "evaluator": evaluator,
            "disagreements": disagreements,
            "offset": offset,
            "limit": limit,
        }

        def read(here: Project) -> CallToolResult:
            return cobalt_labels_tool(
                here,
                run_id=runId,
                evaluator=evaluator,
                disagreements=disagreements,
                offset=offset,
                limit=limit,
            )

        return await answer(target, ctx, project, "cobalt_labels", arguments, read)

    return declare(
        cobalt_labels,
        READS,
        "People's labels of a run's evaluations (pass/fail, corrected score and "
        "expected output, note, by reviewer) in item order, each with the judge's "
        "score and whether they disagree; the run's label counts; page with offset "
        "and limit, or ask only for the disagreements.",
    )


def generate_tool(target: Project | Workspace) -> Tool:
    async def cobalt_generate(
        ctx: Context,
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
        project: ProjectArgument = None,
    ) -> Annotated[CallToolResult, GenerateOutput]:
        arguments = {
            "agentFile": agentFile,
            "outputFile": outputFile,
            "datasetSize": datasetSize,
            "context": context,
            "overwrite": overwrite,
            "runOneItem": runOneItem,
        }

        def generate(here: Project) -> CallToolResult:
            return cobalt_generate_tool(
                here,
                agent_file=agentFile,
                output_file=outputFile,
                dataset_size=datasetSize,
                context=context,
                overwrite=overwrite,
                run_one_item=runOneItem,
            )

        return await answer(target, ctx, project, "cobalt_generate", arguments, generate, orm=False)

    return declare(
        cobalt_generate,
        WRITES,
        "Read an agent's source, ask the configured LLM for a dataset (normal, edge "
        "and adversarial cases) and evaluators suited to it, and write a runnable "
        "experiment file (default experiments/<agent>.cobalt.py) that imports the "
        "agent. Verifies the file imports. Refuses to overwrite an existing file unless "
        "overwrite is true.",
    )


def disagreements_tool(target: Project | Workspace) -> Tool:
    async def cobalt_judge_disagreements(
        ctx: Context,
        judge: Annotated[str, Field(description="The judge (evaluator) name.")],
        runId: Annotated[
            str | None,
            Field(description="A run id (or prefix). Default: the latest run with the judge."),
        ] = None,
        offset: Annotated[int, Field(ge=0, description="Skip this many disagreements.")] = 0,
        limit: Annotated[
            int, Field(ge=1, le=500, description="Disagreements to return (fewer if too long).")
        ] = DISAGREEMENTS_SHOWN,
        project: ProjectArgument = None,
    ) -> Annotated[CallToolResult, DisagreementsOutput]:
        arguments = {"judge": judge, "runId": runId, "offset": offset, "limit": limit}

        def read(here: Project) -> CallToolResult:
            return judge_disagreements_tool(
                here, judge=judge, run_id=runId, offset=offset, limit=limit
            )

        return await answer(target, ctx, project, "cobalt_judge_disagreements", arguments, read)

    return declare(
        cobalt_judge_disagreements,
        READS,
        "Where a judge and the human reviewers disagree: each item's input, output, the "
        "judge's score and reason, the reviewer's label and note; with the agreement "
        "(Cohen's κ and its interval, TPR/TNR lower bounds). Edit the judge prompt, re-judge "
        "the labelled items, call again to see κ move.",
    )


def pairwise_compare_tool(target: Project | Workspace) -> Tool:
    async def cobalt_pairwise(
        ctx: Context,
        runA: Annotated[str, Field(description="Baseline run id.")],
        runB: Annotated[str, Field(description="Candidate run id.")],
        judge: Annotated[str, Field(description='A pairwise judge (type="pairwise").')],
        project: ProjectArgument = None,
    ) -> Annotated[CallToolResult, PairwiseOutput]:
        arguments = {"runA": runA, "runB": runB, "judge": judge}

        def read(here: Project) -> CallToolResult:
            return pairwise_tool(here, run_a=runA, run_b=runB, judge=judge)

        return await answer(target, ctx, project, "cobalt_pairwise", arguments, read)

    return declare(
        cobalt_pairwise,
        WRITES,
        "Ask a pairwise judge which output is better for each item both runs scored, in "
        "both orders (a tie when they disagree): run B's win rate over run A, ties half, "
        "with a 95% interval. Calls the judge's model (cached).",
    )


def sweep_tool(target: Project | Workspace) -> Tool:
    async def cobalt_sweep(
        ctx: Context,
        sweepId: Annotated[
            str | None, Field(description="A sweep id; default: the latest sweep.")
        ] = None,
        experiment: Annotated[
            str | None, Field(description="Without sweepId: the latest sweep of this experiment.")
        ] = None,
        project: ProjectArgument = None,
    ) -> Annotated[CallToolResult, SweepOutput]:
        arguments = {"sweepId": sweepId, "experiment": experiment}

        def read(here: Project) -> CallToolResult:
            return cobalt_sweep_tool(here, sweep_id=sweepId, experiment=experiment)

        return await answer(target, ctx, project, "cobalt_sweep", arguments, read)

    return declare(
        cobalt_sweep,
        READS,
        "Which variant of a sweep (an experiment run once per model/prompt/parameter variant "
        "over the same items) is best and why: the ranking by mean score, each variant's "
        "paired test against the best corrected with Holm (which differences are real), pass "
        "rates with intervals, cost, latency, errors and the Pareto front.",
    )
