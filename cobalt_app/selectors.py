"""Reads shared by the pages, API, CLI and MCP server: runs (lookup, lists, an experiment's
history), items (failures, traces), scores and comparison. Page-shaped reads build on these
in `page_selectors`, `page_items` and `page_compare`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from datetime import date, datetime, time, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from django.db import connection
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from cobalt import verdict
from cobalt.errors import NotFoundError
from cobalt_app import runaway, trace_store
from cobalt_app.models import Evaluation, ItemResult, Run, RunTag


class LowScores(NamedTuple):
    """How many items an evaluator scored low, and the indexes of the first few."""

    count: int
    first: list[int]


if TYPE_CHECKING:
    import numpy as np

    from cobalt_app.score_tables import Pairing

AMBIGUOUS_SHOWN = 5

RUN_SORTS = {
    "created": "created_at",
    "name": "name",
    "status": "status",
    "items": "total_items",
    "errors": "error_count",
    "duration": "duration_ms",
    "cost": "estimated_cost",
}
BRIEF_FIELDS = ("id", "name", "created_at", "status")
FAILED = (ItemResult.Status.ERROR, ItemResult.Status.TIMEOUT)
FAILED_FIELDS = ("id", "run", "item_index", "run_index", "item_key", "status", "error", "traceback")


class RunNotFound(NotFoundError):
    pass


def run_get(run_id: str) -> Run:
    """A run by id, or by an unambiguous id prefix (at least 4 characters)."""
    run_id = (run_id or "").strip()
    run = Run.objects.filter(id=run_id).first()
    if run is not None:
        return run
    if len(run_id) >= 4:
        matches = list(
            Run.objects.filter(id__startswith=run_id)
            .only("id", "name", "created_at")
            .order_by("-created_at")[: AMBIGUOUS_SHOWN + 1]
        )
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            listed = "; ".join(
                f"{m.id} ({m.name}, {m.created_at:%Y-%m-%d %H:%M})"
                for m in matches[:AMBIGUOUS_SHOWN]
            )
            more = ", and more" if len(matches) > AMBIGUOUS_SHOWN else ""
            raise RunNotFound(
                f"run id {run_id!r} is ambiguous: it starts {listed}{more}. Give more characters"
            )
    raise RunNotFound(f"no run with id {run_id!r}; `cobalt history` lists runs")


# Runs ---------------------------------------------------------------------------------------


def run_list(
    *,
    name: str | None = None,
    tag: str | None = None,
    status: str | None = None,
    date_from: date | None = None,
    date_to: date | None = None,
    sort: str = "-created",
    limit: int | None = None,
    brief: bool = False,
) -> QuerySet[Run]:
    """Runs matching the list filters (`name` contains, a tag, a status, created between two
    days), by `sort` (a `RUN_SORTS` key, `-` for descending), the newest first among equals.
    Never touches item rows; `brief` reads only what names a run (a menu of runs)."""
    runs = Run.objects.only(*BRIEF_FIELDS) if brief else Run.objects.defer("failure")
    if name:
        runs = runs.filter(name__icontains=name)
    if tag:
        runs = runs.filter(id__in=RunTag.objects.filter(name=tag).values("run_id"))
    if status:
        runs = runs.filter(status=status)
    if date_from:
        runs = runs.filter(created_at__gte=_day_start(date_from))
    if date_to:
        runs = runs.filter(created_at__lt=_day_start(date_to) + timedelta(days=1))
    column = RUN_SORTS.get(sort.lstrip("-"), "created_at")
    runs = runs.order_by(f"-{column}" if sort.startswith("-") else column, "-created_at", "id")
    return runs[:limit] if limit else runs


def _day_start(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min), timezone.get_current_timezone())


def experiment_runs(
    name: str,
    *,
    statuses: Iterable[str] | None = None,
    tag: str = "",
    before: Run | None = None,
    exclude: str | None = None,
    rejudged: bool = True,
) -> QuerySet[Run]:
    """An experiment's runs, newest first: only in `statuses` if given, with `tag`, created
    `before` a run, other than the run `exclude`; without re-judged copies unless `rejudged`."""
    runs = Run.objects.filter(name=name)
    if statuses is not None:
        runs = runs.filter(status__in=list(statuses))
    if tag:
        runs = runs.filter(id__in=RunTag.objects.filter(name=tag).values("run_id"))
    if before is not None:
        runs = runs.filter(created_at__lt=before.created_at)
    if exclude:
        runs = runs.exclude(id=exclude)
    if not rejudged:
        runs = runs.filter(parent__isnull=True)
    return runs.order_by("-created_at")


def latest_run(name: str, *, exclude: str | None = None) -> Run | None:
    """The experiment's newest completed run other than `exclude` (a baseline)."""
    return experiment_runs(name, statuses=[Run.Status.COMPLETED], exclude=exclude).first()


