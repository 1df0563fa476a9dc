"""Reads behind a run whose items ran several times (`--runs K`, `--repeat-flaky N`): one row per
item in every view of the run's page, with how many of its repeats passed, worst first; the
item panel's tab per repeat, opening on the worst, and what differs between a passing and a
failing repeat.

A repeat passes by the one item rule (`cobalt.verdict.item_verdict`); "worst" orders repeats
by that verdict, then by how many evaluators failed, then by the lowest score.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, QuerySet

from cobalt.verdict import Verdict, item_verdict, score_verdict
from cobalt_app.models import Evaluation, ItemResult, Run
from cobalt_app.page_compare_side import word_diff
from cobalt_app.page_items import (
    ROW_FIELDS,
    ItemFilters,
    ItemRow,
    ItemsPage,
    _item_row,
    _scores_of,
    clamp,
    item_order,
    output_text,
)
from cobalt_app.page_selectors import pass_marks
from cobalt_app.score_tables import failing_verdicts
from cobalt_app.selectors import failed_items

# Worst first: an item that crashed, then one that failed, then one with nothing judged.
VERDICT_ORDER = {
    Verdict.ERROR: 0,
    Verdict.FAIL: 1,
    Verdict.NONE: 2,
    Verdict.BORDERLINE: 3,
    Verdict.PASS: 4,
}
UNFINISHED = (ItemResult.Status.PENDING, ItemResult.Status.RUNNING)
# A row's fields less the wide ones: a repeat's input and output are read only when shown.
LIGHT_FIELDS = tuple(name for name in ROW_FIELDS if name not in ("input", "output"))


def repeat_verdict(row: ItemRow) -> Verdict:
    """One repeat's verdict, by the item rule (an error or timeout is `ERROR`)."""
    if row.status in UNFINISHED:
        return Verdict.NONE
    cells = (Verdict(cell.get("verdict") or Verdict.NONE) for cell in row.scores)
    return item_verdict(cells, errored=row.status != ItemResult.Status.OK)


def badness(row: ItemRow) -> tuple[int, int, float, int]:
    """Sorts repeats worst first: verdict, failing evaluators, lowest score, then run order."""
    failing = sum(1 for cell in row.scores if cell.get("verdict") in ("fail", "error"))
    scores = [cell["score"] for cell in row.scores if cell.get("score") is not None]
    return (VERDICT_ORDER[repeat_verdict(row)], -failing, min(scores, default=1.0), row.run_index)


def outcome(row: ItemRow) -> str:
    """How a repeat ended, in a word for its tab: passed, failed, error, timeout…"""
    verdict = repeat_verdict(row)
    if row.status != ItemResult.Status.OK:
        return row.status
    return {True: "passed", False: "failed"}.get(verdict.passed, "no verdict")


@dataclass
class ItemGroup(ItemRow):
    """An item of a run with repeats: its worst repeat's row, every repeat (in run order), per
    evaluator the mean, stddev and passing repeats, and how many repeats passed."""

    passes: int = 0

    @property
    def k(self) -> int:
        return len(self.repetitions)

    @property
    def passes_label(self) -> str:
        return f"{self.passes} of {self.k} passed"

    @property
    def outcomes(self) -> list[tuple[ItemRow, str]]:
        """Each repeat with how it ended ("passed", "failed", "error"…)."""
        return [(row, outcome(row)) for row in self.repetitions]

    @property
    def passes_verdict(self) -> str:
        return _passes_verdict(self.passes, self.k)


def _passes_verdict(passes: int, k: int) -> str:
    """The colour of "N of K passed": all, some or none passed."""
    return "pass" if passes == k else "borderline" if passes else "fail"


def repeated_item_page(
    run: Run, filters: ItemFilters = ItemFilters(), *, page: int = 1, per_page: int = 50
) -> ItemsPage:
    """One page of a run with repeats, one row per item: in index order, or the items with a
    repeat that matches the filters (and is in their `scope`, what a search or a field filter
    leaves), in the order of their first matching repeat.

    Unfiltered, four queries as for a page of single rows: the item count, the page's item
    indexes (on the unique `(run, item_index, run_index)` index), the repeats' rows, their
    scores. Filtered, the matching repeats' item indexes are read in order, then the page's.
    """
    if filters.everything:
        firsts = ItemResult.objects.filter(run=run, run_index=0)
        total = firsts.count()
        number, offset = clamp(page, total, per_page)
        ordered = firsts.order_by("item_index").values_list("item_index", flat=True)
        indexes = list(ordered[offset : offset + per_page])
    else:
        # The matching repeats' indexes in the items table's order; each item at its first.
        _, indexes_from = item_order(run, filters, column="item_index")
        matching = list(dict.fromkeys(indexes_from(0, None)))
        total = len(matching)
        number, offset = clamp(page, total, per_page)
        indexes = matching[offset : offset + per_page]
    return ItemsPage(rows=item_groups(run, indexes), number=number, per_page=per_page, total=total)


