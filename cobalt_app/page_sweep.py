"""What the sweep page shows: the stored analysis (ranking, tests, Pareto front), one page of
the items × variants matrix (from the runs' score tables, never every evaluation) and the
chart's series. At 12 variants × 10,000 items a page reads twelve score tables and the
sweep's stored analysis."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.urls import reverse

from cobalt_app import sweeps
from cobalt_app.models import Sweep
from cobalt_app.page_items import Paging


@dataclass
class MatrixPage(Paging):
    labels: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def summary(self) -> str:
        if not self.total:
            return "No items"
        return f"Items {self.start:,}–{self.end:,} of {self.total:,}"


def chart_data(result: dict[str, Any]) -> dict[str, Any]:
    """Quality against cost (or p50 latency when nothing cost anything), per variant."""
    rows = [r for r in result["variants"] if r["meanScore"] is not None]
    by_cost = any(r["cost"] for r in rows)
    points = [
        {
            "x": round(r["cost"], 6) if by_cost else round(r["latencyP50"] or 0.0, 1),
            "y": r["meanScore"],
            "label": r["label"],
            "latency": round(r["latencyP50"] or 0.0),
        }
        for r in rows
    ]
    return {
        "xLabel": "cost ($)" if by_cost else "p50 latency (ms)",
        "front": [p for p, r in zip(points, rows, strict=True) if r["pareto"]],
        "others": [p for p, r in zip(points, rows, strict=True) if not r["pareto"]],
    }


def column(label: str, row: dict[str, Any] | None) -> dict[str, Any]:
    """A matrix column's head: the variant, its run, and why it has no score (if so)."""
    note = ""
    if row is not None and row["meanScore"] is None and row["errors"]:
        note = f"{row['errors']:,} of {row['items']:,} items errored"
        note += f": {row['firstError']}" if row.get("firstError") else ""
    url = reverse("cobalt:run", args=[row["runId"]]) if row is not None else ""
    return {"label": label, "url": url, "note": note}


def sweep_context(sweep: Sweep, *, page: int, per_page: int) -> dict[str, Any]:
    runs = sweeps.variant_runs(sweep)
    tables = sweeps.tables_of(runs)  # a running run's is read from its rows: once
    result = sweeps.summary(sweep, runs, tables)  # read only: stored when the last run ended
    labels, rows, total = sweeps.matrix_rows(
        sweep,
        offset=(page - 1) * per_page,
        limit=per_page,
        order=result["ranking"],
        runs=runs,
        tables=tables,
    )  # best first
    matrix = MatrixPage(number=page, per_page=per_page, total=total, labels=labels, rows=rows)
    rows_by_label = {r["label"]: r for r in result["variants"]}
    failed = [r for r in result["variants"] if r["meanScore"] is None]
    columns = [column(label, rows_by_label.get(label)) for label in labels]
    return {
        "sweep": sweep,
        "result": result,
        "matrix": matrix,
        "columns": columns,
        "failed": failed,
        "charts": chart_data(result),
    }
