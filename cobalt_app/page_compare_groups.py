"""Compare grouped by a dataset field or metadata key (`category`, `metadata.tier`): which
category regressed?

Per group (a value of the key in the baseline's items): each run's items, errors and pass
rate per evaluator, as the run page's groups count them (`page_triage.group_table`, the one
verdict rule; counted from the run's score table by `group_counts` when it holds every item
row of the run, the same numbers without reading every evaluation), and per other run and
evaluator the change and the paired test the compare page runs over all items
(`cobalt.significance.paired_values` on the runs' score tables), run again over the group's
items when it has at least `MIN_PAIRS` of them scored in both.

A key's value is the baseline's: a pair is in the group its item is in, in A. The compare
table's rows are filtered to one group by the same positions (`group_positions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cobalt import significance
from cobalt.significance import IMPROVED, REGRESSED, format_p
from cobalt_app import group_counts, score_tables
from cobalt_app.models import Run
from cobalt_app.page_triage import MAX_GROUPS, GroupTable, ListState, run_groups
from cobalt_app.score_tables import Pairing, ScoreTable

# A group's paired test needs this many items scored in both runs: below it, one or two
# items decide the p-value, and the page says "too few items".
MIN_PAIRS = 10
NOT_IN_A = group_counts.NOT_FOUND  # a position's code when no item of A has that key


@dataclass
class GroupRow:
    """One value of the key: per run (A first) its items and errors; per evaluator, A's pass
    rate then each other run's (`cells`: rate, delta, verdict, p, pairs, few)."""

    value: str | None
    items: list[int]
    errors: list[int]
    rates: list[dict[str, Any]]  # per evaluator: {"name", "a", "others": [cell per run]}
    regressed: list[str] = field(default_factory=list)  # "tone in B (100% → 0%, p < 0.001)"
    improved: list[str] = field(default_factory=list)

    @property
    def more_errors(self) -> bool:
        return any(n > self.errors[0] for n in self.errors[1:])


@dataclass
class CompareGroups:
    key: str
    labels: list[str]  # the other runs' labels: ["B"] or ["B1", "B2", …]
    evaluators: list[str]
    rows: list[GroupRow]
    more: int  # values not shown (only the MAX_GROUPS largest in A are)
    min_pairs: int = MIN_PAIRS

    @property
    def regressed(self) -> list[GroupRow]:
        return [row for row in self.rows if row.regressed]


def compare_groups(
    a: Run, others: list[Run], pairings: list[Pairing], key: str, *, alpha: float
) -> CompareGroups:
    """The compare of `a` against `others` (`pairings`: A's score table joined with each),
    grouped by `key`'s value in A's items."""
    own = [pairings[0].a, *(pairing.b for pairing in pairings)]
    tables = [_run_groups(run, key, table) for run, table in zip([a, *others], own, strict=True)]
    names = list(dict.fromkeys(name for table in tables for name in table.evaluators))
    labels = ["B"] if len(others) == 1 else [f"B{n + 1}" for n in range(len(others))]
    rows_of = [{row.value: row for row in table.rows} for table in tables]
    values = [row.value for row in tables[0].rows]
    values += [v for table in tables[1:] for v in (r.value for r in table.rows) if v not in values]
    values = values[:MAX_GROUPS]
    index, codes = group_positions(a, key, pairings[0].a)
    tests = [
        _group_tests(a, run, pairing, codes, index, values, names, key, alpha)
        for run, pairing in zip(others, pairings, strict=True)
    ]
    rows = []
    for value in values:
        found = [by.get(value) for by in rows_of]
        rows.append(_row(value, found, names, labels, [t.get(value, {}) for t in tests]))
    return CompareGroups(key=key, labels=labels, evaluators=names, rows=rows, more=tables[0].more)


