"""A finished run's failing verdicts ranked once, when it is finalised, in numpy.

`score_tables.judged_failures` ranks them in SQL: every failing verdict grouped by item, then
sorted (the most failing evaluators first, then the worst score, then the item). Stored at
finalisation for every evaluator and for each one (`score_tables.store`, `run_figures.store`),
that was four such sorts over a run whose items all failed, and SQLite held them in its
sorters: the RSS of a 1,000,000-item `cobalt run` rose from 187 to 313 MB while they ran
(issue 41). Here the run's verdicts are read in chunks into arrays (18 bytes a failing
verdict) and ranked with numpy, once for all the orders; the orders and counts are the same
as `judged_failures` and `failing_verdicts` give (`tests/test_run_memory.py` checks them).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from django.db import connection

from cobalt import verdict
from cobalt_app.models import Evaluation, Run

logger = logging.getLogger(__name__)

CHUNK = 2000
VERDICTS_SQL = "SELECT item_id, evaluator, score, status FROM {evaluation} WHERE run_id = %s"


@dataclass(frozen=True)
class FailingRanks:
    """Item ids with a failing verdict, ranked as `judged_failures`: of any evaluator
    (`order`) and of each of the run's evaluators (`by_evaluator`)."""

    order: np.ndarray
    by_evaluator: dict[str, np.ndarray]

    def counts(self) -> dict[str, int]:
        """Items with a failing verdict, of any evaluator ("") and of each (what
        `score_tables.failing_verdicts(run, name).count()` gives)."""
        return {"": len(self.order), **{name: len(ids) for name, ids in self.by_evaluator.items()}}


def of_finished(run_id: str) -> FailingRanks | None:
    """`rank` of a run being finalised; None (logged) when it cannot be read: the figures
    are then ranked in SQL as before."""
    try:
        return rank(Run.objects.get(id=run_id))
    except Exception:  # noqa: BLE001 - the finalisation stands
        logger.exception("could not rank the failing verdicts of run %s", run_id)
        return None


def rank(run: Run) -> FailingRanks:
    """The run's failing verdicts (`score_tables.failing_verdicts`: an evaluation error, no
    score, or a score below its evaluator's pass mark), ranked."""
    marks = verdict.pass_marks((run.config or {}).get("evaluators", []))
    names = list(dict.fromkeys([*run.evaluator_names, *marks]))
    ids, which, worst = _failing_verdicts(run.id, names, marks)
    by_evaluator = {}
    for n, name in enumerate(names):
        if name in run.evaluator_names:
            its = which == n
            # An item has one verdict of each evaluator (unique in the table): no grouping.
            by_evaluator[name] = _by_score(*((ids, worst) if its.all() else (ids[its], worst[its])))
    # The evaluators with a failing verdict, in order: counted, not `np.unique`, which
    # imports numpy.ma (~15 ms of a `cobalt run`'s end) to test for a masked array.
    failed = np.flatnonzero(np.bincount(which)).tolist()
    alone = names[failed[0]] if len(failed) == 1 and failed[0] < len(names) else None
    order = by_evaluator[alone] if alone in by_evaluator else _ranked(ids, worst)
    return FailingRanks(order=order, by_evaluator=by_evaluator)


def _failing_verdicts(
    run_id: str, names: list[str], marks: dict[str, float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(item id, evaluator's position in `names`, score or -1 without one) of each failing
    verdict, read `CHUNK` rows at a time; evaluators not in `names` get positions after."""
    position = {name: n for n, name in enumerate(names)}
    mark_of = [marks.get(name, -np.inf) for name in names]
    kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    with connection.cursor() as cursor:
        cursor.execute(VERDICTS_SQL.format(evaluation=Evaluation._meta.db_table), [run_id])
        while chunk := cursor.fetchmany(CHUNK):
            n = len(chunk)
            for _, name, _, _ in chunk:
                if name not in position:  # an evaluator no longer configured: no pass mark
                    position[name] = len(position)
                    mark_of.append(-np.inf)
            ids = np.fromiter((row[0] for row in chunk), np.int64, n)
            which = np.fromiter((position[row[1]] for row in chunk), np.int16, n)
            scores = np.fromiter((np.nan if row[2] is None else row[2] for row in chunk), float, n)
            ok = np.fromiter((row[3] == Evaluation.Status.OK for row in chunk), bool, n)
            unscored = np.isnan(scores)
            with np.errstate(invalid="ignore"):
                failing = ~ok | unscored | (scores < np.asarray(mark_of)[which])
            kept.append((ids[failing], which[failing], np.where(unscored, -1.0, scores)[failing]))
    if not kept:
        return np.array([], np.int64), np.array([], np.int16), np.array([], float)
    columns = [[chunk[c] for chunk in kept] for c in range(3)]
    kept.clear()
    joined = []
    while columns:  # one column at a time: its chunks let go as it is joined
        joined.append(np.concatenate(columns.pop(0)))
    return joined[0], joined[1], joined[2]


def _by_score(ids: np.ndarray, worst: np.ndarray) -> np.ndarray:
    """`_ranked` of verdicts of distinct items: the lowest score first, then the id."""
    return ids[np.lexsort((ids, worst))].astype("<i8", copy=False)


def _ranked(ids: np.ndarray, worst: np.ndarray) -> np.ndarray:
    """The distinct item ids of these verdicts: the most verdicts first, then the lowest
    score, then the id (as `judged_failures` orders them)."""
    if not len(ids):
        return np.array([], dtype="<i8")
    by_item = np.argsort(ids, kind="stable")
    ids = ids[by_item]
    starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
    items = ids[starts]
    del ids
    lowest = np.minimum.reduceat(worst[by_item], starts)
    del by_item
    most_first = -np.diff(np.append(starts, len(worst)))
    return items[np.lexsort((items, lowest, most_first))].astype("<i8", copy=False)
