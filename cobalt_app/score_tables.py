"""Per-run score tables: what comparing two runs needs, computed once when a run is finalised.

A table holds a run's item keys (sorted, unique), each evaluator's score per key (the mean
over the item's repetitions; NaN where it has none), its spread (the highest repetition's score
less the lowest: how far the item moves on its own; kept only when some item has two scored
repetitions) and each key's status (of its first repetition). Comparing two runs then joins
two stored tables with numpy instead of reading every evaluation of both runs on every
request: at 500,000 items a side, reading and pairing the raw verdicts took
~8 s per compare; loading and joining two tables takes a fraction of it.

The table also keeps how many items the run page's failures view lists (per evaluator), which
would otherwise be counted over every verdict of the run on each visit.

`store(run_id)` is the finalisation hook (`results.run_finalise` calls it for every mode);
`load(run)` reads a stored table, or builds one for a run finalised before tables existed
(storing it, once) or still running (not stored: it is still changing).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from django.db import connection
from django.db.models import Count, Min, Q, QuerySet, Value
from django.db.models.functions import Coalesce

from cobalt import verdict
from cobalt_app import failing_ranks
from cobalt_app.failing_ranks import FailingRanks
from cobalt_app.models import Evaluation, ItemResult, Run, RunScoreTable
from cobalt_app.run_memo import RunMemo

logger = logging.getLogger(__name__)
T = TypeVar("T")

FORMAT = 2  # bump when the archive's arrays change: older tables are rebuilt on first use
STATUSES = tuple(ItemResult.Status.values)
OK = STATUSES.index(ItemResult.Status.OK)
UNFINISHED = (Run.Status.QUEUED, Run.Status.RUNNING)
# Finished runs' tables kept in this process (`kept`), up to this many bytes of arrays: three
# runs of 500,000 items take ~45 MB.
KEPT_BYTES = 200 * 1024 * 1024
# What is worked out from two finished runs' tables alone (`remembered`): the paired tests
# and the compare table's orders (an int32 per shared key: 2 MB at 500,000) of recent pairs.
REMEMBERED = 32

ITEMS_SQL = "SELECT item_key, status FROM {item} WHERE run_id = %s AND run_index = 0"
SCORES_SQL = """
SELECT e.evaluator, i.item_key, e.score
FROM {evaluation} e INNER JOIN {item} i ON i.id = e.item_id
WHERE e.run_id = %s AND e.status = %s AND e.score IS NOT NULL
"""


@dataclass(frozen=True)
class ScoreTable:
    """One run's keys (UTF-8 bytes, sorted), scores and spreads (evaluators × keys; spreads
    empty when no item was scored twice) and statuses."""

    keys: np.ndarray
    evaluators: tuple[str, ...]
    scores: np.ndarray
    status: np.ndarray
    spread: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)

    def column(self, name: str) -> np.ndarray:
        """The evaluator's score per key; all NaN when this run has no such evaluator."""
        if name in self.evaluators:
            return self.scores[self.evaluators.index(name)]
        return np.full(len(self.keys), np.nan)

    def spread_of(self, name: str) -> np.ndarray:
        """The evaluator's spread over each key's repetitions (0 for one repetition)."""
        if name in self.evaluators and self.spread.size:
            return self.spread[self.evaluators.index(name)]
        return np.zeros(len(self.keys))

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.scores.nbytes + self.status.nbytes + self.spread.nbytes

    @property
    def failed(self) -> np.ndarray:
        """Keys whose item did not finish ok (errored, timed out, cancelled, unfinished)."""
        return self.status != OK

    def key(self, position: int) -> str:
        return self.keys[position].decode()

    def key_list(self, positions: np.ndarray) -> list[str]:
        return [key.decode() for key in self.keys[positions].tolist()]

    def to_bytes(self) -> memoryview:
        """The table as an `.npz` archive: a view of the buffer it was written to (a copy of
        15 MB at a million items less, where the RSS of a run's end is highest)."""
        buffer = io.BytesIO()
        np.savez(
            buffer,
            keys=self.keys,
            evaluators=np.array(self.evaluators, dtype=str),
            scores=self.scores,
            status=self.status,
            spread=self.spread,
        )
        return buffer.getbuffer()

    @classmethod
    def from_bytes(cls, data: bytes) -> ScoreTable:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            return cls(
                keys=archive["keys"],
                evaluators=tuple(archive["evaluators"].tolist()),
                scores=archive["scores"],
                status=archive["status"],
                spread=archive["spread"],
            )


