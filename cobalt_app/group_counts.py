"""A run's items grouped by a field, counted from its score table: the compare page's groups
(`page_compare_groups`) without reading every evaluation of the run.

`page_triage.group_table` counts a run's groups by joining each of its evaluations with its
item and reading the item's JSON: ~0.3 s of CPU per run of 50,000 items on SQLite, ten times
that at 500,000. A run's score table (`score_tables`) holds each key's score per evaluator and
status; when every item row of the run is one key of its table (no repetitions, no two items
sharing a key), a key's score is its one evaluation's and its status its one item's, so the
table holds exactly what `group_table` counts. What the count needs besides is each table
position's value of the field (`positions`), read

- from the run's search index (`run_search`, `ItemField`), when it is built and holds every
  item's value of the field: the run's item ids in key order and the ids of each value, two
  reads of integers over covering indexes;
- else from the items' JSON, in key order (or, for a run with repetitions or shared keys, by
  key, first repetitions only: the compare's tests need the positions of any run).

`counted` gives `group_table`'s rows, in its order, for a run whose table holds every item
row, and None for another (the caller counts it with `group_table`). Its rates carry each
evaluator's scored, passed and failed evaluations, not its errors (the compare page shows
the items' errors, not the evaluations').
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from django.db import connection
from django.db.models import Count, F, QuerySet
from django.db.models.functions import Collate

from cobalt_app import run_search
from cobalt_app.models import ItemField, ItemResult, Run
from cobalt_app.page_selectors import pass_marks
from cobalt_app.page_triage import LIST_SECONDS, MAX_GROUPS, GroupRow, GroupTable
from cobalt_app.run_memo import RunMemo
from cobalt_app.run_search import field_value
from cobalt_app.score_tables import STATUSES, ScoreTable
from cobalt_app.selectors import FAILED

CHUNK = 2000  # item rows read at a time
NOT_FOUND = -1  # a position's code when no first repetition of its key was read
BROKEN = np.array([STATUSES.index(status) for status in FAILED], dtype=np.int8)


@dataclass(frozen=True)
class Positions:
    """Each value of a key in a run's items with its code (`index`), and the code of each
    position of the run's score table (`codes`, int32). `single`: every item row of the run
    is one position (so the table holds every evaluation of the run, each at its item)."""

    index: dict[str | None, int]
    codes: np.ndarray
    single: bool


# Finished runs' positions per key, kept for the compare's next visits and its filtered rows:
# an int32 per key (2 MB at 500,000 items); and their counts, a few rows each.
_positions: RunMemo[Positions] = RunMemo(
    entries=32,
    max_bytes=64 * 1024 * 1024,
    size=lambda kept: kept.codes.nbytes,
    seconds=LIST_SECONDS,
)
_counts: RunMemo[GroupTable | None] = RunMemo(entries=64, seconds=LIST_SECONDS)


def positions(run: Run, key: str, table: ScoreTable) -> Positions:
    """The code of `key`'s value at each position of the run's `table`, kept a few minutes
    for a finished run."""

    def read() -> Positions:
        found = None
        if _indexed(run, key):
            found = _from_index(run, key, table)
        elif ItemResult.objects.filter(run=run).count() == len(table.keys):
            found = _in_key_order(run, key, table)
        return found or _by_key(run, key, table)

    return _positions.get(run, ("positions", key), read)


def counted(run: Run, key: str, table: ScoreTable) -> GroupTable | None:
    """`page_triage.group_table(run, key)`'s groups and rates, counted from the run's score
    table; None when it does not hold every item row of the run (repetitions, shared keys)."""

    def count() -> GroupTable | None:
        found = positions(run, key, table)
        return _count(run, key, table, found) if found.single else None

    return _counts.get(run, ("counts", key), count)


def _count(run: Run, key: str, table: ScoreTable, found: Positions) -> GroupTable:
    """Items, broken items and per evaluator scored and passing evaluations per value, the
    largest groups first (ties in the database's order of the values, as `group_table`)."""
    size = len(found.index)
    codes = found.codes
    items = np.bincount(codes, minlength=size)
    broken = np.bincount(codes[np.isin(table.status, BROKEN)], minlength=size)
    names = run.evaluator_names
    marks = pass_marks(run)
    scored, passed = {}, {}
    for name in names:
        column = table.column(name)
        has = ~np.isnan(column)
        scored[name] = np.bincount(codes[has], minlength=size)
        passed[name] = np.bincount(codes[has & (column >= marks[name])], minlength=size)
    values = list(found.index)
    rank = {value: n for n, value in enumerate(_database_order(values))}
    values.sort(key=lambda value: (-int(items[found.index[value]]), rank[value]))
    rows = []
    for value in values[:MAX_GROUPS]:
        code = found.index[value]
        rates = []
        for name in names:
            got, ok = int(scored[name][code]), int(passed[name][code])
            rate = ok / got if got else None
            rates.append(
                {"name": name, "scored": got, "passed": ok, "failed": got - ok, "rate": rate}
            )
        rows.append(GroupRow(value, int(items[code]), int(broken[code]), rates))
    more = 1 if len(values) > MAX_GROUPS else 0  # `group_table` reads one group more at most
    return GroupTable(key=key, evaluators=names, rows=rows, more=more)


def _database_order(values: list[str | None]) -> list[str | None]:
    """The values as the database orders them (`ORDER BY` a field's text: its collation, and
    NULL first on SQLite, last on PostgreSQL)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT v FROM unnest(%s::text[]) AS t(v) ORDER BY v", [values])
            return [row[0] for row in cursor.fetchall()]
    return sorted(values, key=lambda value: (value is not None, value or ""))


# Reading the positions -----------------------------------------------------------------------


def _indexed(run: Run, key: str) -> bool:
    """Whether the run's search index holds every item's value of `key`."""
    index = run_search.index_of(run)
    return index is not None and index.keys.get(key) is False


def _in_table_order(rows: QuerySet) -> QuerySet:
    """The run's item rows in its score table's order: by key as UTF-8 bytes (SQLite's own
    order of text; PostgreSQL's "C" collation)."""
    if connection.vendor == "postgresql":
        return rows.order_by(Collate(F("item_key"), "C"))
    return rows.order_by("item_key")


def _integers(rows: QuerySet) -> np.ndarray:
    """The one integer column of `rows` as an array, read from the driver's own cursor: at
    500,000 rows ~140 ms on SQLite, where iterating Django's cursor wrapper (which wraps each
    row's errors) takes twice that and a list of the ORM's rows four times."""
    sql, params = rows.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return np.fromiter(itertools.chain.from_iterable(cursor.cursor), np.int64)


def _from_index(run: Run, key: str, table: ScoreTable) -> Positions | None:
    """The positions from `ItemField`: the run's item ids in key order, and its rows' item ids
    ordered by value with each value's count in the same order. None when the run's item
    rows are not one per position."""
    ids = _integers(_in_table_order(ItemResult.objects.filter(run=run)).values_list("id"))
    if len(ids) != len(table.keys):
        return None
    fields = ItemField.objects.filter(run=run, key=key)
    counts = list(
        fields.values("value")
        .annotate(n=Count("item_id"))
        .order_by("value")
        .values_list("value", "n")
    )
    item_ids = _integers(fields.order_by("value", "item_id").values_list("item_id"))
    sizes = [n for _, n in counts]
    if sum(sizes) != len(ids) or len(item_ids) != len(ids):
        return None
    ascending = bool((ids[1:] > ids[:-1]).all())  # items written in key order: the usual case
    order = np.arange(len(ids)) if ascending else np.argsort(ids, kind="stable")
    at = np.searchsorted(ids[order], item_ids)
    at = np.minimum(at, len(ids) - 1)
    if not (ids[order][at] == item_ids).all():
        return None
    codes = np.full(len(ids), NOT_FOUND, dtype=np.int32)
    codes[order[at]] = np.repeat(np.arange(len(counts), dtype=np.int32), sizes)
    if (codes == NOT_FOUND).any():
        return None
    return Positions({value: n for n, (value, _) in enumerate(counts)}, codes, single=True)


def _in_key_order(run: Run, key: str, table: ScoreTable) -> Positions | None:
    """The positions from the items' JSON read in key order, for a run whose item rows are one
    per position; None when its rows changed meanwhile (a running run)."""
    rows = _in_table_order(ItemResult.objects.filter(run=run))
    values = rows.annotate(group=field_value(key)).values_list("group", flat=True)
    index: dict[str | None, int] = {}
    codes = np.fromiter(
        (index.setdefault(value, len(index)) for value in values.iterator(chunk_size=CHUNK)),
        np.int32,
    )
    if len(codes) != len(table.keys):
        return None
    return Positions(index, codes, single=True)


def _by_key(run: Run, key: str, table: ScoreTable) -> Positions:
    """The positions from the items' JSON, each first repetition placed by a binary search of
    its key in the table's, `CHUNK` rows at a time."""
    index: dict[str | None, int] = {}
    codes = np.full(len(table.keys), NOT_FOUND, dtype=np.int32)
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
    return Positions(index, codes, single=False)


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
