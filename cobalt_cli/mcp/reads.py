"""`cobalt_results` and `cobalt_compare`: reads of past runs, paged and within budget."""

from __future__ import annotations

from typing import Any

from mcp.types import CallToolResult, TextContent

from cobalt_cli.mcp.budget import fit, shortened, value_tokens
from cobalt_cli.mcp.project import Project
from cobalt_cli.mcp.reports import ItemFilter, item_page, run_document, run_overview
from cobalt_cli.mcp.sdk import ToolError, tool_result

SHORTEST_PREFIX = 4  # characters of a run id that `run_get` looks up as a prefix
COMPARE_SHOWN = 10  # regressions and improvements per page
RUNS_LISTED = 10


def result(text: str, data: dict[str, Any]) -> CallToolResult:
    """A short plain-language summary, and the data once, as structured content."""
    return tool_result([TextContent(type="text", text=text)], data)


def find_run(run_id: str) -> Any:
    """A run by id or unambiguous prefix; a too-short prefix is said to be one."""
    from cobalt_app.liveness import settled
    from cobalt_app.selectors import RunNotFound, run_get

    wanted = (run_id or "").strip()
    try:
        return settled(run_get(wanted))
    except RunNotFound:
        if len(wanted) < SHORTEST_PREFIX:
            raise RunNotFound(
                f"no run has the id {wanted!r}, and a prefix needs at least {SHORTEST_PREFIX} "
                "characters to be looked up; cobalt_results lists runs"
            ) from None
        raise


def cobalt_results_tool(
    project: Project,
    *,
    run_id: str | None,
    limit: int | None,
    experiment: str | None,
    where: ItemFilter | None = None,
    offset: int | None = None,
) -> CallToolResult:
    """Recent runs; one run's results; or a page of one run's items matching `where`."""
    from cobalt_app.liveness import settle
    from cobalt_app.selectors import run_list

    tokens = project.result_tokens(project.config())
    if run_id:
        run = find_run(run_id)
        where = where or ItemFilter()
        if where == ItemFilter() and offset is None and limit is None:
            return result(*run_document(run, project, tokens))
        if where.evaluator is not None and where.evaluator not in run.evaluator_names:
            known = ", ".join(run.evaluator_names) or "none"
            raise ToolError(f"run {run.id} has no evaluator {where.evaluator!r} (it has: {known})")
        return result(
            *item_page(run, project, tokens, where=where, offset=offset or 0, limit=limit)
        )
    if where not in (None, ItemFilter()) or offset is not None:
        raise ToolError("status, evaluator, maxScore and offset page a run's items: give runId")
    runs = [
        run_overview(run, project)
        for run in settle(run_list(name=experiment, limit=limit or RUNS_LISTED))
    ]
    if not runs:
        text = "No runs yet" + (f" for {experiment!r}" if experiment else "") + "; use cobalt_run."
    else:
        text = "\n".join(
            f"{r['id']}  {r['name']}  {r['timestamp']}  {r['status']}  "
            f"{r['total']} items, {r['failed']} errors  avg {r['avgScore']:.2f}"
            if r["avgScore"] is not None
            else f"{r['id']}  {r['name']}  {r['timestamp']}  {r['status']}  {r['total']} items"
            for r in runs
        )
    return result(text, {"count": len(runs), "runs": runs})


def entries_by_key(run: Any, keys: set[str]) -> dict[str, dict[str, Any]]:
    """Results-file entries of the first repetition of the given items of a run."""
    from cobalt_app.results import iter_item_entries

    entries = iter_item_entries(run, keys=keys, first_repetition=True)
    return {entry["key"]: entry for entry in entries}


def verdict_text(entry: dict[str, Any] | None, evaluator: str) -> str | None:
    verdict = (entry or {}).get("evaluations", {}).get(evaluator) or {}
    return verdict.get("reason") or verdict.get("error")


