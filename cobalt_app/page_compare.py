"""Reads behind the compare page: a baseline against up to five other runs — the verdict
strip (`compare_strip`), the per-evaluator summary of each pair, and every matched item with
its change class.

The summary is `selectors.compare_runs`, shared with the CLI, the API and the MCP tool; the
per-item table reuses the same join of the runs' score tables (`score_tables`, stored at
finalisation), so no request reads every verdict of the runs. The side by side of one item is
`page_compare_side`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Min

from cobalt.significance import ALPHA, IMPROVED, REGRESSED, format_p
from cobalt.verdict import score_verdict
from cobalt_app import calibration, score_tables
from cobalt_app.compare_strip import notable, verdict_strip
from cobalt_app.models import ItemResult, Run
from cobalt_app.page_items import Paging
from cobalt_app.page_selectors import pass_marks
from cobalt_app.score_tables import Pairing
from cobalt_app.selectors import compare_runs

CHANGES = ("regressed", "improved", "unchanged")
# Each pair's change class, most telling first (an index into KINDS is stored per pair).
KINDS = ("new-error", "score-down", "fixed-error", "score-up", "noise", "same", "both-errors")
KIND_LABELS = {
    "new-error": "new error",
    "score-down": "score down",
    "fixed-error": "fixed error",
    "score-up": "score up",
    "noise": "within noise",
    "same": "no change",
    "both-errors": "error in both",
}
PAIR_SORTS = ("delta", "-delta", "key")
MAX_OTHERS = 5  # runs compared with the baseline at once
EPSILON = 1e-12


@dataclass
class PairRow:
    """One item key matched in both runs: each evaluator's (repetition-averaged) A, B and Δ;
    with more runs, `others` holds each further run's class, scores and Δ for the key."""

    key: str
    scores: list[dict[str, Any]]
    status_a: str
    status_b: str
    change: str
    kind: str
    at: int  # the key's position in the baseline's score table
    item_a: int | None = None  # the item's number (as in `#17`) in A
    item_b: int | None = None
    others: list[dict[str, Any] | None] = field(default_factory=list)

    @property
    def kind_label(self) -> str:
        return KIND_LABELS[self.kind]


