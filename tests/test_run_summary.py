"""A run's summary is computed flat in the run's size (issue 41), and its figures are the ones
the summary had when it read every item's scores into a dictionary by item key."""

from __future__ import annotations

import json
import math
import random
import tracemalloc
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from django.utils import timezone

from cobalt import Dataset, Evaluator, experiment, significance, stats, verdict
from cobalt.experiments import collecting
from cobalt.run_settings import RunSettings
from cobalt_app import results, run_summary, selectors, services, trace_store
from cobalt_app.engine import ItemOutcome
from cobalt_app.evaluators import EvalOutcome
from cobalt_app.models import Evaluation, ItemResult, Run

pytestmark = pytest.mark.django_db

EVALUATORS = (("quality", None), ("exact", None), ("strict", 0.8))


def record_run(seed: int, n: int, *, runs: int = 1, errors: bool = True, batch: int = 7) -> Run:
    """A finished run of `n` items × `runs`, recorded in a shuffled order in batches (as
    concurrent lanes finish them): continuous, 0/1 and strict scores, item errors and timeouts,
    evaluation errors, latencies, tokens and costs of every kind, from `seed`."""
    rng = random.Random(seed)
    with collecting() as found:
        experiment(
            "summary",
            Dataset(items=[{"id": f"k{i}", "input": i} for i in range(n)]),
            lambda ctx: None,
            evaluators=[
                Evaluator(name=name, type="function", fn=lambda ctx: 1.0, pass_threshold=mark)
                for name, mark in EVALUATORS
            ],
            runs=runs,
        )
    run = services.run_create(
        experiment=found[0], settings={"runs": runs, "concurrency": 4, "timeout": 30}
    )
    services.run_start(run.id)
    snapshots = services.item_snapshots(run.id)
    rng.shuffle(snapshots)
    outcomes = [outcome(snapshot, rng, errors) for snapshot in snapshots]
    for start in range(0, len(outcomes), batch):
        services.record_item_outcomes(run.id, outcomes[start : start + batch])
    results.run_finalise(run.id)
    return Run.objects.get(id=run.id)


def outcome(snapshot, rng: random.Random, errors: bool) -> ItemOutcome:
    roll = rng.random() if errors else 1.0
    status = "error" if roll < 0.05 else "timeout" if roll < 0.08 else "ok"
    evaluations = []
    for name, _ in EVALUATORS if status == "ok" else ():
        if errors and rng.random() < 0.1:
            evaluations.append(EvalOutcome.failed(name, "judge replied prose", tokens=7))
            continue
        score = rng.random() if name != "exact" else float(rng.random() < 0.6)
        cost = rng.random() / 1000
        evaluations.append(EvalOutcome(name, score, tokens=rng.randrange(50), cost=cost))
    return ItemOutcome.of(
        snapshot,
        status=status,
        error="" if status == "ok" else "boom",
        latency_ms=rng.random() * 900 if status == "ok" else None,
        tokens=rng.randrange(500),
        cost=rng.random() / 100,
        finished_at=timezone.now(),
        evaluations=evaluations,
    )


@pytest.mark.parametrize(("seed", "runs"), [(1, 3), (2, 3), (3, 1), (4, 5)])
def test_the_summary_has_the_figures_of_the_summary_by_item_key(seed, runs):
    run = record_run(seed, 120, runs=runs)
    expected = summary_by_item_key(run)
    assert run.summary == json.loads(json.dumps(expected))
    # Every figure the same, to the last bit, and in the same order.
    assert json.dumps(run_summary.compute_summary(run)) == json.dumps(expected)
    scores = run.summary["scores"]
    assert scores["exact"]["ci95"]["method"] == "wilson" if runs == 1 else "t"
    assert scores["quality"]["ci95"]["method"] == "t"
    assert scores["strict"]["passMark"] == 0.8
    assert run.summary["errors"] and run.summary["timeouts"] and run.summary["evaluationErrors"]
    if runs > 1:
        assert set(scores["exact"]["passAtK"]["passAtK"]) == {str(k) for k in range(1, runs + 1)}
        assert "passAtK" not in scores["quality"]
        assert len(run.summary["repetitions"]["items"]) > 100
    else:
        assert "repetitions" not in run.summary


def test_the_summary_holds_8_bytes_a_score_not_a_python_object_an_item():
    peaks = []
    for n in (5000, 15000):  # above twice the 2,000 rows read at a time
        run = record_run(n, n, errors=False, batch=1000)
        tracemalloc.start()
        run_summary.compute_summary(run)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    per_item = (peaks[1] - peaks[0]) / 10000
    # Three evaluators: a score and an item's mean each (48 bytes), its latency (8), and the
    # arrays' spare room. Reading scores into a dictionary by item key took over 400 bytes.
    assert per_item < 100, f"{per_item:.0f} bytes an item"


# The summary as it was computed before issue 41 (every item's scores in a dictionary by item
# key, scores and latencies in lists), kept as the reference the figures must match.