def previous_run(run: Run) -> Run | None:
    """The latest earlier run of the same experiment, whatever its status (to compare with)."""
    return experiment_runs(run.name, before=run).only("id", "created_at").first()


def latest_runs(limit: int = 50) -> QuerySet[Run]:
    """The newest finished run of each experiment, the newest first."""
    newest = (
        Run.objects.filter(name=OuterRef("name"), status__in=Run.FINISHED)
        .order_by("-created_at")
        .values("id")[:1]
    )
    return Run.objects.filter(id=Subquery(newest)).order_by("-created_at")[:limit]


def tag_names() -> list[str]:
    return list(RunTag.objects.order_by("name").values_list("name", flat=True).distinct())


def experiment_names() -> list[str]:
    return list(Run.objects.order_by("name").values_list("name", flat=True).distinct())


def latest_experiment() -> str:
    """The experiment of the most recent run (the trends page opens on it)."""
    return Run.objects.order_by("-created_at").values_list("name", flat=True).first() or ""


def run_progress(run_id: str) -> tuple[str, int]:
    """(status, finished items) of a run, read afresh (a run followed to its end)."""
    return Run.objects.values_list("status", "finished_items").get(id=run_id)


# Items --------------------------------------------------------------------------------------


def run_items(run: Run) -> QuerySet[ItemResult]:
    """A run's items in order (the API filters and pages them)."""
    return ItemResult.objects.filter(run=run).order_by("item_index", "run_index")


def finished_item_ids(run_id: str, *, from_id: int = 0) -> list[int]:
    """Ids (from `from_id` on) of the run's items that have finished."""
    ended = ItemResult.objects.filter(
        run_id=run_id, id__gte=from_id, status__in=ItemResult.FINISHED
    )
    return list(ended.values_list("id", flat=True))


def failed_items(
    run: Run | str, *, statuses: Sequence[str] = FAILED, traced: bool = False
) -> QuerySet[ItemResult]:
    """The run's items that errored or timed out (or ended in `statuses`), in order; `traced`:
    only those with a traceback. Reads the `(run, status)` index, no output or input."""
    items = ItemResult.objects.filter(run=run, status__in=list(statuses))
    if traced:
        items = items.exclude(traceback="")
    return items.only(*FAILED_FIELDS).order_by("item_index", "run_index")


def runaway_items(run: Run | str) -> list[int]:
    """The indexes of the run's items whose code went on past their timeout and grace period
    (left running: `cobalt_app.runaway`), in order."""
    items = ItemResult.objects.filter(
        run=run, status=ItemResult.Status.TIMEOUT, error__contains=runaway.DID_NOT_STOP
    )
    return list(items.order_by("item_index").values_list("item_index", flat=True).distinct())


def low_scores(run: Run, below: float | None = None, *, shown: int = 8) -> dict[str, LowScores]:
    """Evaluator → how many items it scored below its pass mark (`cobalt.verdict`: a failing
    verdict), or below `below` when given (repetitions once), and the first `shown` of their
    indexes. Streamed in chunks: a million low scores hold `shown` indexes, not a list of all
    (issue 41: the terminal summary of a big run)."""
    if below is None:
        marks = verdict.pass_marks((run.config or {}).get("evaluators", []))
        low = Q(score__lt=verdict.DEFAULT_PASS_THRESHOLD) & ~Q(evaluator__in=list(marks))
        for name, mark in marks.items():
            low |= Q(evaluator=name, score__lt=mark)
    else:
        low = Q(score__lt=below)
    rows = (
        Evaluation.objects.filter(low, run=run, status=Evaluation.Status.OK)
        .values_list("evaluator", "item__item_index")
        .order_by("evaluator", "item__item_index")
        .distinct()
    )
    counts: dict[str, int] = defaultdict(int)
    first: dict[str, list[int]] = defaultdict(list)
    for evaluator, index in rows.iterator(chunk_size=2000):
        counts[evaluator] += 1
        if len(first[evaluator]) < shown:
            first[evaluator].append(index)
    return {name: LowScores(count, first[name]) for name, count in counts.items()}