def repeated_failure_page(
    run: Run,
    *,
    evaluator: str = "",
    page: int = 1,
    per_page: int = 50,
    scope: QuerySet[ItemResult] | None = None,
) -> ItemsPage:
    """The items with a repeat that did not pass, worst first: the largest share of failing
    repeats ("0 of 3 passed" first), then the worst score (a crash or timeout below an
    evaluation error, below the lowest score), then by index. With `evaluator`, only that
    evaluator's failures count (a crash always does).

    Three narrow reads find them (failed repeats on `(run, status)`, failing verdicts on
    `(run, evaluator, score)`, the repeat counts), then the page's rows and scores.
    """
    failing: dict[int, set[int]] = defaultdict(set)
    worst: dict[int, float] = {}
    for index, run_index in failed_items(run).values_list("item_index", "run_index"):
        failing[index].add(run_index)
        worst[index] = -2.0
    verdicts = (
        failing_verdicts(run, evaluator)
        .order_by()  # ranked below, per item
        .values_list("item__item_index", "item__run_index", "worst")
    )
    for index, run_index, score in verdicts:
        failing[index].add(run_index)
        worst[index] = min(worst.get(index, score), score)
    extra = (
        ItemResult.objects.filter(run=run, run_index__gt=0)
        .values_list("item_index")
        .annotate(n=Count("id"))
    )
    repeats = dict(extra)
    if scope is not None:  # a search or a field filter
        kept = set(scope.values_list("item_index", flat=True))
        failing = {index: runs for index, runs in failing.items() if index in kept}
    ranked = sorted(
        failing, key=lambda i: (-len(failing[i]) / (1 + repeats.get(i, 0)), worst[i], i)
    )
    number, offset = clamp(page, len(ranked), per_page)
    return ItemsPage(
        rows=item_groups(run, ranked[offset : offset + per_page]),
        number=number,
        per_page=per_page,
        total=len(ranked),
    )


def item_groups(run: Run, indexes: list[int]) -> list[ItemRow]:
    """The rows of these items (in this order), each with all its repeats: two queries."""
    loaded = list(
        ItemResult.objects.filter(run=run, item_index__in=indexes)
        .only(*ROW_FIELDS)
        .order_by("item_index", "run_index")
    )
    scores = _scores_of([item.id for item in loaded])
    names, marks = run.evaluator_names, pass_marks(run)
    grouped: dict[int, list[ItemRow]] = defaultdict(list)
    for item in loaded:
        grouped[item.item_index].append(_item_row(item, scores.get(item.id, {}), names, marks))
    rows: list[ItemRow] = []
    for index in indexes:
        repeats = grouped.get(index)
        if not repeats:
            continue
        if len(repeats) == 1:  # repeated runs of `--repeat-flaky` repeat only some items
            rows.append(repeats[0])
            continue
        shown = min(repeats, key=badness)
        rows.append(
            ItemGroup(
                **{name: getattr(shown, name) for name in ItemRow.__dataclass_fields__},
                passes=sum(1 for r in repeats if repeat_verdict(r).passed),
            )
        )
        rows[-1].repetitions = repeats
        rows[-1].summary = [
            _repeated_scores(name, [r.scores[n] for r in repeats], marks.get(name))
            for n, name in enumerate(names)
        ]
    return rows


def _repeated_scores(name: str, cells: list[dict[str, Any]], mark: float | None) -> dict[str, Any]:
    judged = [c for c in cells if Verdict(c.get("verdict") or "none").passed is not None]
    values = [c["score"] for c in judged]
    mean = sum(values) / len(values) if values else None
    stddev = (
        math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) if mean is not None else None
    )
    passes = sum(1 for c in judged if Verdict(c["verdict"]).passed)  # borderline ones pass
    return {
        "name": name,
        "mean": mean,
        "stddev": stddev,
        "passes": passes,
        "k": len(cells),
        "passAtK": passes > 0,
        "verdict": "error" if mean is None and cells else score_verdict(mean, mark),
    }


# The item panel -----------------------------------------------------------------------------


@dataclass
class RepeatTab:
    id: int
    number: int  # 1-based, as `?repeat=N` says
    outcome: str
    verdict: str
    current: bool = False


@dataclass
class RepeatDiff:
    """A passing and a failing repeat side by side: each evaluator's scores and reasons, and
    the word diff from the passing output to the failing one."""

    passing: RepeatTab
    failing: RepeatTab
    evaluators: list[dict[str, Any]]
    output: list[tuple[str, str]]