def summary_by_item_key(run: Run) -> dict[str, Any]:
    status_counts: dict[str, int] = defaultdict(int)
    latencies: list[float] = []
    agent_tokens, agent_cost = 0, 0.0
    for status, latency, tokens, cost in ItemResult.objects.filter(run=run).values_list(
        "status", "latency_ms", "tokens", "cost"
    ):
        status_counts[status] += 1
        if status == ItemResult.Status.OK and latency is not None:
            latencies.append(latency)
        agent_tokens += tokens or 0
        agent_cost += cost or 0.0
    scores: dict[str, list[float]] = defaultdict(list)
    eval_errors: dict[str, int] = defaultdict(int)
    judge_tokens, judge_cost, cached = 0, 0.0, 0
    for evaluator, score, status, tokens, cost, was_cached in Evaluation.objects.filter(
        run=run
    ).values_list("evaluator", "score", "status", "tokens", "cost", "cached"):
        if status == Evaluation.Status.OK and score is not None:
            scores[evaluator].append(score)
        else:
            eval_errors[evaluator] += 1
        judge_tokens += tokens or 0
        judge_cost += cost or 0.0
        cached += bool(was_cached)
    names = run.evaluator_names or sorted(set(scores) | set(eval_errors))
    marks = verdict.pass_marks((run.config or {}).get("evaluators", []))
    per_evaluator = {
        name: old_describe(scores.get(name, []), eval_errors.get(name, 0), marks.get(name))
        for name in names
    }
    extra = old_run_statistics(
        scores_by_item(run), names, RunSettings.from_run_config(run.config).runs
    )
    for name, values in per_evaluator.items():
        values["ci95"] = extra["ci95"].get(name)
        if name in extra["passAtK"]:
            values["passAtK"] = extra["passAtK"][name]
    latency = old_latency_stats(latencies)
    return {
        "totalItems": run.total_items,
        "totalDurationMs": run_summary.run_duration_ms(run),
        "avgLatencyMs": latency["avg"],
        "latency": latency,
        "totalTokens": agent_tokens + judge_tokens,
        "agentTokens": agent_tokens,
        "judgeTokens": judge_tokens,
        "estimatedCost": agent_cost + judge_cost,
        "agentCost": agent_cost,
        "judgeCost": judge_cost,
        **run_summary.cost_completeness(run),
        "cachedEvaluations": cached,
        "itemStatus": {
            s: status_counts.get(s, 0) for s in ("ok", "error", "timeout", "cancelled", "pending")
        },
        "errors": status_counts.get(ItemResult.Status.ERROR, 0),
        "timeouts": status_counts.get(ItemResult.Status.TIMEOUT, 0),
        "evaluationErrors": sum(eval_errors.values()),
        "traceNotCaptured": trace_store.not_captured(run.id),
        **run_summary.intercept_summary(run),
        "scores": per_evaluator,
        **({"repetitions": extra["repetitions"]} if extra["repetitions"] else {}),
    }


def scores_by_item(run: Run) -> dict[str, dict[str, list[float]]]:
    by_item: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for chunk in selectors._scored_rows(run.id):  # the same query, in the database's order
        for _, evaluator, key, score in chunk:
            by_item[key][evaluator].append(score)
    keys = ItemResult.objects.filter(run=run).order_by("item_key").values_list("item_key")
    return {key: by_item[key] for key in dict.fromkeys(k for (k,) in keys) if key in by_item}


def old_describe(scores: list[float], errors: int, mark: float | None) -> dict[str, Any]:
    values = sorted(float(s) for s in scores)
    n = len(values)
    mark = verdict.pass_mark(mark)
    if n == 0:
        empty = dict.fromkeys(("avg", "min", "max", "p50", "p95", "p99", "stddev"))
        return {**empty, "count": 0, "errors": errors, "passRate": None, "passMark": mark}
    mean = math.fsum(values) / n
    return {
        "avg": mean,
        "min": values[0],
        "max": values[-1],
        **{f"p{p}": stats.percentile(values, p) for p in (50, 95, 99)},
        "stddev": math.sqrt(math.fsum((v - mean) ** 2 for v in values) / n),
        "count": n,
        "errors": errors,
        "passRate": sum(1 for v in values if verdict.passes(v, mark)) / n,
        "passMark": mark,
    }


def old_latency_stats(latencies: list[float]) -> dict[str, float | None]:
    values = sorted(latencies)
    if not values:
        return dict.fromkeys(("avg", "p50", "p95", "p99", "max"))
    return {
        "avg": math.fsum(values) / len(values),
        **{f"p{p}": stats.percentile(values, p) for p in (50, 95, 99)},
        "max": values[-1],
    }


def old_run_statistics(by_item, names: list[str], runs: int) -> dict[str, Any]:
    ci95: dict[str, Any] = {}
    pass_k: dict[str, Any] = {}
    for name in names:
        per_item = [by[name] for by in by_item.values() if by.get(name)]
        means = np.asarray([sum(values) / len(values) for values in per_item], dtype=float)
        ci95[name] = significance.mean_ci(means)
        if runs > 1:
            table = old_pass_k_table(per_item, runs)
            if table is not None:
                pass_k[name] = table
    repeated = {
        key: {
            name: significance.describe_repetitions(values) for name, values in by.items() if values
        }
        for key, by in by_item.items()
        if any(len(values) > 1 for values in by.values())
    }
    repetitions = {"runs": runs, "items": repeated} if repeated else None
    return {"ci95": ci95, "passAtK": pass_k, "repetitions": repetitions}


def old_pass_k_table(per_item: list[list[float]], k_max: int) -> dict[str, Any] | None:
    items = [list(values) for values in per_item if len(values)]
    if not items or not significance.is_binary(v for values in items for v in values):
        return None
    at, hat, counted = {}, {}, {}
    for k in range(1, k_max + 1):
        eligible = [values for values in items if len(values) >= k]
        if not eligible:
            break
        pairs = [significance.pass_at_k(int(sum(values)), len(values), k) for values in eligible]
        at[str(k)] = math.fsum(p[0] for p in pairs) / len(pairs)
        hat[str(k)] = math.fsum(p[1] for p in pairs) / len(pairs)
        counted[str(k)] = len(pairs)
    return {"k": max(int(k) for k in at), "passAtK": at, "passHatK": hat, "items": counted}
