"""`cobalt_judge_disagreements` (where a judge and the reviewers disagree, with the agreement)
and `cobalt_pairwise` (a pairwise judge's win rate of run B over run A), within the budget."""

from __future__ import annotations

from typing import Any

from mcp.types import CallToolResult

from cobalt_cli.mcp.budget import fit, shortened, value_tokens
from cobalt_cli.mcp.project import Project
from cobalt_cli.mcp.reads import find_run, result, window

DISAGREEMENTS_SHOWN = 50
TEXT_TOKENS = 1_500


def judge_disagreements_tool(
    project: Project,
    *,
    judge: str,
    run_id: str | None = None,
    offset: int = 0,
    limit: int = DISAGREEMENTS_SHOWN,
) -> CallToolResult:
    """The judge's agreement with the run's labels and a page of its disagreements."""
    from cobalt_app import judge_loop

    tokens = project.result_tokens(project.config())
    run = find_run(run_id) if run_id else None
    report = judge_loop.judge_report(judge, run.id if run else None)
    rows = report.pop("disagreements")
    fitted = fit(
        [],
        rows[offset : offset + limit],
        tokens - value_tokens(report) - TEXT_TOKENS,
        shape=shortened,
    )
    data = {
        **report,
        "disagreements": fitted.items,
        "page": window(len(rows), offset, fitted.kept_rest),
    }
    return result(_describe(data), data)


def _describe(data: dict[str, Any]) -> str:
    agreement = data["agreement"]
    kappa = (
        f"Cohen's κ {agreement['kappa']:.2f} (95% {agreement['kappa_low']:.2f} to "
        f"{agreement['kappa_high']:.2f})"
        if agreement["kappa"] is not None
        else agreement["state"]
    )
    page = data["page"]
    lines = [
        f"Judge {data['judge']} on run {data['run']} ({data['experiment']}): "
        f"{data['labels']} current labels, {kappa}; {page['total']} disagreements."
    ]
    for row in data["disagreements"]:
        note = f" — {row['note']}" if row["note"] else ""
        lines.append(
            f"  #{row['item']} {row['itemKey']}: judge {row['judgeVerdict']} "
            f"({row['judgeReason']}), {row['reviewer']} says {row['label']}{note}"
        )
    if page["nextOffset"] is not None:
        lines.append(f"More with cobalt_judge_disagreements offset={page['nextOffset']}.")
    lines.append(
        "To align the judge: edit its prompt in the experiment file, re-judge the labelled "
        "items (`cobalt rejudge RUN --evaluator JUDGE --labelled`), call this tool on the new run."
    )
    return "\n".join(lines)


def pairwise_tool(project: Project, *, run_a: str, run_b: str, judge: str) -> CallToolResult:
    """Ask the pairwise judge about every item both runs scored: B's win rate over A."""
    from cobalt_app.pairwise_compare import pairwise_compare

    a, b = find_run(run_a), find_run(run_b)
    found = pairwise_compare(a, b, judge, project.config(), find_in_file=True)
    tokens = project.result_tokens(project.config())
    items = found.pop("items")
    fitted = fit([], items, tokens - value_tokens(found) - TEXT_TOKENS, shape=shortened)
    data = {**found, "items": fitted.items, "page": window(len(items), 0, fitted.kept_rest)}
    if found["winRate"] is None:
        text = f"Pairwise judge {judge}: no pair could be judged ({found['errors']} errors)."
    else:
        text = (
            f"Pairwise judge {judge}: run {b.id} (B) against {a.id} (A) on {found['n']} items: "
            f"B wins {found['wins']}, ties {found['tied']}, A wins {found['losses']}; win rate "
            f"of B {found['winRate']:.2f} (95% {found['low']:.2f} to {found['high']:.2f}; "
            f"{found['ties']})."
        )
    if found["errors"]:
        text += f" {found['errors']} pairs not judged: {found['errorMessages'][0]}"
    return result(text, data)