@dataclass
class PairTable(Paging):
    rows: list[PairRow] = field(default_factory=list)
    evaluators: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    more: list[Run] = field(default_factory=list)  # the runs after B, as further columns

    @property
    def columns(self) -> int:
        return 3 * len(self.evaluators) + 3 + len(self.more) * (1 + len(self.evaluators))

    @property
    def kinds(self) -> list[tuple[str, str, int]]:
        """(class, its label, how many pairs) for the filter."""
        return [(kind, KIND_LABELS[kind], self.counts.get(kind, 0)) for kind in KINDS]

    @property
    def summary(self) -> str:
        if not self.total:
            return "No matched items"
        start = (self.number - 1) * self.per_page + 1
        end = min(self.total, self.number * self.per_page)
        return f"Items {start:,}–{end:,} of {self.total:,}"


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
    page: int = 1,
    per_page: int = 50,
    alpha: float = ALPHA,
) -> Comparison:
    """The compare page of baseline `a` against `others` (the first is B): the strip, the
    paired tests per other run, and a page of every item matched by key in A and B (filtered
    by evaluator and by change or class, sorted by Δ or key), with the further runs' columns."""
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
    b = others[0]
    table = pair_table(
        a, b, pairings[0], shown, marks, change=change, sort=sort, page=page, per_page=per_page
    )
    table.more = others[1:]
    for run, pairing in zip(others[1:], pairings[1:], strict=True):
        _add_column(table.rows, pairing, shown, marks, run.id)
    _link_items(table.rows, a, others)
    first = versus[0]
    return Comparison(
        a=a,
        b=b,
        evaluators=first.evaluators,
        matched=first.matched,
        only_in_a=first.only_in_a,
        only_in_b=first.only_in_b,
        table=table,
        alpha=first.alpha,
        judges=calibration.compare_calibration(a, b),
        versus=versus,
        strip=verdict_strip(a, list(zip(others, diffs, strict=True))),
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


def pair_table(
    a: Run,
    b: Run,
    pairing: Pairing,
    names: list[str],
    marks: dict[str, float],
    *,
    change: str = "",
    sort: str = "delta",
    page: int = 1,
    per_page: int = 50,
) -> PairTable:
    """Every key scored (or failed) in both runs, A against B on the `names` evaluators.

    An item that errored or timed out in one run only counts as regressed (in B) or improved
    (in A); otherwise it regressed when an evaluator's score fell, improved when one rose and
    none fell. Its class says more (`_PairArrays`). The changes of every pair are classified
    and sorted as arrays over the two runs' score tables; only the shown page becomes rows.
    """
    counts, order = _order(a, b, pairing, names, change, sort)
    total = len(order)
    number = min(max(1, page), max(1, math.ceil(total / per_page)))
    shown = order[(number - 1) * per_page : number * per_page]
    pairs = _PairArrays.of(pairing, names, subset=shown)
    rows = [_pair_row(pairs, i, pairing, names, marks) for i in range(len(pairs.keep))]
    return PairTable(
        number=number, per_page=per_page, total=total, rows=rows, evaluators=names, counts=counts
    )


def _order(
    a: Run, b: Run, pairing: Pairing, names: list[str], change: str, sort: str
) -> tuple[dict[str, int], Any]:
    """How many pairs each change and class has, and the pairing's positions of the pairs
    shown (`_PairArrays.selected`) in their order: classifying and sorting every pair takes
    ~90 ms at 200,000 items, so a finished pair's is worked out once per filter and sort."""

    def order() -> tuple[dict[str, int], Any]:
        import numpy as np

        pairs = _PairArrays.of(pairing, names)
        counts = {name: int((pairs.changes == i).sum()) for i, name in enumerate(CHANGES)}
        counts |= {name: int((pairs.kinds == i).sum()) for i, name in enumerate(KINDS)}
        return counts, pairs.keep[pairs.selected(change, sort)].astype(np.int32)

    return score_tables.remembered(a, b, ("pair order", tuple(names), change, sort), order)


@dataclass
class _PairArrays:
    """The pairs of the table as arrays: per evaluator (rows) and pair (columns) the scores
    before and after, their deltas and whether each delta is within the item's own noise;
    per pair its position in the pairing (`keep`), its change (an index into CHANGES), its
    class (into KINDS), its largest fall (`worst`) and rise (`best`).

    With repetitions, a delta no larger than the item's spread over its repetitions (in
    either run) is within noise: the item moves that much against itself. A pair is "score
    down" (or "up") only when some delta beyond its noise fell (or rose), "within noise"
    when its deltas were all within it."""

    keep: Any
    before: Any
    after: Any
    deltas: Any
    noise: Any
    changes: Any
    kinds: Any
    worst: Any
    best: Any

    @classmethod
    def of(cls, pairing: Pairing, names: list[str], subset: Any = None) -> _PairArrays:
        """Over every shared key, or only the pairing's positions `subset` (a few rows)."""
        import numpy as np

        at = np.arange(pairing.matched) if subset is None else np.asarray(subset, dtype=int)
        count = len(at)
        columns = [pairing.scores(name) for name in names]
        if subset is not None:
            columns = [(c[0][at], c[1][at]) for c in columns]
        before = np.array([c[0] for c in columns], dtype=float).reshape(len(names), count)
        after = np.array([c[1] for c in columns], dtype=float).reshape(len(names), count)
        failed_a = pairing.a.failed[pairing.at_a[at]]
        failed_b = pairing.b.failed[pairing.at_b[at]]
        # A key is in the table when each run either scored it (on these evaluators) or failed it.
        present = (failed_a | (~np.isnan(before)).any(axis=0)) & (
            failed_b | (~np.isnan(after)).any(axis=0)
        )
        kept = np.flatnonzero(present)
        keep = at[kept]
        spreads = _spreads(pairing, names, at)
        if len(kept) < count:
            before, after = before[:, kept], after[:, kept]
            failed_a, failed_b = failed_a[kept], failed_b[kept]
            spreads = spreads if spreads is None else spreads[:, kept]
        deltas = after - before
        with np.errstate(invalid="ignore"):
            noise = np.abs(deltas) <= (EPSILON if spreads is None else spreads + EPSILON)
        broke = failed_b & ~failed_a
        mended = failed_a & ~failed_b
        with np.errstate(invalid="ignore"):
            falls, rises = deltas < -EPSILON, deltas > EPSILON
        fell, rose = falls.any(axis=0), rises.any(axis=0)
        regressed = broke | (~mended & fell)
        improved = ~regressed & (mended | rose)
        changes = np.where(regressed, 0, np.where(improved, 1, 2))  # index into CHANGES
        kinds = np.select(
            [
                broke,
                mended,
                failed_a & failed_b,
                (falls & ~noise).any(axis=0),
                (rises & ~noise).any(axis=0),
                fell | rose,
            ],
            [0, 2, 6, 1, 3, 4],
            default=5,
        )
        worst, best = _extremes(deltas, broke, mended)
        return cls(keep, before, after, deltas, noise, changes, kinds, worst, best)

    def selected(self, change: str, sort: str) -> Any:
        """The pairs of the `change` (or class) asked for (all without one), in the order
        asked for."""
        import numpy as np

        selected = np.arange(len(self.changes))
        if change in CHANGES:
            selected = selected[self.changes == CHANGES.index(change)]
        elif change in KINDS:
            selected = selected[self.kinds == KINDS.index(change)]
        if sort == "delta":
            selected = selected[_two_key_order(self.worst[selected], self.best[selected])]
        elif sort == "-delta":
            selected = selected[_two_key_order(-self.best[selected], -self.worst[selected])]
        return selected


def _two_key_order(first: Any, second: Any) -> Any:
    """`np.lexsort((second, first))`: positions by `first`, then `second`, then position, as
    one sort of int64 keys that pack each value's rank among its key's distinct values and
    the position: about half lexsort's time at 500,000 pairs (the compare page's first visit
    of each filter and sort). Lexsort itself when the packed keys would not fit."""
    import numpy as np

    count = len(first)
    if count < 2:
        return np.arange(count)
    rank_first, distinct_first = _dense_ranks(first)
    rank_second, distinct_second = _dense_ranks(second)
    if distinct_first * distinct_second * count >= 2**62:
        return np.lexsort((second, first))
    packed = (rank_first * distinct_second + rank_second) * count + np.arange(count)
    packed.sort()
    return packed % count


def _dense_ranks(values: Any) -> tuple[Any, int]:
    """Each value's position among the distinct values (sorted), and how many there are."""
    import numpy as np

    ordered = np.sort(values)
    distinct = ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]
    return np.searchsorted(distinct, values).astype(np.int64), len(distinct)