def _run_groups(run: Run, key: str, table: ScoreTable) -> GroupTable:
    """The run's groups by `key` with their rates: counted from its score table
    (`group_counts`), or by `page_triage.group_table` for a run with repetitions."""
    found = group_counts.counted(run, key, table)
    return found if found is not None else run_groups(run, key, ListState(), None)


def _row(
    value: str | None,
    found: list[Any],
    names: list[str],
    labels: list[str],
    tests: list[dict[str, dict[str, Any]]],
) -> GroupRow:
    """One value's row from each run's group (`page_triage.GroupRow`, None where the run has
    no such group) and each other run's tests of it per evaluator."""
    row = GroupRow(
        value=value,
        items=[group.items if group else 0 for group in found],
        errors=[group.broken if group else 0 for group in found],
        rates=[],
    )
    for name in names:
        rates = [_rate(group, name) for group in found]
        cells = []
        for label, rate, test in zip(labels, rates[1:], tests, strict=True):
            got = test.get(name) or {}
            cell = {
                "rate": rate,
                "delta": None if rate is None or rates[0] is None else rate - rates[0],
                "verdict": got.get("verdict"),
                "p": format_p(got.get("pValue")),
                "pairs": got.get("n", 0),
                "few": got.get("n", 0) < MIN_PAIRS,
            }
            cells.append(cell)
            if cell["verdict"] in (IMPROVED, REGRESSED):
                shown = f"{name} in {label} ({_share(rates[0])} → {_share(rate)}, {cell['p']})"
                (row.regressed if cell["verdict"] == REGRESSED else row.improved).append(shown)
        row.rates.append({"name": name, "a": rates[0], "others": cells})
    return row


def _rate(group: Any, name: str) -> float | None:
    if group is None:
        return None
    return next((r["rate"] for r in group.rates if r["name"] == name), None)


def _share(rate: float | None) -> str:
    return "—" if rate is None else f"{rate:.0%}"


def _group_tests(
    a: Run,
    b: Run,
    pairing: Pairing,
    codes: np.ndarray,
    index: dict[str | None, int],
    values: list[str | None],
    names: list[str],
    key: str,
    alpha: float,
) -> dict[str | None, dict[str, dict[str, Any]]]:
    """Per value and evaluator, the paired test of B against A over the group's keys scored
    in both (its verdict "too few items" below `MIN_PAIRS`); worked out once per process for
    finished runs, as the compare's own tests are."""

    def tests() -> dict[str | None, dict[str, dict[str, Any]]]:
        at = codes[pairing.at_a]
        found: dict[str | None, dict[str, dict[str, Any]]] = {value: {} for value in values}
        for name in names:
            before, after = pairing.scores(name)
            both = ~np.isnan(before) & ~np.isnan(after)
            for value in values:
                chosen = both & (at == index.get(value, NOT_IN_A - 1))
                count = int(chosen.sum())
                if count < MIN_PAIRS:
                    found[value][name] = {"n": count, "verdict": "too few items", "pValue": None}
                    continue
                found[value][name] = significance.paired_values(
                    before[chosen],
                    after[chosen],
                    only_a=(0, []),
                    only_b=(0, []),
                    alpha=alpha,
                    interval=False,
                )
        return found

    what = ("group tests", key, tuple(values), tuple(names), alpha)
    return score_tables.remembered(a, b, what, tests)


def group_positions(
    run: Run, key: str, table: ScoreTable
) -> tuple[dict[str | None, int], np.ndarray]:
    """Each value of `key` in the run's items with its code, and the code of each position of
    the run's score table (`NOT_IN_A` where no first repetition of its key was read):
    `group_counts.positions`, kept a few minutes for a finished run."""
    found = group_counts.positions(run, key, table)
    return found.index, found.codes


def within_group(run: Run, key: str, value: str, table: ScoreTable) -> np.ndarray:
    """Whether each position of the run's score table is an item whose `key` is `value`."""
    index, codes = group_positions(run, key, table)
    return codes == index.get(value, NOT_IN_A - 1)