@dataclass
class Repeats:
    tabs: list[RepeatTab]
    current: RepeatTab
    passes: int
    diff: RepeatDiff | None = field(default=None)

    @property
    def k(self) -> int:
        return len(self.tabs)

    @property
    def passes_verdict(self) -> str:
        return _passes_verdict(self.passes, self.k)

    @property
    def label(self) -> str:
        """ "repeat 2 of 3 · failed"."""
        return f"repeat {self.current.number} of {self.k} · {self.current.outcome}"


def item_repeats(run: Run, item: ItemResult, asked: str | None) -> Repeats | None:
    """The repeats of `item`'s item, the one to show (`asked`: `?repeat=N`; else the repeat the
    URL names, and for the first repeat's URL the worst), None when it ran once.

    Two queries (the repeats' rows, their evaluations with whole reasons), and one for the
    output of the repeat the shown one is compared with.
    """
    # Unsaved rows of the narrow columns: a repeat's input and output are never read here.
    loaded = [
        ItemResult(**values)
        for values in ItemResult.objects.filter(run=run, item_index=item.item_index)
        .order_by("run_index")
        .values(*LIGHT_FIELDS)
    ]
    if len(loaded) < 2:
        return None
    evaluations = Evaluation.objects.filter(item_id__in=[r.id for r in loaded]).values_list(
        "item_id", "evaluator", "score", "status", "cached", "reason", "error"
    )
    scores: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    for item_id, name, score, status, cached, reason, error in evaluations:
        scores[item_id][name] = {
            "score": score,
            "status": status,
            "cached": cached,
            "reason": reason or "",
            "error": error or "",
        }
    names, marks = run.evaluator_names, pass_marks(run)
    rows = [_item_row(r, scores.get(r.id, {}), names, marks) for r in loaded]
    tabs = [
        RepeatTab(id=row.id, number=n, outcome=outcome(row), verdict=repeat_verdict(row))
        for n, row in enumerate(rows, start=1)
    ]
    number = int(asked) if (asked or "").isdigit() else 0
    if 1 <= number <= len(tabs):
        shown = number - 1
    elif item.run_index > 0:
        shown = next(n for n, row in enumerate(rows) if row.id == item.id)
    else:
        shown = rows.index(min(rows, key=badness))
    tabs[shown].current = True
    repeats = Repeats(
        tabs=tabs,
        current=tabs[shown],
        passes=sum(1 for row in rows if repeat_verdict(row).passed),
    )
    repeats.diff = _repeat_diff(rows, tabs, shown)
    return repeats


def item_neighbours(run: Run, item: ItemResult) -> tuple[int | None, int | None]:
    """The numbers of the items just before and after this one: j and k step from item to
    item (each opening on its worst repeat), not from repeat to repeat."""
    firsts = ItemResult.objects.filter(run=run, run_index=0)
    before = firsts.filter(item_index__lt=item.item_index).order_by("-item_index")
    after = firsts.filter(item_index__gt=item.item_index).order_by("item_index")
    found = [q.values_list("item_index", flat=True).first() for q in (before, after)]
    previous, following = (None if index is None else index + 1 for index in found)
    return previous, following


def _repeat_diff(rows: list[ItemRow], tabs: list[RepeatTab], shown: int) -> RepeatDiff | None:
    """The shown repeat against the best passing one (when it failed) or the worst failing
    one (when it passed); None when every repeat passed or none did."""
    ranked = sorted(range(len(rows)), key=lambda n: badness(rows[n]))
    passing = [n for n in ranked if repeat_verdict(rows[n]).passed]
    failing = [n for n in ranked if not repeat_verdict(rows[n]).passed]
    if not passing or not failing:
        return None
    if repeat_verdict(rows[shown]).passed:
        good, bad = shown, failing[0]
    else:
        # The best passing repeat; of equals, the first.
        good, bad = max(passing, key=lambda n: badness(rows[n])[:3]), shown
    outputs = dict(
        ItemResult.objects.filter(id__in=[rows[good].id, rows[bad].id]).values_list("id", "output")
    )
    evaluators = [
        {"name": cell_good["name"], "cells": [cell_good, cell_bad]}
        for cell_good, cell_bad in zip(rows[good].scores, rows[bad].scores, strict=True)
    ]
    # Evaluators whose verdict differs first: they are why one repeat failed.
    evaluators.sort(key=lambda e: e["cells"][0]["verdict"] == e["cells"][1]["verdict"])
    failed_output = rows[bad].error or output_text(outputs.get(rows[bad].id))
    return RepeatDiff(
        passing=tabs[good],
        failing=tabs[bad],
        evaluators=evaluators,
        output=word_diff(output_text(outputs.get(rows[good].id)), failed_output),
    )