def evaluation_errors(run: Run | str) -> QuerySet:
    """(evaluator, error) of the run's failed evaluations, in item order."""
    return (
        Evaluation.objects.filter(run=run, status=Evaluation.Status.ERROR)
        .order_by("item__item_index", "item__run_index", "id")
        .values_list("evaluator", "error")
    )


def item_trace(item_id: int) -> list[dict[str, Any]]:
    """The stored steps of one item's trace (empty when none was captured)."""
    return trace_store.read([item_id]).get(item_id, [])


# Scores -------------------------------------------------------------------------------------

# From the evaluations (by their run index) to each one's item by primary key, for the key:
# cheaper than starting from the items, and no item column but the key is read.
SCORED_SQL = """
SELECT e.run_id, e.evaluator, i.item_key, e.score
FROM {evaluation} e INNER JOIN {item} i ON i.id = e.item_id
WHERE e.run_id IN ({runs}) AND e.status = %s AND e.score IS NOT NULL
"""


def _scored_rows(*run_ids: str) -> Iterator[list[tuple[str, str, str, float]]]:
    """(run id, evaluator, item key, score) of every scored evaluation of the runs, in chunks.

    A plain cursor: run summaries and comparisons read every evaluation of a run, and ORM
    rows for 100k evaluations cost more than the query.
    """
    ids = list(dict.fromkeys(run_ids))
    sql = SCORED_SQL.format(
        evaluation=Evaluation._meta.db_table,
        item=ItemResult._meta.db_table,
        runs=", ".join(["%s"] * len(ids)),
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*ids, Evaluation.Status.OK])
        while chunk := cursor.fetchmany(20000):
            yield chunk


# The same rows, each item key's together: the keys in the order their first evaluation was
# stored, each key's rows in that order too (the order the run's evaluations were stored in).
# In key order, read through the `(run, item_key)` index and each item's evaluations by
# `item_id` (a CROSS JOIN keeps SQLite to that order): rows stream out with no sort of the
# whole run. Ordering by first appearance (a window over every row, then a sort) held tens of
# megabytes in SQLite's sorters at 300,000 items (issue 41).
SCORED_BY_KEY_SQL = """
SELECT i.item_key, e.evaluator, e.score
FROM {item} i CROSS JOIN {evaluation} e
WHERE e.item_id = i.id AND i.run_id = %s AND e.run_id = %s AND e.status = %s
AND e.score IS NOT NULL
ORDER BY i.item_key, e.id
"""


def scored_items(run: Run) -> Iterator[tuple[str, dict[str, list[float]]]]:
    """(item key, evaluator → its scores across repetitions) of the run's scored evaluations,
    a key at a time in key order: the run's summary reads a million items without holding
    them (`significance.run_statistics`)."""
    sql = SCORED_BY_KEY_SQL.format(
        evaluation=Evaluation._meta.db_table, item=ItemResult._meta.db_table
    )
    key, by_name = None, {}
    with connection.cursor() as cursor:
        cursor.execute(sql, [run.id, run.id, Evaluation.Status.OK])
        while chunk := cursor.fetchmany(2000):
            for item_key, evaluator, score in chunk:
                if item_key != key:
                    if by_name:
                        yield key, by_name
                    key, by_name = item_key, {}
                by_name.setdefault(evaluator, []).append(score)
    if by_name:
        yield key, by_name


def key_scores(*runs: Run) -> dict[str, dict[str, dict[str, float]]]:
    """Run id → evaluator → item key → the item's score (the mean over its repetitions)."""
    result: dict[str, dict[str, dict[str, float]]] = {run.id: {} for run in runs}
    repeated: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for chunk in _scored_rows(*result):
        for run_id, evaluator, key, score in chunk:
            scores = result[run_id].get(evaluator)
            if scores is None:
                scores = result[run_id][evaluator] = {}
            if key in scores:
                repeated[run_id, evaluator, key].append(score)
            else:
                scores[key] = score
    for (run_id, evaluator, key), more in repeated.items():
        values = [result[run_id][evaluator][key], *more]
        result[run_id][evaluator][key] = sum(values) / len(values)
    return result


