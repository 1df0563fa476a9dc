"""Reads shared by the CLI, pages, API and MCP: run lookup, history, comparison."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db import connection
from django.db.models import QuerySet

from cobalt_app.models import Evaluation, ItemResult, Run


class RunNotFound(LookupError):
    pass


def run_get(run_id: str) -> Run:
    """A run by id, or by an unambiguous id prefix (at least 4 characters)."""
    run_id = (run_id or "").strip()
    run = Run.objects.filter(id=run_id).first()
    if run is not None:
        return run
    if len(run_id) >= 4:
        matches = list(Run.objects.filter(id__startswith=run_id)[:2])
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise RunNotFound(f"run id {run_id!r} is ambiguous; give more characters")
    raise RunNotFound(f"no run with id {run_id!r}; `cobalt history` lists runs")


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


def scores_by_key(run: Run) -> dict[str, dict[str, float]]:
    """Mean score per item key and evaluator (repetitions averaged)."""
    sums: dict[tuple[str, str], list[float]] = defaultdict(list)
    rows = Evaluation.objects.filter(run=run, status=Evaluation.Status.OK).values_list(
        "item__item_key", "evaluator", "score"
    )
    for key, evaluator, score in rows.iterator(chunk_size=5000):
        sums[(key, evaluator)].append(score)
    result: dict[str, dict[str, float]] = defaultdict(dict)
    for (key, evaluator), values in sums.items():
        result[key][evaluator] = sum(values) / len(values)
    return result


def scores_by_item(run: Run) -> dict[str, dict[str, list[float]]]:
    """Item key → evaluator → its scores across repetitions (scored evaluations only).

    A plain cursor: run summaries call this for every run, and ORM rows for 100k evaluations
    cost twice the query.
    """
    sql = (
        f"SELECT i.item_key, e.evaluator, e.score FROM {Evaluation._meta.db_table} e "
        f"INNER JOIN {ItemResult._meta.db_table} i ON i.id = e.item_id "
        "WHERE e.run_id = %s AND e.status = %s AND e.score IS NOT NULL"
    )
    result: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    with connection.cursor() as cursor:
        cursor.execute(sql, [run.id, Evaluation.Status.OK])
        while chunk := cursor.fetchmany(20000):
            for key, evaluator, score in chunk:
                result[key][evaluator].append(score)
    return result


def item_keys(run: Run) -> dict[str, int]:
    """Item key → item index, for every item of a run."""
    rows = ItemResult.objects.filter(run=run, run_index=0).values_list("item_key", "item_index")
    return dict(rows.iterator(chunk_size=5000))


def compare_runs(a: Run, b: Run, *, top: int = 10, alpha: float = 0.05) -> dict[str, Any]:
    """Per-evaluator averages and deltas, and the items that changed most, matched by key.

    `significance[evaluator]`: the paired test of B against A at level `alpha` (see
    cobalt_app.significance.paired_compare).
    """
    from cobalt_app import significance

    scores_a, scores_b = scores_by_key(a), scores_by_key(b)
    keys_a, keys_b = item_keys(a), item_keys(b)
    evaluators = list(dict.fromkeys([*a.evaluator_names, *b.evaluator_names]))
    summary = {}
    for name in evaluators:
        avg_a = (a.summary.get("scores", {}).get(name) or {}).get("avg")
        avg_b = (b.summary.get("scores", {}).get(name) or {}).get("avg")
        delta = avg_b - avg_a if avg_a is not None and avg_b is not None else None
        summary[name] = {"a": avg_a, "b": avg_b, "delta": delta}
    changes: list[dict[str, Any]] = []
    for key in keys_a.keys() & keys_b.keys():
        for name in evaluators:
            score_a = scores_a.get(key, {}).get(name)
            score_b = scores_b.get(key, {}).get(name)
            if score_a is None or score_b is None or score_a == score_b:
                continue
            changes.append(
                {
                    "key": key,
                    "indexA": keys_a[key],
                    "indexB": keys_b[key],
                    "evaluator": name,
                    "a": score_a,
                    "b": score_b,
                    "delta": score_b - score_a,
                }
            )
    regressions = sorted((c for c in changes if c["delta"] < 0), key=lambda c: c["delta"])
    improvements = sorted((c for c in changes if c["delta"] > 0), key=lambda c: -c["delta"])
    return {
        "runA": {"id": a.id, "name": a.name, "createdAt": a.created_at.isoformat()},
        "runB": {"id": b.id, "name": b.name, "createdAt": b.created_at.isoformat()},
        "evaluators": summary,
        "cost": {"a": a.estimated_cost, "b": b.estimated_cost},
        "matchedItems": len(keys_a.keys() & keys_b.keys()),
        "onlyInA": sorted(keys_a.keys() - keys_b.keys()),
        "onlyInB": sorted(keys_b.keys() - keys_a.keys()),
        "regressions": regressions[:top],
        "improvements": improvements[:top],
        "regressionCount": len(regressions),
        "improvementCount": len(improvements),
        "alpha": alpha,
        "significance": significance.compare_scores(scores_a, scores_b, evaluators, alpha=alpha),
    }
