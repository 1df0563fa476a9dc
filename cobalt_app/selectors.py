"""Reads shared by the CLI, pages, API and MCP: run lookup, history, comparison."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django.db import connection
from django.db.models import QuerySet

from cobalt_app.models import Evaluation, ItemResult, ItemTrace, Run

if TYPE_CHECKING:
    import numpy as np

    from cobalt_app.score_tables import Pairing

AMBIGUOUS_SHOWN = 5


class RunNotFound(LookupError):
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


def item_trace(item_id: int) -> list[dict[str, Any]]:
    """The stored steps of one item's trace (empty when none was captured)."""
    return ItemTrace.objects.filter(item_id=item_id).values_list("steps", flat=True).first() or []


def run_list(
    *,
    name: str | None = None,
    tag: str | None = None,
    status: str | None = None,
    limit: int | None = 20,
) -> QuerySet[Run]:
    runs = Run.objects.all().order_by("-created_at")
    if name:
        runs = runs.filter(name__icontains=name)
    if tag:
        runs = runs.filter(tag_rows__name=tag)
    if status:
        runs = runs.filter(status=status)
    return runs[:limit] if limit else runs


def latest_run(name: str, *, exclude: str | None = None) -> Run | None:
    runs = Run.objects.filter(name=name, status=Run.Status.COMPLETED).order_by("-created_at")
    if exclude:
        runs = runs.exclude(id=exclude)
    return runs.first()


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


def scores_by_item(run: Run) -> dict[str, dict[str, list[float]]]:
    """Item key → evaluator → its scores across repetitions (scored evaluations only)."""
    result: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for chunk in _scored_rows(run.id):
        for _, evaluator, key, score in chunk:
            result[key][evaluator].append(score)
    return result


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
    import numpy as np

    from cobalt_app import score_tables, significance

    pairing = score_tables.pair(a, b) if pairing is None else pairing
    evaluators = list(dict.fromkeys([*a.evaluator_names, *b.evaluator_names]))
    summary: dict[str, dict[str, Any]] = {}
    tests: dict[str, dict[str, Any]] = {}
    falls: list[dict[str, Any]] = []
    rises: list[dict[str, Any]] = []
    regression_count = improvement_count = 0
    for name in evaluators:
        before, after = pairing.scores(name)
        both = ~np.isnan(before) & ~np.isnan(after)
        tests[name] = significance.paired_values(
            before[both],
            after[both],
            only_a=_scored_in_one(pairing, name, "a", both),
            only_b=_scored_in_one(pairing, name, "b", both),
            alpha=alpha,
        )
        down, up, regressed, improved = _movers(name, pairing, both, top)
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
    matched_only = shared[~both & scored[shared]]
    positions = np.sort(np.concatenate([own[scored[own]], matched_only]))
    return len(positions), table.key_list(positions[:listed])


def _movers(
    name: str, pairing: Pairing, both: np.ndarray, top: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int, int]:
    """One evaluator's `top` largest falls and rises over the keys scored in both runs, and
    how many items fell and rose."""
    import numpy as np

    before, after = pairing.scores(name)
    where = np.flatnonzero(both)
    before, after = before[where], after[where]
    deltas = after - before
    regressed, improved = int((deltas < 0).sum()), int((deltas > 0).sum())

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