def _spreads(pairing: Pairing, names: list[str], at: Any) -> Any:
    """Per evaluator and shared key (at the pairing's positions `at`), the larger of its
    spreads over repetitions in A and B; None when neither run repeated an item."""
    import numpy as np

    if not pairing.repeated:
        return None
    rows = []
    for name in names:
        spread_a, spread_b = pairing.spreads(name)
        rows.append(np.fmax(spread_a[at], spread_b[at]))
    return np.array(rows, dtype=float).reshape(len(names), len(at))


def _extremes(deltas: Any, broke: Any, mended: Any) -> tuple[Any, Any]:
    """Each pair's largest fall and rise (a missing score is no change); a new error falls
    furthest, a fixed one rises furthest."""
    import numpy as np

    count = deltas.shape[1]
    if deltas.shape[0] and count:
        with np.errstate(invalid="ignore"):
            lowest = np.nan_to_num(np.fmin.reduce(deltas, axis=0), nan=0.0)
            highest = np.nan_to_num(np.fmax.reduce(deltas, axis=0), nan=0.0)
    else:
        lowest = highest = np.zeros(count)
    return np.where(broke, -np.inf, lowest), np.where(mended, np.inf, highest)


def _cells(pairs: _PairArrays, i: int, names: list[str], marks: dict[str, float]) -> list:
    cells = []
    for n, name in enumerate(names):
        score_a, score_b = _score(pairs.before[n, i]), _score(pairs.after[n, i])
        delta = pairs.deltas[n, i]
        cells.append(
            {
                "name": name,
                "a": score_a,
                "b": score_b,
                "delta": None if math.isnan(delta) else float(delta),
                "noise": bool(pairs.noise[n, i]) and abs(delta) > EPSILON,
                "verdictA": score_verdict(score_a, marks.get(name)),
                "verdictB": score_verdict(score_b, marks.get(name)),
            }
        )
    return cells


