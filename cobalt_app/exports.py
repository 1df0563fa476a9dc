"""Exports of one run as CSV, Markdown, JSON or JSON Lines, streamed chunk by chunk.

The same generators feed the page downloads (`StreamingHttpResponse`) and
`cobalt export RUN --format csv|md|json|jsonl`; each reads the run's items in keyset chunks
(`results.iter_item_entries`), so memory stays flat whatever the run's size. JSON and JSON
Lines are the results file's two forms. Agent outputs are untrusted: CSV text cells that a
spreadsheet would run as a formula are prefixed with `'`, Markdown cells are HTML-escaped.
People's labels come beside the scores, as they are when exporting: each item's `labels` in
JSON; in CSV an `<evaluator>_labels` column per evaluator and `label_disagreement`.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from typing import Any

from cobalt import verdict
from cobalt.errors import CobaltError
from cobalt_app import results
from cobalt_app.models import Run

FORMATS = {
    "csv": ("text/csv; charset=utf-8", "csv"),
    "md": ("text/markdown; charset=utf-8", "md"),
    "json": ("application/json", "json"),
    "jsonl": ("application/x-ndjson", "jsonl"),
}
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
MARKDOWN_CELL = 200


class ExportError(CobaltError):
    pass


def export(run: Run, fmt: str) -> Iterator[str]:
    """The run in `fmt` (csv, md, json or jsonl), as text chunks."""
    if fmt == "csv":
        return export_csv(run)
    if fmt == "md":
        return export_markdown(run)
    if fmt == "json":
        return results.results_document(run)
    if fmt == "jsonl":
        return results.results_lines(run)
    raise ExportError(f"unknown export format {fmt!r}: use one of {', '.join(FORMATS)}")


def filename(run: Run, fmt: str) -> str:
    return results.results_stem(run) + "." + FORMATS[fmt][1]


def content_type(fmt: str) -> str:
    return FORMATS[fmt][0]


def evaluator_names(run: Run) -> list[str]:
    return run.evaluator_names or list((run.summary or {}).get("scores", {}))


# CSV ----------------------------------------------------------------------------------------


def export_csv(run: Run) -> Iterator[str]:
    names = evaluator_names(run)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    header = ["index", "run_index", "key", "status", "input", "output", "metadata"]
    header += ["latency_ms", "tokens", "cost", "error", "verdict"]
    for name in names:
        header += [f"{name}_score", f"{name}_verdict", f"{name}_reason"]
    header += ["steps", "trace"]
    header += [*(f"{name}_labels" for name in names), "label_disagreement"]
    writer.writerow(header)
    for count, entry in enumerate(results.iter_item_entries(run), start=1):
        output = entry["output"]
        row = [
            entry["index"],
            entry["runIndex"],
            safe_cell(entry["key"]),
            entry["status"],
            safe_cell(_text(entry["input"])),
            safe_cell(_text(output["output"])),
            safe_cell(_text(output["metadata"]) if output["metadata"] else ""),
            "" if entry["latencyMs"] is None else round(entry["latencyMs"], 3),
            entry["tokens"],
            _decimal(entry["cost"]),
            safe_cell(entry["error"] or ""),
            entry["verdict"],
        ]
        for name in names:
            evaluation = entry["evaluations"].get(name) or {}
            judged = evaluation.get("verdict", "")
            if "error" in evaluation:
                row += ["", judged, safe_cell(f"error: {evaluation['error']}")]
            else:
                row += [
                    _number(evaluation.get("score")),
                    judged,
                    safe_cell(evaluation.get("reason") or ""),
                ]
        trace = entry["trace"]
        row += [len(trace), safe_cell(json.dumps(trace, ensure_ascii=False) if trace else "")]
        row += label_cells(entry["labels"], names)
        writer.writerow(row)
        if count % 500 == 0:
            yield _drain(buffer)
    yield _drain(buffer)


def label_cells(labels: list[dict[str, Any]], names: list[str]) -> list[str]:
    """Per evaluator, its current labels as `reviewer: verdict` (`; ` between reviewers);
    then `yes` when one of them disagrees with the judge. Stale labels are left out."""
    current = [label for label in labels if not label["stale"]]
    cells = [
        safe_cell(
            "; ".join(
                f"{label['reviewer']}: {label['verdict']}"
                for label in current
                if label["evaluator"] == name
            )
        )
        for name in names
    ]
    return [*cells, "yes" if any(label["disagrees"] for label in current) else ""]


def safe_cell(text: str) -> str:
    """Text a spreadsheet would evaluate as a formula gets a leading apostrophe."""
    return "'" + text if text.startswith(FORMULA_PREFIXES) else text


def _drain(buffer: io.StringIO) -> str:
    value = buffer.getvalue()
    buffer.seek(0)
    buffer.truncate()
    return value


# Markdown -----------------------------------------------------------------------------------


def export_markdown(run: Run) -> Iterator[str]:
    names = evaluator_names(run)
    summary = run.summary or {}
    lines = [f"# {md_cell(run.name)} — run `{run.id}`", ""]
    facts = [
        ("Status", run.status),
        ("Created", run.created_at.strftime("%Y-%m-%d %H:%M:%S UTC")),
        ("File", run.file or "—"),
        ("Tags", ", ".join(run.tags) or "—"),
        ("Git commit", run.git_commit or "—"),
        ("Items", f"{run.total_items} ({_status_line(summary)})"),
        ("Duration", _ms(run.duration_ms)),
        ("Tokens", f"{run.total_tokens:,}"),
        ("Estimated cost", f"${run.estimated_cost:.4f}"),
    ]
    lines += [f"- **{label}:** {md_cell(str(value))}" for label, value in facts]
    lines += ["", "## Scores", ""]
    lines += [
        "| Evaluator | Avg | Min | Max | P50 | P95 | Pass rate | Scored | Errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        s = summary.get("scores", {}).get(name) or {}
        cells = [_number(s.get(k), 2) for k in ("avg", "min", "max", "p50", "p95")]
        rate, mark = s.get("passRate"), verdict.pass_mark(s.get("passMark"))
        at = "" if mark == verdict.DEFAULT_PASS_THRESHOLD else f" (≥ {mark:g})"
        cells.append("—" if rate is None else f"{rate:.0%}{at}")
        cells += [str(s.get("count", 0)), str(s.get("errors", 0))]
        lines.append(f"| {md_cell(name)} | " + " | ".join(c or "—" for c in cells) + " |")
    lines += ["", "## Items", ""]
    head = ["#", "Key", "Status", "Verdict", "Input", "Output", *names]
    head += ["Latency", "Tokens", "Steps"]
    lines.append("| " + " | ".join(md_cell(h) for h in head) + " |")
    lines.append("|" + "---|" * len(head))
    yield "\n".join(lines) + "\n"
    chunk: list[str] = []
    for entry in results.iter_item_entries(run):
        repetition = entry["runIndex"]
        index = f"#{entry['index'] + 1}" + (f" run {repetition + 1}" if repetition else "")
        output = entry["output"]["output"]
        if entry["status"] != "ok":
            output = f"{entry['status']}: {entry['error'] or ''}"
        cells = [index, entry["key"], entry["status"], entry["verdict"]]
        cells += [_text(entry["input"]), _text(output)]
        for name in names:
            evaluation = entry["evaluations"].get(name) or {}
            score = _number(evaluation.get("score"), 2)
            judged = evaluation.get("verdict")
            cells.append(
                "error" if "error" in evaluation else f"{score} {judged}" if judged else score
            )
        cells += [_ms(entry["latencyMs"]), str(entry["tokens"]), steps_cell(entry["trace"])]
        chunk.append("| " + " | ".join(md_cell(c or "—") for c in cells) + " |")
        if len(chunk) >= 500:
            yield "\n".join(chunk) + "\n"
            chunk = []
    if chunk:
        yield "\n".join(chunk) + "\n"


def steps_cell(trace: list[dict[str, Any]]) -> str:
    """`3 (llm, tool get_weather, llm)`: how many steps the agent took, and which."""
    if not trace:
        return "0"
    names = [s["kind"] if s["kind"] == "llm" else f"{s['kind']} {s['name']}" for s in trace]
    return f"{len(trace)} ({', '.join(names)})"


def md_cell(text: str, limit: int = MARKDOWN_CELL) -> str:
    """One line, pipes escaped, HTML neutralised, cut at `limit` characters."""
    text = " ".join(str(text).split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("\\", "\\\\").replace("|", "\\|")


def _status_line(summary: dict[str, Any]) -> str:
    counts = summary.get("itemStatus") or {}
    parts = [f"{n} {status}" for status, n in counts.items() if n]
    return ", ".join(parts) or "no results"


# Helpers ------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict) and set(value) == {"input"}:
        value = value["input"]
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _number(value: float | None, digits: int | None = None) -> str:
    if value is None:
        return ""
    return f"{value:.{digits}f}" if digits is not None else repr(float(value))


def _decimal(value: float | None) -> str:
    """A cost as a plain decimal to twelve places, never in exponent form: 0.0000489."""
    if value is None:
        return ""
    text = f"{value:.12f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.0f}ms" if value < 1000 else f"{value / 1000:.1f}s"
