"""The compare page's table of every matched item: a baseline against one or more runs, each
row one of the baseline's keys with its change class in every other run.

The change classes and the sort are worked out as arrays over the runs' score tables
(`score_tables`, stored at finalisation), per run against the baseline; the filter and the
sort apply to one chosen run's column (`over`: the first B unless asked) or to any of them
("changed in any": a key is in the table when its class in some run is the one asked for,
and sorted by its largest fall or rise over all the runs). Only the shown page becomes rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Min

from cobalt.verdict import score_verdict
from cobalt_app import page_compare_groups, score_tables
from cobalt_app.models import ItemResult, Run
from cobalt_app.page_items import Paging
from cobalt_app.score_tables import Pairing, ScoreTable

CHANGES = ("regressed", "improved", "unchanged")
CHANGED = "changed"  # regressed or improved: any change of direction
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
    "missing": "not in this run",
}
FILTERS = (*CHANGES, CHANGED, *KINDS)
PAIR_SORTS = ("delta", "-delta", "key")
ANY = "any"  # `over`: the filter and sort apply to every other run's column
EPSILON = 1e-12


@dataclass
class PairRow:
    """One key of the baseline: each evaluator's (repetition-averaged) A, B and Δ (B empty,
    its class "missing", when the first B has no such key); with more runs, `others` holds
    each further run's class, scores and Δ for the key (None where it has no such key)."""

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
    over: str = ""  # the column the filter and sort apply to: "" (B), "2"… or ANY
    group: tuple[str, str] | None = None  # (key, value): only that group's keys

    @property
    def columns(self) -> int:
        return 3 * len(self.evaluators) + 3 + len(self.more) * (1 + len(self.evaluators))

    @property
    def kinds(self) -> list[tuple[str, str, int]]:
        """(class, its label, how many pairs) for the filter."""
        return [(kind, KIND_LABELS[kind], self.counts.get(kind, 0)) for kind in KINDS]

    @property
    def over_choices(self) -> list[tuple[str, str]]:
        """(value, label) of each column the filter and sort can apply to (with more runs)."""
        if not self.more:
            return []
        runs = [("", "B1")] + [(str(n + 2), f"B{n + 2}") for n in range(len(self.more))]
        return [*runs, (ANY, "any of them")]

    @property
    def over_label(self) -> str:
        return dict(self.over_choices).get(self.over, "B1")

    @property
    def summary(self) -> str:
        if not self.total:
            return "No matched items"
        return f"Items {self.start:,}–{self.end:,} of {self.total:,}"


def column_of(over: str, others: int) -> int | None:
    """The index among the other runs that `over` names (0, the first B, by default); None
    for ANY."""
    if over == ANY:
        return None if others > 1 else 0
    return int(over) - 1 if over.isdigit() and 1 <= int(over) <= others else 0


def pair_table(
    a: Run,
    others: list[Run],
    pairings: list[Pairing],
    names: list[str],
    marks: dict[str, float],
    *,
    change: str = "",
    sort: str = "delta",
    over: str = "",
    group: tuple[str, str] | None = None,
    page: int = 1,
    per_page: int = 50,
) -> PairTable:
    """Every key of A scored (or failed) in A and in the run the filter applies to, A
    against each other run on the `names` evaluators.

    An item that errored or timed out in one run only counts as regressed (in B) or improved
    (in A); otherwise it regressed when an evaluator's score fell, improved when one rose and
    none fell. Its class says more (`_PairArrays`). `pairings`: A's score table joined with
    each other run's (`score_tables.join`). `group`: (key, value), only the keys whose item
    in A has that value (`page_compare_groups`)."""
    base = pairings[0].a
    column = column_of(over, len(others))
    counts, order = _order(a, others, pairings, names, change, sort, column, group)
    total = len(order)
    number = min(max(1, page), max(1, math.ceil(total / per_page)))
    shown = order[(number - 1) * per_page : number * per_page].tolist()
    rows = _rows(base, shown, pairings, names, marks, others)
    _link_items(rows, a, others)
    over = "" if column == 0 else ANY if column is None else str(column + 1)
    return PairTable(
        number=number,
        per_page=per_page,
        total=total,
        rows=rows,
        evaluators=names,
        counts=counts,
        more=others[1:],
        over=over,
        group=group,
    )


