"""Reads behind the compare page: a baseline against up to five other runs — the verdict
strip (`compare_strip`), the per-evaluator summary of each pair, and every matched item with
its change class.

The summary is `selectors.compare_runs`, shared with the CLI, the API and the MCP tool; the
per-item table reuses the same join of the runs' score tables (`score_tables`, stored at
finalisation), so no request reads every verdict of the runs. The side by side of one item is
`page_compare_side`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cobalt.significance import ALPHA, IMPROVED, REGRESSED, format_p
from cobalt.verdict import score_verdict
from cobalt_app import calibration, score_tables
from cobalt_app.compare_strip import notable, verdict_strip
from cobalt_app.models import Run
from cobalt_app.page_compare_groups import CompareGroups, compare_groups
from cobalt_app.page_compare_table import (  # noqa: F401 (the page's names)
    CHANGED,
    CHANGES,
    FILTERS,
    KINDS,
    PAIR_SORTS,
    PairTable,
    pair_table,
)
from cobalt_app.page_selectors import pass_marks
from cobalt_app.selectors import compare_runs

MAX_OTHERS = 5  # runs compared with the baseline at once


@dataclass
class Versus:
    """The baseline against one other run: the per-evaluator tests and the keys matched."""

    run: Run
    label: str
    evaluators: list[dict[str, Any]]
    matched: int
    only_in_a: int
    only_in_b: int
    alpha: float


@dataclass
class Comparison:
    a: Run
    b: Run
    evaluators: list[dict[str, Any]]
    matched: int
    only_in_a: int
    only_in_b: int
    table: PairTable
    alpha: float = ALPHA
    judges: list[Any] = field(default_factory=list)  # calibration.JudgeComparison
    versus: list[Versus] = field(default_factory=list)
    strip: dict[str, Any] = field(default_factory=dict)  # compare_strip.verdict_strip
    groups: CompareGroups | None = None  # by a field's value, when asked

    @property
    def same_experiment(self) -> bool:
        return all(v.run.name == self.a.name for v in self.versus)

    @property
    def others(self) -> list[Run]:
        return [v.run for v in self.versus]

    @property
    def chart_data(self) -> dict[str, Any]:
        return {
            "labels": [e["name"] for e in self.evaluators],
            "a": [e["a"] for e in self.evaluators],
            "b": [e["b"] for e in self.evaluators],
            "labelA": f"A · {self.a.id}",
            "labelB": f"B · {self.b.id}",
        }


def compare(
    a: Run,
    others: list[Run],
    *,
    evaluator: str = "",
    change: str = "",
    sort: str = "delta",
    over: str = "",
    group_by: str = "",
    group: tuple[str, str] | None = None,
    page: int = 1,
    per_page: int = 50,
    alpha: float = ALPHA,
) -> Comparison:
    """The compare page of baseline `a` against `others` (the first is B): the strip, the
    paired tests per other run, the groups by a field (`group_by`: `page_compare_groups`),
    and a page of every item matched by key in A and B (filtered by evaluator, by change or
    class and to one `group` (key, value), sorted by Δ or key, in B's column or the one
    `over` names: `page_compare_table`), with the further runs' columns."""
    base = score_tables.kept(a)
    pairings = [score_tables.join(base, score_tables.kept(run)) for run in others]
    diffs = [
        compare_runs(a, run, top=0, alpha=alpha, pairing=pairing)
        for run, pairing in zip(others, pairings, strict=True)
    ]
    marks = pass_marks(a)
    for run in others:
        marks = marks | pass_marks(run)
    versus = [
        _versus(run, diff, marks, "B" if len(others) == 1 else f"B{n + 1}")
        for n, (run, diff) in enumerate(zip(others, diffs, strict=True))
    ]
    names = [e["name"] for e in versus[0].evaluators]
    shown = [evaluator] if evaluator else names
    table = pair_table(
        a,
        others,
        pairings,
        shown,
        marks,
        change=change,
        sort=sort,
        over=over,
        group=group,
        page=page,
        per_page=per_page,
    )
    first = versus[0]
    return Comparison(
        a=a,
        b=others[0],
        evaluators=first.evaluators,
        matched=first.matched,
        only_in_a=first.only_in_a,
        only_in_b=first.only_in_b,
        table=table,
        alpha=first.alpha,
        judges=calibration.compare_calibration(a, others[0]),
        versus=versus,
        strip=verdict_strip(a, list(zip(others, diffs, strict=True))),
        groups=compare_groups(a, others, pairings, group_by, alpha=alpha) if group_by else None,
    )


