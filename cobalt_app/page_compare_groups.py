"""Compare grouped by a dataset field or metadata key (`category`, `metadata.tier`): which
category regressed?

Per group (a value of the key in the baseline's items): each run's items, errors and pass
rate per evaluator, as the run page's groups count them (`page_triage.group_table`, the one
verdict rule), and per other run and evaluator the change and the paired test the compare
page runs over all items (`cobalt.significance.paired_values` on the runs' score tables),
run again over the group's items when it has at least `MIN_PAIRS` of them scored in both.

A key's value is the baseline's: a pair is in the group its item is in, in A. The compare
table's rows are filtered to one group by the same positions (`group_positions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cobalt import significance
from cobalt.significance import IMPROVED, REGRESSED, format_p
from cobalt_app import score_tables
from cobalt_app.models import ItemResult, Run
from cobalt_app.page_triage import LIST_SECONDS, MAX_GROUPS, ListState, run_groups
from cobalt_app.run_memo import RunMemo
from cobalt_app.run_search import field_value
from cobalt_app.score_tables import Pairing, ScoreTable

# A group's paired test needs this many items scored in both runs: below it, one or two
# items decide the p-value, and the page says "too few items".
MIN_PAIRS = 10
CHUNK = 2000  # item rows read at a time
NOT_IN_A = -1  # a position's code when no item of A has that key (or its value is not kept)

# Each finished baseline's group per score table position, kept for the compare's next
# visits and its filtered rows: an int32 per key (0.8 MB at 200,000 items).
_codes: RunMemo[tuple[dict[str | None, int], np.ndarray]] = RunMemo(
    entries=32, max_bytes=64 * 1024 * 1024, size=lambda kept: kept[1].nbytes, seconds=LIST_SECONDS
)


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
    everything = ListState()
    tables = [run_groups(run, key, everything, None) for run in [a, *others]]
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
    """Each value of `key` in the run's items (first repetitions) with its code, and the code
    of each position of the run's score table (`NOT_IN_A` where no item has that key). Read
    `CHUNK` rows at a time, kept for a finished run."""

    def read() -> tuple[dict[str | None, int], np.ndarray]:
        index: dict[str | None, int] = {}
        codes = np.full(len(table.keys), NOT_IN_A, dtype=np.int32)
        rows = (
            ItemResult.objects.filter(run=run, run_index=0)
            .annotate(group=field_value(key))
            .values_list("item_key", "group")
        )
        chunk: list[tuple[str, str | None]] = []
        for row in rows.iterator(chunk_size=CHUNK):
            chunk.append(row)
            if len(chunk) == CHUNK:
                _place(chunk, table.keys, codes, index)
                chunk = []
        _place(chunk, table.keys, codes, index)
        return index, codes

    return _codes.get(run, ("group positions", key), read)


def _place(
    chunk: list[tuple[str, str | None]],
    keys: np.ndarray,
    codes: np.ndarray,
    index: dict[str | None, int],
) -> None:
    if not chunk or not len(keys):
        return
    read = np.array([item_key.encode() for item_key, _ in chunk], dtype=bytes)
    at = np.minimum(np.searchsorted(keys, read), len(keys) - 1)
    found = keys[at] == read
    values = np.fromiter(
        (index.setdefault(value, len(index)) for _, value in chunk), np.int32, len(chunk)
    )
    codes[at[found]] = values[found]


def within_group(run: Run, key: str, value: str, table: ScoreTable) -> np.ndarray:
    """Whether each position of the run's score table is an item whose `key` is `value`."""
    index, codes = group_positions(run, key, table)
    return codes == index.get(value, NOT_IN_A - 1)