def _order(
    a: Run,
    others: list[Run],
    pairings: list[Pairing],
    names: list[str],
    change: str,
    sort: str,
    column: int | None,
    group: tuple[str, str] | None = None,
) -> tuple[dict[str, int], Any]:
    """How many keys each change and class has (in the chosen column, or in any; of the
    `group` only, when given), and the baseline positions of the keys shown in their order:
    classifying and sorting every pair takes ~90 ms per run at 200,000 items, so a finished
    comparison's is worked out once per filter and sort."""
    chosen = pairings if column is None else [pairings[column]]
    runs = others if column is None else [others[column]]

    def order() -> tuple[dict[str, int], Any]:
        within = None
        if group:
            within = page_compare_groups.within_group(a, *group, pairings[0].a)
        return _ordered(len(pairings[0].a), chosen, names, change, sort, within)

    runs_seen = tuple((r.id, r.finished_at) for r in runs)
    what = ("pair order", tuple(names), change, sort, runs_seen, group)
    if any(run.status in score_tables.UNFINISHED or run.finished_at is None for run in runs):
        return order()
    return score_tables.remembered(a, runs[0], what, order)


def _ordered(
    size: int,
    pairings: list[Pairing],
    names: list[str],
    change: str,
    sort: str,
    within: Any = None,
) -> tuple[dict[str, int], Any]:
    """`_order` over `pairings` (one per run considered): with several, each pair's class is
    put at its baseline position (-1 where that run lacks the key); with one, its pairs are
    used as they are (no baseline-sized copies: ~20% faster). `within`: whether each baseline
    position is kept (a group), or None for all."""
    import numpy as np

    if len(pairings) == 1:
        pairing = pairings[0]
        pairs = _PairArrays.of(pairing, names)
        at = pairing.at_a[pairs.keep]
        kinds, changes, worst, best = (
            column[np.newaxis] for column in (pairs.kinds, pairs.changes, pairs.worst, pairs.best)
        )
    else:
        at = np.arange(size)
        shape = (len(pairings), size)
        kinds = np.full(shape, -1, dtype=np.int8)
        changes = np.full(shape, -1, dtype=np.int8)
        worst, best = np.full(shape, np.inf), np.full(shape, -np.inf)
        for k, pairing in enumerate(pairings):
            pairs = _PairArrays.of(pairing, names)
            found = pairing.at_a[pairs.keep]
            kinds[k, found], changes[k, found] = pairs.kinds, pairs.changes
            worst[k, found], best[k, found] = pairs.worst, pairs.best
    if within is not None:
        kept = within[at]
        at, kinds, changes = at[kept], kinds[:, kept], changes[:, kept]
        worst, best = worst[:, kept], best[:, kept]
    moved = (changes == 0) | (changes == 1)
    counts = {name: int((changes == i).any(axis=0).sum()) for i, name in enumerate(CHANGES)}
    counts[CHANGED] = int(moved.any(axis=0).sum())
    counts |= {name: int((kinds == i).any(axis=0).sum()) for i, name in enumerate(KINDS)}
    if change in CHANGES:
        wanted = changes == CHANGES.index(change)
    elif change == CHANGED:
        wanted = moved
    elif change in KINDS:
        wanted = kinds == KINDS.index(change)
    else:
        wanted = kinds >= 0
    selected = np.flatnonzero(wanted.any(axis=0))
    lowest, highest = worst.min(axis=0)[selected], best.max(axis=0)[selected]
    if sort == "delta":
        selected = selected[_two_key_order(lowest, highest)]
    elif sort == "-delta":
        selected = selected[_two_key_order(-highest, -lowest)]
    return counts, at[selected].astype(np.int32)