def _versus(run: Run, diff: dict[str, Any], marks: dict[str, float], label: str) -> Versus:
    evaluators = []
    for name, values in diff["evaluators"].items():
        test = diff["significance"][name]
        evaluators.append(
            {
                "name": name,
                **values,
                "verdictA": score_verdict(values["a"], marks.get(name)),
                "verdictB": score_verdict(values["b"], marks.get(name)),
                "pairs": test["n"],
                "meanDelta": test["delta"],
                "ci": test["ci"],
                "pValue": test["pValue"],
                "test": test["test"],
                "verdict": test["verdict"],
            }
        )
    return Versus(
        run=run,
        label=label,
        evaluators=evaluators,
        matched=diff["matchedItems"],
        only_in_a=len(diff["onlyInA"]),
        only_in_b=len(diff["onlyInB"]),
        alpha=diff["alpha"],
    )


def strip_rows(strip: dict[str, Any]) -> list[dict[str, Any]]:
    """The verdict strip as the page's table: a row per measure, the baseline's value, then
    each other run's value and change, coloured good or bad (an evaluator only when its
    paired test says so; latency, tokens and cost when `compare_strip.notable`)."""
    from cobalt_app.templatetags.cobalt import cost, duration, percent, thousands

    def signed(value: float, shown: Any) -> str:
        return ("+" if value > 0 else "−" if value < 0 else "±") + shown(abs(value))

    base, columns = strip["baseline"], strip["runs"]
    rows = []
    for label, key, shown, lower_better in (
        ("Items", "items", thousands, None),
        ("Errors", "errors", thousands, True),
        ("Timeouts", "timeouts", thousands, True),
    ):
        rows.append(_strip_row(label, base, columns, key, shown, signed, lower_better))
    for n, name in enumerate(strip["evaluators"]):
        cells = []
        for column in columns:
            e = column["evaluators"][n]
            good = {IMPROVED: "good", REGRESSED: "bad"}.get(e["verdict"], "")
            delta = "—" if e["delta"] is None else signed(e["delta"], _points)
            cells.append(
                {
                    "value": percent(e["passRateB"]),
                    "delta": delta,
                    "trend": good,
                    "verdict": e["verdict"],
                    "p": format_p(e["pValue"]),
                }
            )
        base_rate = base["passRates"].get(name)
        rows.append({"label": f"{name} pass rate", "base": percent(base_rate), "cells": cells})
    for label, key, shown in (
        ("p50 latency", "latencyP50", duration),
        ("p95 latency", "latencyP95", duration),
        ("Tokens", "tokens", thousands),
        ("Cost", "cost", cost),
    ):
        rows.append(_strip_row(label, base, columns, key, shown, signed, True))
    return rows


def _points(share: float) -> str:
    return f"{share * 100:.0f} pp"


def _strip_row(
    label: str,
    base: dict[str, Any],
    columns: list,
    key: str,
    shown: Any,
    signed: Any,
    lower_better: Any,
) -> dict[str, Any]:
    cells = []
    for column in columns:
        change = column["deltas"][key]
        trend = ""
        items = min(base["items"] or 0, column["items"] or 0)
        if lower_better is not None and notable(key, base[key], column[key], items):
            trend = "good" if (change < 0) == lower_better else "bad"
        cells.append(
            {
                "value": shown(column[key]),
                "delta": "—" if change is None else signed(change, shown),
                "trend": trend,
                "verdict": None,
            }
        )
    return {"label": label, "base": shown(base[key]), "cells": cells}
