"""One run as a tool result: its summary, every failing item, then the rest, within budget."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from cobalt.verdict import Verdict
from cobalt_cli.mcp.budget import Fitted, compact, estimate_tokens, fit, value_tokens
from cobalt_cli.mcp.project import Project

FAILING_SHOWN = 10  # failing items described in the plain-language summary
NOT_RUN = ("cancelled", "pending")
ITEM_STATUSES = ("ok", "error", "timeout", *NOT_RUN)
StatusName = Literal["failing", "passing", "ok", "error", "timeout", "cancelled", "pending"]
RESERVED = 600  # tokens kept for the parts written after the items are chosen
PAGE_SIZE = 50  # items of a page unless `limit` says otherwise (fewer if they do not fit)


def item_problems(entry: dict[str, Any], evaluator: str | None = None) -> list[str]:
    """Why an item is failing (empty when it passes or never ran): an error or timeout, an
    evaluation error, a score below its evaluator's pass mark (the evaluation's `verdict` in
    the results entry, `cobalt.verdict`); only `evaluator`'s verdict if given."""
    status = entry.get("status")
    if status in NOT_RUN:
        return []
    if status not in (None, "ok"):
        return [f"{status}: {entry.get('error') or 'no detail'}"]
    problems = []
    for name, evaluation in (entry.get("evaluations") or {}).items():
        if evaluator is not None and name != evaluator:
            continue
        judged = evaluation.get("verdict")
        if judged == Verdict.ERROR or evaluation.get("score") is None:
            problems.append(f"{name} could not score it ({evaluation.get('error')})")
        elif judged == Verdict.FAIL:
            reason = f" — {evaluation['reason']}" if evaluation.get("reason") else ""
            problems.append(f"{name} {evaluation['score']:.2f}{reason}")
    return problems


@dataclass(frozen=True)
class ItemFilter:
    """`cobalt_results`' item filters."""

    status: str | None = None
    evaluator: str | None = None
    max_score: float | None = None

    def arguments(self) -> dict[str, Any]:
        named = {"status": self.status, "evaluator": self.evaluator, "maxScore": self.max_score}
        return {key: value for key, value in named.items() if value is not None}

    def matches(self, entry: dict[str, Any]) -> bool:
        verdicts = entry.get("evaluations") or {}
        if self.evaluator is not None and self.evaluator not in verdicts:
            return False
        if self.status == "failing" and not item_problems(entry, self.evaluator):
            return False
        if self.status == "passing" and (
            entry.get("status") != "ok" or item_problems(entry, self.evaluator)
        ):
            return False
        if self.status in ITEM_STATUSES and entry.get("status") != self.status:
            return False
        if self.max_score is not None:
            scores = [
                verdict.get("score")
                for name, verdict in verdicts.items()
                if self.evaluator is None or name == self.evaluator
            ]
            if not any(score is not None and score <= self.max_score for score in scores):
                return False
        return True


def with_problems(entry: dict[str, Any]) -> dict[str, Any]:
    problems = item_problems(entry)
    return {**entry, "problems": problems} if problems else entry


def entries(run: Any) -> Iterator[dict[str, Any]]:
    from cobalt_app.results import iter_item_entries

    return iter_item_entries(run)


def error_tracebacks(run: Any, project: Project) -> dict[int, str]:
    """Where the first failing items raised (`error_line`), by item index."""
    from cobalt_app.models import ItemResult
    from cobalt_app.selectors import failed_items

    errored = failed_items(run, statuses=[ItemResult.Status.ERROR], traced=True)
    found = {
        item.item_index: error_line(item.traceback, project) for item in errored[:FAILING_SHOWN]
    }
    return {index: line for index, line in found.items() if line}


def error_line(traceback_text: str, project: Project) -> str | None:
    """`experiments/qa.cobalt.py:53 in run: output = answr(q)` (`tracebacks.raised_at`)."""
    from cobalt_app.tracebacks import raised_at

    found = raised_at(traceback_text, project.dir)
    if found is None:
        return None
    return f"{found.where}: {one_line(found.code, 160)}" if found.code else found.where


def header_of(run: Any, project: Project, tokens: int) -> dict[str, Any]:
    from cobalt_app.calibration import calibration_json
    from cobalt_app.results import run_header

    return {
        **run_header(run),
        "calibration": calibration_json(run),
        "resultsFile": project.relative(run.results_path),
        "budgetTokens": tokens,
    }


def gate_of(run: Any, project: Project) -> dict[str, Any] | None:
    """What `cobalt run --ci` decides for this run alone (no baseline): whether it passes, how
    many checks it made, and each failed one's line (`exact avg 0.5 < 0.8`); None while the
    run is not finished."""
    from cobalt_app.ci_verdict import gate_runs
    from cobalt_app.models import Run

    if run.status not in Run.FINISHED:
        return None
    outcome = gate_runs([run], project.config())
    checks = len(outcome.global_checks) + sum(len(r.checks) for r in outcome.reports)
    failed = [check.line() for check in outcome.violations] + outcome.config_errors
    return {"passed": not failed, "checks": checks, "violations": failed}