def window(total: int, offset: int, kept: int) -> dict[str, Any]:
    following = offset + kept
    return {
        "offset": offset,
        "returned": kept,
        "total": total,
        "nextOffset": following if following < total else None,
    }


def cobalt_compare_tool(
    project: Project, *, run_a: str, run_b: str, offset: int = 0, limit: int = COMPARE_SHOWN
) -> CallToolResult:
    from cobalt.significance import describe_result
    from cobalt_app.compare_strip import verdict_strip
    from cobalt_app.selectors import compare_runs

    tokens = project.result_tokens(project.config())
    a, b = find_run(run_a), find_run(run_b)
    diff = compare_runs(a, b, top=offset + limit)
    regressions = diff["regressions"][offset:]
    improvements = diff["improvements"][offset:]
    changes = regressions + improvements
    keys = {change["key"] for change in changes}
    items_a, items_b = entries_by_key(a, keys), entries_by_key(b, keys)
    for change in changes:
        entry_a, entry_b = items_a.get(change["key"]), items_b.get(change["key"])
        change["input"] = (entry_b or entry_a or {}).get("input")
        change["outputA"] = (entry_a or {}).get("output", {}).get("output")
        change["outputB"] = (entry_b or {}).get("output", {}).get("output")
        change["reasonA"] = verdict_text(entry_a, change["evaluator"])
        change["reasonB"] = verdict_text(entry_b, change["evaluator"])
    strip = verdict_strip(a, [(b, diff)])
    head = {key: value for key, value in diff.items() if key not in ("regressions", "improvements")}
    head["strip"] = strip
    room = tokens - value_tokens(head) - 1_500  # the plain-language lines
    fitted = fit(regressions, improvements, room, shape=shortened)
    kept_regressions, kept_improvements = fitted.kept_first, fitted.kept_rest
    data = {
        **head,
        "regressions": fitted.items[:kept_regressions],
        "improvements": fitted.items[kept_regressions:],
        "regressionsPage": window(diff["regressionCount"], offset, kept_regressions),
        "improvementsPage": window(diff["improvementCount"], offset, kept_improvements),
        "note": "outputs and reasons are from each run's first repetition of the item",
    }
    lines = [f"Run A {a.id} ({a.name}) → run B {b.id} ({b.name}):"]
    if a.name != b.name:
        lines.append("Note: the runs belong to different experiments; items match by key.")
    lines.append(f"Verdict: {strip['runs'][0]['sentence']}")
    for name, values in diff["evaluators"].items():
        if values["delta"] is None:
            lines.append(f"  {name}: only scored in one run")
        else:
            lines.append(
                f"  {name}: {values['a']:.2f} → {values['b']:.2f} ({values['delta']:+.2f})"
            )
        if name in diff["significance"]:  # the paired test: is the change more than noise?
            lines.append(f"    paired test: {describe_result(diff['significance'][name])}")
    lines.append(f"{diff['matchedItems']} matched items.")
    for label, page in (("regressions", "regressionsPage"), ("improvements", "improvementsPage")):
        shown = data[page]
        if not shown["total"]:
            lines.append(f"No {label}.")
            continue
        span = (
            f"{shown['offset'] + 1}–{shown['offset'] + shown['returned']}"
            if shown["returned"]
            else "none"
        )
        line = f"{label.capitalize()}: {span} of {shown['total']} {label} shown"
        if shown["nextOffset"] is not None:
            line += f"; more with cobalt_compare offset={shown['nextOffset']}"
        lines.append(line + ".")
    for label, rows in (("Regressed", data["regressions"]), ("Improved", data["improvements"])):
        for row in rows[:COMPARE_SHOWN]:
            line = (
                f"  {label}: {row['key']} · {row['evaluator']} {row['a']:.2f} → {row['b']:.2f}"
                f" | output B: {row['outputB']!r} | reason B: {row['reasonB']!r}"
            )
            lines.append(line if len(line) <= 400 else line[:400] + "…")
    return result("\n".join(lines), data)
