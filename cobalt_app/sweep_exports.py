"""A sweep's analysis as JSON, CSV (one row per variant) or Markdown (the ranking and the
verdict): `cobalt sweeps ID --format`, the sweep page's download links and the API."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

FORMATS = ("json", "csv", "md")
CONTENT_TYPES = {"json": "application/json", "csv": "text/csv", "md": "text/markdown"}
COLUMNS = (
    "rank",
    "label",
    "runId",
    "meanScore",
    "passRate",
    "passRateLow",
    "passRateHigh",
    "latencyP50",
    "latencyP95",
    "tokens",
    "cost",
    "errors",
    "pareto",
    "isBest",
    "isDefault",
    "deltaVsBest",
    "pHolm",
    "verdictVsBest",
    "firstError",
)


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for variant in result["variants"]:
        test = variant.get("vsBest") or {}
        interval = variant.get("passRateCI") or [None, None]
        found.append(
            {
                **{k: variant.get(k) for k in COLUMNS if k in variant},
                "passRateLow": interval[0],
                "passRateHigh": interval[1],
                "deltaVsBest": test.get("delta"),
                "pHolm": test.get("pHolm"),
                "verdictVsBest": test.get("verdict", "best" if variant["isBest"] else ""),
            }
        )
    return found


def render(result: dict[str, Any], fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"unknown sweep export format {fmt!r}; use {', '.join(FORMATS)}")
    if fmt == "json":
        return json.dumps({"sweep": result}, indent=2, default=str) + "\n"
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows(result))
        return buffer.getvalue()
    return markdown(result)


def _num(value: Any, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# Sweep {_md(result['name'])} ({result['id']})",
        "",
        _md(result["verdict"]),
        "",
        "| # | variant | mean score | pass rate | p50 ms | cost $ | errors | vs best (Holm p) "
        "| Pareto |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows(result):
        verdict = row["verdictVsBest"]
        if row["pHolm"] is not None:
            verdict += f" (p={row['pHolm']:.3g})"
        lines.append(
            f"| {row['rank']} | {_md(row['label'])} | {_num(row['meanScore'])} | "
            f"{_num(row['passRate'])} | {_num(row['latencyP50'], 0)} | {_num(row['cost'], 4)} | "
            f"{row['errors']} | {_md(verdict)} | {'yes' if row['pareto'] else ''} |"
        )
    return "\n".join(lines) + "\n"