def gate_text(gate: dict[str, Any] | None) -> str | None:
    if gate is None:
        return None
    if gate["passed"]:
        return f"CI gate (cobalt run --ci, no baseline): passes its {gate['checks']} checks."
    return "CI gate (cobalt run --ci, no baseline): FAILS: " + "; ".join(gate["violations"]) + "."


def run_document(
    run: Any, project: Project, tokens: int, *, budget: int | None = None, passing: bool = True
) -> tuple[str, dict[str, Any]]:
    """(plain-language summary, document) of a run within `tokens` (its share of the
    `budget`): the run's header and summary, every failing item (with its `problems`), then
    (unless `passing` is false) the passing items in order. Items that did not run are
    counted, not listed."""
    budget = budget or tokens
    header = {**header_of(run, project, budget), "gate": gate_of(run, project)}
    failing: list[dict[str, Any]] = []
    counts = {"total": 0, "failing": 0, "passing": 0, "notRun": 0}
    not_run = dict.fromkeys(NOT_RUN, 0)
    for entry in entries(run):
        counts["total"] += 1
        if entry.get("status") in NOT_RUN:
            counts["notRun"] += 1
            not_run[entry["status"]] += 1
        elif item_problems(entry):
            failing.append(with_problems(entry))
        else:
            counts["passing"] += 1
    counts["failing"] = len(failing)
    text = describe_run(header, failing, counts["total"], error_tracebacks(run, project))
    room = tokens - value_tokens(header) - estimate_tokens(text) - RESERVED
    passed = (
        entry
        for entry in (entries(run) if passing else ())
        if entry.get("status") not in NOT_RUN and not item_problems(entry)
    )
    fitted = fit(failing, passed, room)
    document = {
        **header,
        "itemCounts": {
            **counts,
            "shown": len(fitted.items),
            "failingShown": fitted.kept_first,
        },
        "items": sorted(fitted.items, key=lambda e: (e["index"], e["runIndex"])),
        "omitted": omitted(run.id, fitted, counts, not_run, budget),
    }
    if document["omitted"]:
        text += "\n" + document["omitted"]["note"]
    return text, document


def omitted(
    run_id: str, fitted: Fitted, counts: dict[str, int], not_run: dict[str, int], budget: int
) -> dict[str, Any] | None:
    """What a run document left out, and the `cobalt_results` calls that fetch it."""
    left = {
        "failing": counts["failing"] - fitted.kept_first,
        "passing": counts["passing"] - fitted.kept_rest,
        "cancelled or pending": counts["notRun"],
    }
    offsets = {"failing": fitted.kept_first, "passing": fitted.kept_rest}
    fetch = [
        {"runId": run_id, "status": status, "offset": offsets[status]}
        for status in ("failing", "passing")
        if left[status]
    ]
    fetch += [{"runId": run_id, "status": status} for status, n in not_run.items() if n]
    cut = any("shortened" in item for item in fitted.items)
    if not fetch and not cut:
        return None
    parts = [f"{number} {status} items" for status, number in left.items() if number]
    note = f"Left out to stay within {budget:,} tokens: " + (
        " and ".join(parts) if parts else "nothing but long fields"
    )
    if cut:
        note += f" (long strings cut to {fitted.limit:,} characters: see each item's `shortened`)"
    if fetch:
        note += "; fetch them with cobalt_results " + " and ".join(compact(a) for a in fetch)
    return {
        "failingItems": left["failing"],
        "otherItems": left["passing"] + left["cancelled or pending"],
        "fieldLimit": fitted.limit,
        "fetch": [{"tool": "cobalt_results", "arguments": arguments} for arguments in fetch],
        "note": note + ".",
    }


def item_page(
    run: Any,
    project: Project,
    tokens: int,
    *,
    where: ItemFilter,
    offset: int,
    limit: int | None,
) -> tuple[str, dict[str, Any]]:
    """The items of a run that match `where`, from `offset`, at most `limit` (PAGE_SIZE by
    default), within budget: fewer when they do not fit even with their fields shortened."""
    limit = limit or PAGE_SIZE
    header = header_of(run, project, tokens)
    window: list[dict[str, Any]] = []
    matched = 0
    for entry in entries(run):
        if not where.matches(entry):
            continue
        if matched >= offset and len(window) < limit:
            window.append(with_problems(entry))
        matched += 1
    listed = [entry for entry in window if entry.get("problems")][:FAILING_SHOWN]
    room = tokens - value_tokens(header) - RESERVED
    room -= estimate_tokens("\n".join(failing_line(entry) for entry in listed))
    fitted = fit(window, [], room)
    returned = fitted.kept_first
    following = offset + returned if offset + returned < matched else None
    page = {
        "filter": where.arguments(),
        "offset": offset,
        "limit": limit,
        "returned": returned,
        "matched": matched,
        "nextOffset": following,
        "fieldLimit": fitted.limit,
    }
    described = ", ".join(f"{k}={v}" for k, v in where.arguments().items()) or "no filter"
    text = (
        f"{header['name']} — run {header['id']} ({header['status']}): items "
        f"{offset + 1}–{offset + returned} of {matched} matching ({described})"
        if returned
        else f"{header['name']} — run {header['id']}: no items at offset {offset} of {matched} "
        f"matching ({described})"
    )
    if following is not None:
        text += (
            f"; {matched - following} more: call cobalt_results again with offset {following}"
            + (" (fewer than asked, to stay within the token budget)" if returned < limit else "")
        )
    if any("shortened" in item for item in fitted.items):
        text += f". Long strings cut to {fitted.limit} characters (see each item's `shortened`)"
    text += "."
    failing = [entry for entry in fitted.items if entry.get("problems")]
    text += "".join(f"\n{failing_line(entry)}" for entry in failing[:FAILING_SHOWN])
    if len(failing) > FAILING_SHOWN:
        text += f"\n  … and {len(failing) - FAILING_SHOWN} more failing in `items`."
    document = {**header, "items": fitted.items, "page": page}
    return text, document