def _pair_row(
    pairs: _PairArrays, i: int, pairing: Pairing, names: list[str], marks: dict[str, float]
) -> PairRow:
    at = int(pairs.keep[i])
    statuses = ItemResult.Status.values
    status_a = statuses[int(pairing.a.status[pairing.at_a[at]])]
    status_b = statuses[int(pairing.b.status[pairing.at_b[at]])]
    return PairRow(
        key=pairing.key(at),
        scores=_cells(pairs, i, names, marks),
        status_a=status_a,
        status_b=status_b,
        change=CHANGES[int(pairs.changes[i])],
        kind=KINDS[int(pairs.kinds[i])],
        at=int(pairing.at_a[at]),
    )


def _add_column(
    rows: list[PairRow], pairing: Pairing, names: list[str], marks: dict[str, float], run_id: str
) -> None:
    """Each row's class, scores and Δ in one more run against the baseline (None where that
    run has no such item), found by the row's position in the baseline's table: only the
    shown rows are classified."""
    import numpy as np

    wanted = np.array([row.at for row in rows], dtype=int)
    found = np.minimum(np.searchsorted(pairing.at_a, wanted), max(pairing.matched - 1, 0))
    shared = pairing.matched > 0
    matched = found[pairing.at_a[found] == wanted] if shared else found[:0]
    pairs = _PairArrays.of(pairing, names, subset=matched)
    where = {int(pairing.at_a[m]): i for i, m in enumerate(pairs.keep.tolist())}
    statuses = ItemResult.Status.values
    for row in rows:
        j = where.get(row.at)
        if j is None:
            row.others.append(None)
            continue
        kind = KINDS[int(pairs.kinds[j])]
        status = statuses[int(pairing.b.status[pairing.at_b[pairs.keep[j]]])]
        row.others.append(
            {
                "run": run_id,
                "kind": kind,
                "kindLabel": KIND_LABELS[kind],
                "status": status,
                "scores": _cells(pairs, j, names, marks),
                "item": None,
            }
        )


def _link_items(rows: list[PairRow], a: Run, others: list[Run]) -> None:
    """Each row's item number in A and in each other run (one query for the page)."""
    if not rows:
        return
    ids = (
        ItemResult.objects.filter(
            run_id__in=[a.id, *(run.id for run in others)], item_key__in=[r.key for r in rows]
        )
        .values("run_id", "item_key")
        .annotate(first=Min("item_index"))
        .values_list("run_id", "item_key", "first")
    )
    found = {(run_id, key): index + 1 for run_id, key, index in ids}
    for row in rows:
        row.item_a = found.get((a.id, row.key))
        row.item_b = found.get((others[0].id, row.key))
        for run, cell in zip(others[1:], row.others, strict=True):
            if cell is not None:
                cell["item"] = found.get((run.id, row.key))


def _score(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def neighbours(
    a: Run, b: Run, key: str, *, evaluator: str = "", change: str = "", sort: str = "delta"
) -> tuple[str | None, str | None]:
    """The keys before and after `key` in the compare table's filter and sort (for j/k in
    the side by side); (None, None) when the key is not in it."""
    import numpy as np

    pairing = score_tables.pair(a, b)
    names = (
        [evaluator] if evaluator else list(dict.fromkeys([*a.evaluator_names, *b.evaluator_names]))
    )
    wanted = key.encode()
    position = int(np.searchsorted(pairing.a.keys, wanted))
    if position == len(pairing.a.keys) or pairing.a.keys[position] != wanted:
        return None, None
    at = int(np.searchsorted(pairing.at_a, position))
    if at == len(pairing.at_a) or pairing.at_a[at] != position:
        return None, None
    _, order = _order(a, b, pairing, names, change, sort)
    found = np.flatnonzero(order == at)
    if not len(found):
        return None, None
    n = int(found[0])
    before = pairing.key(int(order[n - 1])) if n > 0 else None
    after = pairing.key(int(order[n + 1])) if n + 1 < len(order) else None
    return before, after


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