def build(run_id: str) -> ScoreTable:
    """The run's table from its item and evaluation rows (two plain-cursor reads).

    Keys are compared as UTF-8 bytes, whose order is Python's string order. (numpy drops
    trailing NUL bytes of fixed-width strings: a key ending in U+0000 would lose it.)
    Flat in the run's size (issue 41): rows are read `CHUNK` at a time into arrays, each
    score found by a binary search of the sorted keys, so a run holds its keys, a status and
    a few floats per key and evaluator, never a Python object per item or score.
    """
    item = ItemResult._meta.db_table
    keys, status = _keys_and_statuses(ITEMS_SQL.format(item=item), run_id)
    sums = _Sums(len(keys))
    sql = SCORES_SQL.format(evaluation=Evaluation._meta.db_table, item=item)
    for names, at, values in _score_chunks(sql, run_id, keys):
        sums.add(names, at, values)
    repeated = bool(sums.counts.size) and bool((sums.counts > 1).any())
    if repeated:  # a second read, only for runs with repetitions: each key's lowest and highest
        for names, at, values in _score_chunks(sql, run_id, keys):
            sums.add_extremes(names, at, values)
    return ScoreTable(
        keys=keys,
        evaluators=tuple(sums.names),
        scores=sums.means(),
        status=status,
        spread=sums.spread() if repeated else np.zeros((0,)),
    )


# Rows read at a time, through `chunked_cursor` (on PostgreSQL a server-side cursor: the
# client never holds the whole result either).
CHUNK = 2000


def _keys_and_statuses(sql: str, run_id: str) -> tuple[np.ndarray, np.ndarray]:
    """The run's item keys (UTF-8, sorted, unique) and the status of each: of its last row
    read, when two items share a key (identical items without an id)."""
    keys_read: list[np.ndarray] = []
    statuses_read: list[np.ndarray] = []
    codes = {name: code for code, name in enumerate(STATUSES)}
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, [run_id])
        while chunk := cursor.fetchmany(CHUNK):
            keys_read.append(np.array([key.encode() for key, _ in chunk], dtype=bytes))
            statuses_read.append(np.fromiter((codes[s] for _, s in chunk), np.int8, len(chunk)))
    if not keys_read:
        return np.array([], dtype="S1"), np.array([], dtype=np.int8)
    keys = np.concatenate(keys_read)
    del keys_read
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    status = np.concatenate(statuses_read)[order]
    last = np.append(keys[1:] != keys[:-1], True)  # the last of each run of equal keys
    return keys[last], status[last]


def _score_chunks(
    sql: str, run_id: str, keys: np.ndarray
) -> Iterator[tuple[list[str], np.ndarray, np.ndarray]]:
    """The run's scores, a chunk at a time: each row's evaluator, its key's position in `keys`
    and its value; rows of a key with no first repetition (nothing to pair it by) left out."""
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, [run_id, Evaluation.Status.OK])
        while chunk := cursor.fetchmany(CHUNK):
            read = np.array([key.encode() for _, key, _ in chunk], dtype=bytes)
            at = np.searchsorted(keys, read)
            found = at < len(keys)
            found[found] = keys[at[found]] == read[found]
            values = np.fromiter((score for _, _, score in chunk), np.float64, len(chunk))
            names = [name for name, _, _ in chunk]
            if not found.all():
                names = [name for name, kept in zip(names, found, strict=True) if kept]
                at, values = at[found], values[found]
            yield names, at, values


class _Sums:
    """Per evaluator (in the order first read) and key: the sum and count of its scores, and
    on a second read its lowest and highest."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.names: dict[str, int] = {}
        self.totals = np.zeros((0, size))
        self.counts = np.zeros((0, size), dtype=np.int32)
        self.lowest = self.highest = np.zeros((0, size))

    def rows(self, names: list[str]) -> np.ndarray:
        for name in dict.fromkeys(names):  # in the order first read
            if name not in self.names:
                self.names[name] = len(self.names)
                self.totals = np.vstack([self.totals, np.zeros((1, self.size))])
                self.counts = np.vstack([self.counts, np.zeros((1, self.size), np.int32)])
        return np.fromiter((self.names[n] for n in names), np.intp, len(names))

    def add(self, names: list[str], at: np.ndarray, values: np.ndarray) -> None:
        rows = self.rows(names)
        np.add.at(self.totals, (rows, at), values)
        np.add.at(self.counts, (rows, at), 1)

    def add_extremes(self, names: list[str], at: np.ndarray, values: np.ndarray) -> None:
        if not self.lowest.size:
            self.lowest = np.full(self.totals.shape, np.inf)
            self.highest = np.full(self.totals.shape, -np.inf)
        rows = self.rows(names)
        np.minimum.at(self.lowest, (rows, at), values)
        np.maximum.at(self.highest, (rows, at), values)

    def means(self) -> np.ndarray:
        """The mean score per evaluator and key (NaN where it has none), in the sums' place."""
        means, scored = self.totals, self.counts > 0
        np.divide(means, self.counts, out=means, where=scored)
        means[~scored] = np.nan
        return means

    def spread(self) -> np.ndarray:
        """Per evaluator and key, the highest repetition's score less the lowest."""
        return np.where(np.isfinite(self.lowest), self.highest - self.lowest, 0.0)


