"""Figures of a finished run that its page would otherwise count over every verdict of the run
on each visit, stored once when the run is finalised (`results.run_finalise` calls `store`).

- The score histogram reads every evaluation of the run (ten range counts per evaluator on
  the `(run, evaluator, score)` index): ~13 ms of CPU at 50,000 items, ten times that at
  500,000, on each visit of the run page. A run finalised before this table existed has it
  counted (and stored) on its first visit; a running run has it counted on each poll.
- Each evaluator's failures view (`score_tables.judged_failures` of that evaluator) groups
  and sorts every failing verdict of the evaluator: ~65 ms of CPU at 50,000 items per visit.
  Its order is stored as ids; a page reads the ids and slices them. (The failures of every
  evaluator at once are `score_tables.failing_order`, stored with the run's score table.)

A finished run's verdicts no longer change; a resumed or re-judged run is finalised again,
which stores them again.
"""

from __future__ import annotations

import logging

import numpy as np
from django.db import connection

from cobalt import verdict
from cobalt_app import failing_ranks
from cobalt_app.failing_ranks import FailingRanks
from cobalt_app.models import Evaluation, Run, RunFigures

logger = logging.getLogger(__name__)

HISTOGRAM_BINS = 10
UNFINISHED = (Run.Status.QUEUED, Run.Status.RUNNING)


def store(run_id: str, ranks: FailingRanks | None = None) -> None:
    """Count and store the finished run's figures (`ranks`: its failing verdicts ranked
    already, else ranked here). A failure is logged, never raised: the finalisation stands
    and `histogram` counts them when first needed."""
    try:
        run = Run.objects.get(id=run_id)
        failing_at, orders = _rank_failures(run, ranks)
        _save(run, count_histogram(run.id, run.evaluator_names), failing_at, orders)
    except Exception:
        logger.exception("could not store the page figures of run %s", run_id)


def _rank_failures(run: Run, ranks: FailingRanks | None = None) -> tuple[dict, memoryview]:
    """Each evaluator's failures view in its order (`ranks`, else ranked here), one after
    another as int64 ids (their bytes, not a copy), and where each one's ids are (with the
    pass marks they were ranked with)."""
    ranks = ranks or failing_ranks.rank(run)
    orders = [ranks.by_evaluator[name] for name in run.evaluator_names]
    starts = np.cumsum([0, *(len(order) for order in orders)])
    at = {
        name: [int(start), len(order)]
        for name, start, order in zip(run.evaluator_names, starts[:-1], orders, strict=True)
    }
    flat = orders[0] if len(orders) == 1 else np.concatenate([np.array([], "<i8"), *orders])
    return {"marks": _marks(run), "at": at}, memoryview(flat).cast("B")


def _save(
    run: Run,
    histogram: dict[str, list[int]],
    failing_at: dict[str, list[int]] | None = None,
    failing_orders: bytes | memoryview = b"",
) -> None:
    """Store the run's figures; without the failures' orders (a page filling in a missing
    histogram), leave a row another request stored meanwhile, in one INSERT."""
    if failing_at is not None:
        figures = {
            "histogram": histogram,
            "failing_at": failing_at,
            "failing_orders": failing_orders,
        }
        RunFigures.objects.update_or_create(run_id=run.id, defaults=figures)
    else:
        RunFigures.objects.bulk_create(
            [RunFigures(run_id=run.id, histogram=histogram)], ignore_conflicts=True
        )


def histogram(run: Run, evaluators: list[str]) -> dict[str, list[int]]:
    """Scores per evaluator in ten bins over [0, 1] (`count_histogram`): stored for a finished
    run (one small read), counted for a running one."""
    names = list(evaluators)
    if not names:
        return {}
    if run.status in UNFINISHED:
        return count_histogram(run.id, names)
    stored = RunFigures.objects.filter(run_id=run.id).values_list("histogram", flat=True).first()
    if stored is None:
        stored = count_histogram(run.id, list(dict.fromkeys([*run.evaluator_names, *names])))
        _save(run, stored)
    elif any(name not in stored for name in names):  # not one of the run's evaluators
        return count_histogram(run.id, names)
    return {name: stored[name] for name in names}


def failing_order(run: Run, evaluator: str) -> list[int] | None:
    """`score_tables.judged_failures(run, evaluator)`'s item ids, as stored when the run was
    finalised; None for a running run, or an evaluator the run does not have.

    A finished run whose orders were not stored (figures stored by an older Cobalt, or
    ranked with pass marks since changed) has every evaluator's ranked now and stored, once:
    ranking one evaluator's failures reads all its failing verdicts (~0.5 s of CPU at
    500,000 items), which each visit of its failures view otherwise paid."""
    if run.status in UNFINISHED or evaluator not in run.evaluator_names:
        return None
    found = (
        RunFigures.objects.filter(run_id=run.id).values_list("failing_at", "failing_orders").first()
    )
    if (
        found is None
        or evaluator not in found[0].get("at", {})
        or (found[0].get("marks") != _marks(run))
    ):
        failing_at, orders = _rank_failures(run)
        if found is None:
            _save(run, count_histogram(run.id, run.evaluator_names), failing_at, orders)
        else:
            RunFigures.objects.filter(run_id=run.id).update(
                failing_at=failing_at, failing_orders=orders
            )
        found = (failing_at, orders)
    start, count = found[0]["at"][evaluator]
    ids = np.frombuffer(bytes(found[1]), dtype="<i8", count=count, offset=8 * start)
    return ids.tolist()


def _marks(run: Run) -> dict[str, float]:
    """The pass marks a failures order was ranked with (as JSON keeps them)."""
    return {
        name: float(mark)
        for name, mark in verdict.pass_marks((run.config or {}).get("evaluators", [])).items()
    }


def count_histogram(run_id: str, evaluators: list[str]) -> dict[str, list[int]]:
    """Scores per evaluator in ten bins over [0, 1] (outliers in the end bins), one query.

    Each bin is a range count on the `(run, evaluator, score)` index, which is far cheaper
    than evaluating a bin expression for every row (and portable: casting a float truncates
    on SQLite but rounds on PostgreSQL).
    """
    names = list(evaluators)
    if not names:
        return {}
    table = Evaluation._meta.db_table
    edges = [i / HISTOGRAM_BINS for i in range(1, HISTOGRAM_BINS)]
    counts, params = [], []
    for name in names:
        for i in range(HISTOGRAM_BINS):
            bounds, values = [], []
            if i > 0:
                bounds.append("score >= %s")
                values.append(edges[i - 1])
            if i < HISTOGRAM_BINS - 1:
                bounds.append("score < %s")
                values.append(edges[i])
            counts.append(
                f"(SELECT COUNT(*) FROM {table} WHERE run_id = %s AND evaluator = %s"
                f" AND {' AND '.join(bounds)})"
            )
            params += [run_id, name, *values]
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(counts), params)
        row = cursor.fetchone()
    return {
        name: list(row[n * HISTOGRAM_BINS : (n + 1) * HISTOGRAM_BINS])
        for n, name in enumerate(names)
    }