def scores_by_key(run: Run) -> dict[str, dict[str, float]]:
    """Item key → evaluator → the item's score (repetitions averaged)."""
    result: dict[str, dict[str, float]] = defaultdict(dict)
    for evaluator, scores in key_scores(run)[run.id].items():
        for key, score in scores.items():
            result[key][evaluator] = score
    return result


# Compare ------------------------------------------------------------------------------------

# The item index of each listed mover in either run (on the `(run, item_key)` index).
INDEXES_SQL = """
SELECT '{label}', item_key, MIN(item_index) FROM {item}
WHERE run_id = %s AND item_key IN ({keys}) GROUP BY item_key
"""


def compare_runs(
    a: Run,
    b: Run,
    *,
    top: int = 10,
    alpha: float = 0.05,
    pairing: Pairing | None = None,
) -> dict[str, Any]:
    """Per-evaluator averages and deltas, and the items that changed most, matched by key.

    Reads the two runs' score tables (`score_tables`: each item's repetition-averaged score
    per evaluator, stored at finalisation) joined by key, then the movers' item indexes.
    `significance[name]` is the paired test of B against A at level `alpha`;
    `evaluators[name]` counts the items that `regressed` and `improved`. Movers are ordered
    by their change, then by key, so every door lists the same items. `pairing` is
    `score_tables.pair(a, b)` when the caller has already joined them (the compare page).
    """

    from cobalt_app import score_tables

    pairing = score_tables.pair(a, b) if pairing is None else pairing
    evaluators = list(dict.fromkeys([*a.evaluator_names, *b.evaluator_names]))
    summary: dict[str, dict[str, Any]] = {}
    tests: dict[str, dict[str, Any]] = {}
    falls: list[dict[str, Any]] = []
    rises: list[dict[str, Any]] = []
    regression_count = improvement_count = 0
    for name in evaluators:
        tests[name] = _paired_test(a, b, pairing, name, alpha)
        down, up, regressed, improved = _movers(a, b, pairing, name, top)
        falls += down
        rises += up
        regression_count += regressed
        improvement_count += improved
        avg_a = (a.summary.get("scores", {}).get(name) or {}).get("avg")
        avg_b = (b.summary.get("scores", {}).get(name) or {}).get("avg")
        summary[name] = {
            "a": avg_a,
            "b": avg_b,
            "delta": avg_b - avg_a if avg_a is not None and avg_b is not None else None,
            "regressed": regressed,
            "improved": improved,
        }
    regressions = sorted(falls, key=lambda m: (m["delta"], m["key"]))[:top]
    improvements = sorted(rises, key=lambda m: (-m["delta"], m["key"]))[:top]
    indexes = _indexes(a, b, {m["key"] for m in regressions + improvements})
    for mover in regressions + improvements:
        mover["indexA"] = indexes["indexA"].get(mover["key"])
        mover["indexB"] = indexes["indexB"].get(mover["key"])
    return {
        "runA": {"id": a.id, "name": a.name, "createdAt": a.created_at.isoformat()},
        "runB": {"id": b.id, "name": b.name, "createdAt": b.created_at.isoformat()},
        "evaluators": summary,
        "cost": {"a": a.estimated_cost, "b": b.estimated_cost},
        "matchedItems": pairing.matched,
        "onlyInA": pairing.a.key_list(pairing.only_a),
        "onlyInB": pairing.b.key_list(pairing.only_b),
        "regressions": regressions,
        "improvements": improvements,
        "regressionCount": regression_count,
        "improvementCount": improvement_count,
        "alpha": alpha,
        "significance": tests,
    }


def _scored_in_both(pairing: Pairing, name: str) -> np.ndarray:
    """Whether the evaluator scored each shared key in both runs."""
    import numpy as np

    before, after = pairing.scores(name)
    return ~np.isnan(before) & ~np.isnan(after)