def store(run_id: str, ranks: FailingRanks | None = None) -> None:
    """Build and store the run's table; called once a run is finalised (`ranks`: its failing
    verdicts ranked already, else ranked here). A failure is logged, never raised: the
    finalisation stands and `load` builds the table when first needed."""
    try:
        run = Run.objects.get(id=run_id)
        _save(run, build(run_id), ranks or failing_ranks.rank(run))
    except Exception:
        logger.exception("could not store the score table of run %s", run_id)


def _save(run: Run, table: ScoreTable, ranks: FailingRanks) -> None:
    RunScoreTable.objects.update_or_create(
        run_id=run.id,
        defaults={
            "format": FORMAT,
            "data": table.to_bytes(),
            "failing": ranks.counts(),
            "failing_order": memoryview(ranks.order).cast("B"),  # its bytes, not a copy
        },
    )


def failing_verdicts(
    run: Run, evaluator: str = "", scope: QuerySet[ItemResult] | None = None
) -> QuerySet:
    """Per item with a failing verdict (an evaluation error, or a score below its pass mark;
    of `evaluator` only when given), its worst score (-1 for an error), worst first; of the
    run's items in `scope` only, when given.

    With a scope (what a search or a field filter leaves) the verdicts are found by item, not
    by run: SQLite otherwise reads every verdict of the run on its `run` index and keeps
    those of the scope's items (~40 ms of CPU at 100,000 items for a search that found
    1,000, five times that at 500,000; by item, ~2 ms)."""
    marks = verdict.pass_marks((run.config or {}).get("evaluators", []))
    below = below_mark(marks, [evaluator] if evaluator else list(marks))
    unscored = ~Q(status=Evaluation.Status.OK) | Q(score__isnull=True)
    if evaluator:
        unscored &= Q(evaluator=evaluator)
    verdicts = (
        Evaluation.objects.filter(run=run)
        if scope is None
        else Evaluation.objects.filter(item_id__in=scope.values("id"))
    )
    return (
        verdicts.filter(unscored | below)
        .values("item_id")
        .annotate(worst=Min(Coalesce("score", Value(-1.0))))
        .order_by("worst", "item_id")
    )


def judged_failures(
    run: Run, evaluator: str = "", scope: QuerySet[ItemResult] | None = None
) -> QuerySet:
    """Items with a failing verdict (`failing_verdicts`), the most failing evaluators first,
    then the worst score, then the item."""
    failing = failing_verdicts(run, evaluator, scope)
    return failing.annotate(failed=Count("id")).order_by("-failed", "worst", "item_id")


def failing_order(run: Run) -> list[int] | None:
    """`judged_failures` of a finished run over every evaluator, as stored when it was
    finalised: the run page's default view reads it instead of ranking every failing verdict
    on each visit. None when there is none (a running run, or a table stored before)."""
    if run.status in UNFINISHED:
        return None
    stored = (
        RunScoreTable.objects.filter(run_id=run.id)
        .exclude(failing_order=b"")
        .values_list("failing_order", flat=True)
        .first()
    )
    if stored is None:
        return None
    return np.frombuffer(bytes(stored), dtype="<i8").tolist()


def below_mark(marks: dict[str, float], names: list[str]) -> Q:
    """Evaluations of `names` whose score is below their pass mark (`cobalt.verdict`: a score
    passes at or above it), as a filter on `Evaluation` rows."""
    below = Q(pk__in=[])
    for name in names:
        below |= Q(evaluator=name, score__lt=marks[name])
    return below


def failing_count(run: Run, evaluator: str = "") -> int | None:
    """The stored count of items with a failing verdict (`failing_verdicts`; of any evaluator
    for ""), as `failing_ranks` counted them for a finished run; None when there is none."""
    if run.status in UNFINISHED:
        return None
    counts = RunScoreTable.objects.filter(run_id=run.id).values_list("failing", flat=True).first()
    return None if counts is None else counts.get(evaluator)


