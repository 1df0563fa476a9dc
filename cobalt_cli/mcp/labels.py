"""`cobalt_labels`: people's labels of a run and where they disagree with the judge, paged
and within the token budget."""

from __future__ import annotations

from typing import Any

from mcp.types import CallToolResult

from cobalt_cli.mcp.budget import fit, shortened, value_tokens
from cobalt_cli.mcp.project import Project
from cobalt_cli.mcp.reads import find_run, result, window

LABELS_SHOWN = 100  # labels per page unless `limit` says otherwise (fewer if they do not fit)
DISAGREEMENTS_DESCRIBED = 10  # in the plain-language summary
TEXT_TOKENS = 1_500  # kept for the plain-language lines


def cobalt_labels_tool(
    project: Project,
    *,
    run_id: str,
    evaluator: str | None = None,
    disagreements: bool = False,
    offset: int = 0,
    limit: int = LABELS_SHOWN,
) -> CallToolResult:
    """The run's label counts, then a page of its labels (only those that disagree with the
    judge, with `disagreements`) in item order."""
    from cobalt_app import labels

    tokens = project.result_tokens(project.config())
    run = find_run(run_id)
    if evaluator is not None:
        labels.check_evaluator(run, evaluator)  # a `LabelError`: a tool error saying why
    summary = labels.label_summary(run)
    rows = labels.label_list(run, evaluator=evaluator, disagrees=disagreements)
    page = [row.as_json() for row in rows[offset : offset + limit]]
    head: dict[str, Any] = {
        "runId": run.id,
        "name": run.name,
        "status": run.status,
        "summary": summary,
        "filter": {"evaluator": evaluator, "disagreements": disagreements},
    }
    fitted = fit([], page, tokens - value_tokens(head) - TEXT_TOKENS, shape=shortened)
    data = {**head, "labels": fitted.items, "page": window(len(rows), offset, fitted.kept_rest)}
    return result(describe(run, summary, data, disagreements), data)


def describe(run: Any, summary: dict[str, Any], data: dict[str, Any], only: bool) -> str:
    reviewers = ", ".join(summary["reviewers"]) or "nobody"
    lines = [
        f"Run {run.id} ({run.name}): {summary['labels']} labels on {summary['itemsLabelled']} "
        f"items by {reviewers}; {summary['disagreements']} disagree with the judge"
        + (
            f"; {summary['stale']} stale (given on an output that changed)."
            if summary["stale"]
            else "."
        )
    ]
    shown = data["page"]
    what = "disagreements" if only else "labels"
    if not shown["total"]:
        lines.append(f"No {what}" + (" with this filter." if data["filter"]["evaluator"] else "."))
        return "\n".join(lines)
    span = f"{shown['offset'] + 1}–{shown['offset'] + shown['returned']}"
    line = f"{what.capitalize()} {span if shown['returned'] else 'none'} of {shown['total']} shown"
    if shown["nextOffset"] is not None:
        line += f"; more with cobalt_labels offset={shown['nextOffset']}"
    lines.append(line + ".")
    disagreeing = [label for label in data["labels"] if label["disagrees"]]
    for label in disagreeing[:DISAGREEMENTS_DESCRIBED]:
        judge = "—" if label["judgeScore"] is None else f"{label['judgeScore']:.2f}"
        note = f" — {label['note']}" if label["note"] else ""
        text = (
            f"  #{label['item']} {label['itemKey']} · {label['evaluator']}: "
            f"{label['reviewer']} says {label['verdict']}, the judge {judge} "
            f"{label['judgeVerdict']}{note}"
        )
        lines.append(text if len(text) <= 300 else text[:300] + "…")
    return "\n".join(lines)