@dataclass
class _PairArrays:
    """The pairs of two runs as arrays: per evaluator (rows) and pair (columns) the scores
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


def _cells(before: Any, after: Any, deltas: Any, noise: Any, names: list[str], marks) -> list:
    cells = []
    for n, name in enumerate(names):
        score_a, score_b = _score(before[n]), _score(after[n])
        delta = deltas[n]
        cells.append(
            {
                "name": name,
                "a": score_a,
                "b": score_b,
                "delta": None if math.isnan(delta) else float(delta),
                "noise": bool(noise[n]) and abs(delta) > EPSILON,
                "verdictA": score_verdict(score_a, marks.get(name)),
                "verdictB": score_verdict(score_b, marks.get(name)),
            }
        )
    return cells


def _column(
    pairing: Pairing, positions: list[int], names: list[str], marks: dict[str, float], run: Run
) -> dict[int, dict[str, Any]]:
    """Each shown baseline position's class, change, status, scores and Δ in one run against
    the baseline (absent where that run has no such key): only the shown rows are classified."""
    import numpy as np

    wanted = np.array(positions, dtype=int)
    found = np.minimum(np.searchsorted(pairing.at_a, wanted), max(pairing.matched - 1, 0))
    matched = found[pairing.at_a[found] == wanted] if pairing.matched else found[:0]
    pairs = _PairArrays.of(pairing, names, subset=matched)
    statuses = ItemResult.Status.values
    cells = {}
    for j, at in enumerate(pairs.keep.tolist()):
        kind = KINDS[int(pairs.kinds[j])]
        cells[int(pairing.at_a[at])] = {
            "run": run.id,
            "kind": kind,
            "kindLabel": KIND_LABELS[kind],
            "change": CHANGES[int(pairs.changes[j])],
            "status": statuses[int(pairing.b.status[pairing.at_b[at]])],
            "scores": _cells(
                pairs.before[:, j],
                pairs.after[:, j],
                pairs.deltas[:, j],
                pairs.noise[:, j],
                names,
                marks,
            ),  # fmt: skip
            "item": None,
        }
    return cells


def _rows(
    base: ScoreTable,
    positions: list[int],
    pairings: list[Pairing],
    names: list[str],
    marks: dict[str, float],
    others: list[Run],
) -> list[PairRow]:
    import numpy as np

    columns = [
        _column(pairing, positions, names, marks, run)
        for pairing, run in zip(pairings, others, strict=True)
    ]
    statuses = ItemResult.Status.values
    rows = []
    for at in positions:
        first = columns[0].get(at)
        if first is None:  # the first B lacks the key: A's scores alone
            before = np.array([base.column(name)[at] for name in names], dtype=float)
            nothing = np.full(len(names), np.nan)
            scores = _cells(before, nothing, nothing, np.zeros(len(names)), names, marks)
            first = {"scores": scores, "status": "", "change": "", "kind": "missing"}
        rows.append(
            PairRow(
                key=base.key(at),
                scores=first["scores"],
                status_a=statuses[int(base.status[at])],
                status_b=first["status"],
                change=first["change"],
                kind=first["kind"],
                at=at,
                others=[column.get(at) for column in columns[1:]],
            )
        )
    return rows


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
    a: Run,
    others: list[Run],
    key: str,
    *,
    evaluator: str = "",
    change: str = "",
    sort: str = "delta",
    over: str = "",
    group: tuple[str, str] | None = None,
) -> tuple[str | None, str | None]:
    """The keys before and after `key` in the compare table's filter, group and sort (for
    j/k in the side by side); (None, None) when the key is not in it."""
    import numpy as np

    base = score_tables.kept(a)
    pairings = [score_tables.join(base, score_tables.kept(run)) for run in others]
    names = (
        [evaluator]
        if evaluator
        else list(dict.fromkeys([*a.evaluator_names, *others[0].evaluator_names]))
    )
    wanted = key.encode()
    position = int(np.searchsorted(base.keys, wanted))
    if position == len(base.keys) or base.keys[position] != wanted:
        return None, None
    column = column_of(over, len(others))
    _, order = _order(a, others, pairings, names, change, sort, column, group)
    found = np.flatnonzero(order == position)
    if not len(found):
        return None, None
    n = int(found[0])
    before = base.key(int(order[n - 1])) if n > 0 else None
    after = base.key(int(order[n + 1])) if n + 1 < len(order) else None
    return before, after