def _paired_test(a: Run, b: Run, pairing: Pairing, name: str, alpha: float) -> dict[str, Any]:
    """The evaluator's paired test of B against A over the keys it scored in both, worked out
    once per process for finished runs: its Wilcoxon test ranks every pair (~60 ms at 200,000
    items, each time the compare page or API is asked)."""
    from cobalt import significance
    from cobalt_app import score_tables

    def test() -> dict[str, Any]:
        both = _scored_in_both(pairing, name)
        before, after = pairing.scores(name)
        return significance.paired_values(
            before[both],
            after[both],
            only_a=_scored_in_one(pairing, name, "a", both),
            only_b=_scored_in_one(pairing, name, "b", both),
            alpha=alpha,
        )

    return score_tables.remembered(a, b, ("paired test", name, alpha), test)


def _scored_in_one(
    pairing: Pairing, name: str, side: str, both: np.ndarray, listed: int = 50
) -> tuple[int, list[str]]:
    """How many keys the evaluator scored in this run but not in the other, and the first
    `listed` of them in key order."""
    import numpy as np

    table = pairing.a if side == "a" else pairing.b
    own = pairing.only_a if side == "a" else pairing.only_b
    shared = pairing.at_a if side == "a" else pairing.at_b
    scored = ~np.isnan(table.column(name))
    if pairing.same_keys:  # every key shared, at its own position: no lookups, no sort
        positions = np.flatnonzero(scored & ~both)
        return len(positions), table.key_list(positions[:listed])
    matched_only = shared[~both & scored[shared]]
    positions = np.sort(np.concatenate([own[scored[own]], matched_only]))
    return len(positions), table.key_list(positions[:listed])


def _movers(
    a: Run, b: Run, pairing: Pairing, name: str, top: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int, int]:
    """One evaluator's `top` largest falls and rises over the keys scored in both runs, and
    how many items fell and rose: worked out once per process for finished runs, as the
    paired test is (it reads every pair: ~40 ms of CPU at 500,000 items on each visit)."""
    from cobalt_app import score_tables

    return score_tables.remembered(
        a, b, ("movers", name, top), lambda: _count_movers(pairing, name, top)
    )


def _count_movers(
    pairing: Pairing, name: str, top: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int, int]:
    import numpy as np

    before, after = pairing.scores(name)
    # A pair with a missing score compares false both ways, as it is left out of the deltas.
    regressed, improved = (
        int(np.count_nonzero(after < before)),
        int(np.count_nonzero(after > before)),
    )
    if not top:  # the compare page: the counts only
        return [], [], regressed, improved
    where = np.flatnonzero(_scored_in_both(pairing, name))
    before, after = before[where], after[where]
    deltas = after - before

    def moves(order: np.ndarray, count: int) -> list[dict[str, Any]]:
        return [
            {
                "key": pairing.key(int(where[i])),
                "indexA": None,
                "indexB": None,
                "evaluator": name,
                "a": float(before[i]),
                "b": float(after[i]),
                "delta": float(deltas[i]),
            }
            for i in order[: min(top, count)].tolist()
        ]

    # Equal changes stay in key order (the keys are in order and the sorts stable).
    down = moves(_smallest(deltas, min(top, regressed)), regressed)
    up = moves(_smallest(-deltas, min(top, improved)), improved)
    return down, up, regressed, improved


def _smallest(values: np.ndarray, count: int) -> np.ndarray:
    """The positions of the `count` smallest values, smallest first, ties in position order:
    a partition finds the `count`-th value, and only the values up to it are sorted."""
    import numpy as np

    if count <= 0:
        return np.array([], dtype=np.int64)
    if count >= len(values):
        return np.argsort(values, kind="stable")
    bound = np.partition(values, count - 1)[count - 1]
    candidates = np.flatnonzero(values <= bound)
    return candidates[np.argsort(values[candidates], kind="stable")][:count]


def _indexes(a: Run, b: Run, movers: set[str]) -> dict[str, dict[str, int]]:
    """Per run, the item index of each mover key."""
    indexes: dict[str, dict[str, int]] = {"indexA": {}, "indexB": {}}
    if not movers:
        return indexes
    wanted = sorted(movers)
    item = ItemResult._meta.db_table
    parts, params = [], []
    for label, run in (("indexA", a), ("indexB", b)):
        parts.append(
            INDEXES_SQL.format(label=label, item=item, keys=", ".join(["%s"] * len(wanted)))
        )
        params += [run.id, *wanted]
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), params)
        for kind, key, number in cursor.fetchall():
            indexes[kind][key] = number
    return indexes