def score_line(summary: dict[str, Any]) -> str:
    parts = []
    for name, stats in (summary.get("scores") or {}).items():
        avg = stats.get("avg")
        parts.append(f"{name} avg {avg:.2f}" if avg is not None else f"{name} no scores")
    return ", ".join(parts) or "no evaluators"


def duration_text(milliseconds: float | None) -> str:
    if milliseconds is None:
        return ""
    if milliseconds < 1000:
        return f", {milliseconds:.0f} ms"
    return f", {milliseconds / 1000:.1f} s"


def one_line(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def failing_line(entry: dict[str, Any]) -> str:
    """`  - #4 capital-canada: exact 0.00 — output differs … | output: 'Toronto'`."""
    output = (entry.get("output") or {}).get("output")
    shown = one_line(output if isinstance(output, str) else json.dumps(output, default=str), 120)
    line = f"  - #{entry['index'] + 1} {entry.get('key')}: {'; '.join(entry['problems'])}"
    if entry.get("status") == "ok":
        line += f" | output: {shown!r}"
    return one_line(line, 400)


def describe_run(
    header: dict[str, Any], failing: list[dict[str, Any]], total: int, tracebacks: dict[int, str]
) -> str:
    """A few plain-language lines about one run and its first failing items."""
    summary = header.get("summary") or {}
    lines = [
        f"{header['name']} — run {header['id']} ({header.get('status')}, {total} items"
        f"{duration_text(summary.get('totalDurationMs'))}): {score_line(summary)}."
    ]
    gate = gate_text(header.get("gate"))
    if gate:
        lines.append(gate)
    for name, found in (header.get("calibration") or {}).items():
        rate = ((summary.get("scores") or {}).get(name) or {}).get("passRate")
        raw = "no" if rate is None else f"{rate:.1%}"
        lines.append(f"Judge {name} ({raw} raw pass rate): {found['line']}.")
    spans_note = (summary.get("serviceSpans") or {}).get("note")
    if spans_note:
        lines.append(f"Warning: {spans_note}.")
    not_run = sum((summary.get("itemStatus") or {}).get(status, 0) for status in NOT_RUN)
    if not failing:
        passed = "No item that ran failed" if not_run else "All items passed"
        lines.append(f"{passed} (no error, no score below its evaluator's pass mark).")
    else:
        lines.append(f"{len(failing)} of {total} items failing:")
    if not_run:
        lines.append(f"{not_run} items did not run (cancelled or pending).")
    for entry in failing[:FAILING_SHOWN]:
        lines.append(failing_line(entry))
        if entry["index"] in tracebacks:
            lines.append(f"      at {tracebacks[entry['index']]}")
    if len(failing) > FAILING_SHOWN:
        lines.append(
            f"  … and {len(failing) - FAILING_SHOWN} more (in the structured content's `items`, "
            "each with its `problems`)."
        )
    return "\n".join(lines)


def run_overview(run: Any, project: Project) -> dict[str, Any]:
    """One run in the shape of seed 003's latest-results entries."""
    from cobalt_app.results import run_header

    summary = run.summary or {}
    scores = {
        name: {key: stats.get(key) for key in ("avg", "min", "max")}
        for name, stats in (summary.get("scores") or {}).items()
    }
    averages = [s["avg"] for s in scores.values() if s.get("avg") is not None]
    return {
        "id": run.id,
        "name": run.name,
        "timestamp": run_header(run)["timestamp"],
        "status": run.status,
        "file": run.file or None,
        "tags": run.tags,
        "total": run.total_items,
        "completed": (summary.get("itemStatus") or {}).get("ok", 0),
        "failed": run.error_count + run.timeout_count,
        "evaluationErrors": summary.get("evaluationErrors", 0),
        "avgScore": sum(averages) / len(averages) if averages else None,
        "cost": run.estimated_cost,
        "duration": run.duration_ms,
        "scores": scores,
        "resultsFile": project.relative(run.results_path),
    }