def load(run: Run, *, keep: bool = True) -> ScoreTable:
    """The run's table: the stored one, else built now (and stored, if the run is over and
    `keep`: a read-only caller passes False)."""
    if run.status in UNFINISHED:
        return build(run.id)
    stored = (
        RunScoreTable.objects.filter(run_id=run.id, format=FORMAT)
        .values_list("data", flat=True)
        .first()
    )
    if stored is not None:
        return ScoreTable.from_bytes(bytes(stored))
    table = build(run.id)
    if keep:
        _save(run, table, failing_ranks.rank(run))
    return table


def kept(run: Run, *, keep: bool = True) -> ScoreTable:
    """`load(run)`, kept in this process for a finished run (read-only: its arrays are shared
    by every request; see `run_memo`). Loading a stored table of 200,000 items (reading ~6 MB
    and checking it) takes ~30 ms per run and compare."""
    return _kept.get(run, "table", lambda: _read_only(load(run, keep=keep)))


def _read_only(table: ScoreTable) -> ScoreTable:
    for array in (table.keys, table.scores, table.status, table.spread):
        array.flags.writeable = False
    return table


def remembered(a: Run, b: Run, what: tuple[Any, ...], compute: Callable[[], T]) -> T:
    """`compute()`, worked out once per process for two finished runs (`what` names the
    result): it must read only the runs' tables. A copy is returned, so a caller may change
    it. Unfinished runs compute it every time."""
    return _remembered.get((a, b), what, compute)


_kept: RunMemo[ScoreTable] = RunMemo(max_bytes=KEPT_BYTES, size=lambda table: table.nbytes)
_remembered: RunMemo[Any] = RunMemo(entries=REMEMBERED, copies=True)


@dataclass(frozen=True)
class Pairing:
    """Two runs' tables joined by key: `at_a[i]` and `at_b[i]` are the positions of the i-th
    shared key (in key order); `only_a`/`only_b` the positions of keys in one run only."""

    a: ScoreTable
    b: ScoreTable
    at_a: np.ndarray
    at_b: np.ndarray
    only_a: np.ndarray
    only_b: np.ndarray

    @property
    def matched(self) -> int:
        return len(self.at_a)

    @property
    def same_keys(self) -> bool:
        return not len(self.only_a) and not len(self.only_b)

    def scores(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """The evaluator's scores of the shared keys in A and in B (NaN where unscored)."""
        if self.same_keys:  # the usual case: the columns themselves, not copies
            return self.a.column(name), self.b.column(name)
        return self.a.column(name)[self.at_a], self.b.column(name)[self.at_b]

    def spreads(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """The evaluator's spreads over repetitions of the shared keys in A and in B."""
        if self.same_keys:
            return self.a.spread_of(name), self.b.spread_of(name)
        return self.a.spread_of(name)[self.at_a], self.b.spread_of(name)[self.at_b]

    @property
    def repeated(self) -> bool:
        """Whether either run scored some item more than once (so spreads exist)."""
        return bool(self.a.spread.size or self.b.spread.size)

    def key(self, i: int) -> str:
        return self.a.key(int(self.at_a[i]))


def pair(a: Run, b: Run) -> Pairing:
    return join(kept(a), kept(b))


def join(a: ScoreTable, b: ScoreTable) -> Pairing:
    """Match two tables' sorted keys: a binary search of A's keys in B's."""
    if len(a.keys) == len(b.keys) and _same_keys(a.keys, b.keys):
        everything = np.arange(len(a.keys))
        none = np.array([], dtype=np.int64)
        return Pairing(a, b, everything, everything, none, none)
    found = np.searchsorted(b.keys, a.keys)
    clipped = np.minimum(found, max(len(b.keys) - 1, 0))
    in_b = (found < len(b.keys)) & (b.keys[clipped] == a.keys) if len(b.keys) else found < 0
    at_a = np.flatnonzero(in_b)
    at_b = clipped[in_b]
    only_b = np.setdiff1d(np.arange(len(b.keys)), at_b, assume_unique=True)
    return Pairing(a, b, at_a, at_b, np.flatnonzero(~in_b), only_b)


def _same_keys(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two key arrays are equal: as bytes when their widths are the same (a memory
    comparison, ~2 ms at 500,000 keys, where comparing them key by key takes ~40 ms)."""
    if a.dtype == b.dtype:
        return a.tobytes() == b.tobytes()
    return bool(np.array_equal(a, b))
