"""Which variant of a sweep is best, and which differences are real: plain functions over
arrays (no ORM), on the paired tests `compare` uses (`significance.paired_values`).

Per variant and item key: its *quality* (the mean of its evaluators' scores, over its
repetitions) and whether it *passed* (every evaluator at its pass mark: `cobalt.verdict`).
Variants are ranked by mean quality; each is compared with the best one on the items both
scored (Wilcoxon's signed-rank test, McNemar's when every value is 0 or 1), and the p-values
of those comparisons are corrected together with Holm's step-down method, so "significantly
worse than the best" survives looking at many variants at once. An item that errored is not
a score of 0: it is counted beside the scores, and the test pairs the items both scored.

The Pareto front is over quality (higher), cost and p50 latency (lower): a variant is on it
when no other is at least as good on all three and better on one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cobalt import significance, verdict

ALPHA = significance.ALPHA
WORSE = "worse than the best"
SAME = "not significantly different from the best"
BEST = "best"
NO_DATA = "not enough data"
# Above this many paired items a comparison's interval is Student's t, not the bootstrap: a
# sweep makes one comparison per variant, and 2,000 resamples of 10,000 pairs take ~1 s each.
BOOTSTRAP_MAX_PAIRS = 2_000


@dataclass
class VariantData:
    """What one variant's run measured (`keys` sorted; NaN where an item has no score)."""

    label: str
    values: dict[str, Any]
    run_id: str
    status: str
    keys: np.ndarray
    quality: np.ndarray
    passed: np.ndarray
    items: int = 0
    errors: int = 0
    first_error: str = ""
    latency_p50: float | None = None
    latency_p95: float | None = None
    tokens: int = 0
    cost: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def item_quality(
    scores: Mapping[str, np.ndarray], marks: Mapping[str, float], size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per key: the mean of the evaluators' scores, and 1.0/0.0 for passed/failed by the one
    verdict rule (NaN for both where no evaluator scored it)."""
    if not scores:
        empty = np.full(size, np.nan)
        return empty, empty.copy()
    stacked = np.vstack([np.asarray(v, dtype=float) for v in scores.values()])
    scored = ~np.isnan(stacked)
    counts = scored.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        quality = np.where(counts > 0, np.nansum(stacked, axis=0) / np.maximum(counts, 1), np.nan)
    failing = np.zeros(size, dtype=bool)
    for name, column in scores.items():
        column = np.asarray(column, dtype=float)
        mark = verdict.pass_mark(marks.get(name))
        failing |= ~np.isnan(column) & (column < mark)
    passed = np.where(counts > 0, (~failing).astype(float), np.nan)
    return quality, passed


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None; the family is the others)."""
    present = [(p, i) for i, p in enumerate(p_values) if p is not None]
    present.sort()
    m = len(present)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, index) in enumerate(present):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[index] = running
    return adjusted


LATENCY_TIE_MS = 1.0  # latencies closer than this, or than LATENCY_TIE_SHARE of the larger,
LATENCY_TIE_SHARE = 0.10  # tie on the Pareto front: timing noise must not make a front


def _latency_tie(a: float, b: float) -> bool:
    return abs(a - b) <= max(LATENCY_TIE_MS, LATENCY_TIE_SHARE * max(a, b))


def pareto_front(points: Mapping[str, tuple[float, float, float]]) -> set[str]:
    """Labels not dominated on (quality ↑, cost ↓, latency ↓): no other variant is at least as
    good on all three and better on one (latencies within noise count as equal)."""

    def dominates(o: tuple[float, float, float], p: tuple[float, float, float]) -> bool:
        (oq, oc, ol), (q, c, lat) = o, p
        same_latency = _latency_tie(ol, lat)
        no_worse = oq >= q - 1e-12 and oc <= c + 1e-12 and (same_latency or ol < lat)
        better = oq > q + 1e-12 or oc < c - 1e-12 or (not same_latency and ol < lat)
        return no_worse and better

    return {
        label
        for label, point in points.items()
        if not any(dominates(o, point) for other, o in points.items() if other != label)
    }


def paired(a: VariantData, b: VariantData, alpha: float) -> dict[str, Any]:
    """B against A on the keys both scored (A the baseline: delta = B − A)."""
    if len(a.keys) == len(b.keys) and np.array_equal(a.keys, b.keys):
        qa, qb = a.quality, b.quality
    else:
        shared, at_a, at_b = np.intersect1d(a.keys, b.keys, return_indices=True)
        qa, qb = a.quality[at_a], b.quality[at_b]
    both = ~np.isnan(qa) & ~np.isnan(qb)
    qa, qb = qa[both], qb[both]
    if len(qa) <= BOOTSTRAP_MAX_PAIRS:
        entry = significance.paired_values(qa, qb, only_a=(0, []), only_b=(0, []), alpha=alpha)
        return {k: entry[k] for k in ("n", "test", "delta", "ci", "pValue", "verdict", "kind")}
    # Many pairs: the same tests, and the t-interval of the mean difference (which the
    # bootstrap matches to the third decimal at this size) instead of 2,000 resamples.
    differences = qb - qa
    binary = significance.is_binary(qa) and significance.is_binary(qb)
    if binary:
        p_value = significance.mcnemar(
            int(np.sum((qa == 1) & (qb == 0))), int(np.sum((qa == 0) & (qb == 1)))
        )
    else:
        p_value = significance.wilcoxon(differences)
    delta = float(differences.mean())
    sem = float(differences.std(ddof=1)) / np.sqrt(len(differences))
    low, high = significance.t_interval(delta, sem, len(differences) - 1, 1 - alpha)
    return {
        "n": int(len(differences)),
        "test": "mcnemar" if binary else "wilcoxon",
        "delta": delta,
        "ci": {"low": low, "high": high, "level": 1 - alpha, "method": "t"},
        "pValue": p_value,
        "verdict": significance.verdict(delta, p_value, alpha=alpha),
        "kind": "pass/fail" if binary else "score",
    }


def totals(data: VariantData) -> dict[str, Any]:
    scored = data.quality[~np.isnan(data.quality)]
    passes = data.passed[~np.isnan(data.passed)]
    n = int(passes.size)
    rate = float(passes.mean()) if n else None
    interval = significance.wilson_interval(int(passes.sum()), n) if n else None
    return {
        "label": data.label,
        "values": data.values,
        "runId": data.run_id,
        "status": data.status,
        "items": data.items,
        "scored": int(scored.size),
        "passRate": rate,
        "passRateCI": list(interval) if interval else None,
        "meanScore": float(scored.mean()) if scored.size else None,
        "latencyP50": data.latency_p50,
        "latencyP95": data.latency_p95,
        "tokens": data.tokens,
        "cost": data.cost,
        "errors": data.errors,
        "firstError": data.first_error,
        **data.extra,
    }


def _rank_key(row: dict[str, Any]) -> tuple:
    score = row["meanScore"]
    return (score is None, -(score or 0.0), -(row["passRate"] or 0.0), row["cost"])


def analyse(
    variants: Sequence[VariantData], *, default: str | None = None, alpha: float = ALPHA
) -> dict[str, Any]:
    """The sweep's verdict: totals per variant, ranking, tests against the best (Holm),
    the Pareto front, and a sentence saying which variant is best and why."""
    alpha = significance.check_alpha(alpha)
    rows = [totals(v) for v in variants]
    by_label = {v.label: v for v in variants}
    ranked = sorted(rows, key=_rank_key)
    best = ranked[0]["label"] if ranked and ranked[0]["meanScore"] is not None else None
    tests = []
    for row in ranked:
        row["rank"] = ranked.index(row) + 1
        if best is None or row["label"] == best:
            row["vsBest"] = None
            continue
        row["vsBest"] = paired(by_label[best], by_label[row["label"]], alpha)
        tests.append(row)
    adjusted = holm([r["vsBest"]["pValue"] for r in tests])
    for row, p_holm in zip(tests, adjusted, strict=True):
        entry = row["vsBest"]
        entry["pHolm"] = p_holm
        worse = p_holm is not None and p_holm < alpha and (entry["delta"] or 0) < 0
        entry["significant"] = bool(p_holm is not None and p_holm < alpha)
        entry["verdict"] = NO_DATA if p_holm is None else (WORSE if worse else SAME)
    points = {
        r["label"]: (r["meanScore"], r["cost"], r["latencyP50"] or 0.0)
        for r in ranked
        if r["meanScore"] is not None
    }
    front = pareto_front(points)
    for row in ranked:
        row["pareto"] = row["label"] in front
        row["isBest"] = row["label"] == best
        row["isDefault"] = row["label"] == default
    result = {
        "alpha": alpha,
        "correction": "holm",
        "best": best,
        "default": default,
        "ranking": [r["label"] for r in ranked],
        "variants": ranked,
        "pareto": [r["label"] for r in ranked if r["pareto"]],
    }
    result["verdict"] = explain(result)
    return result


def explain(result: Mapping[str, Any]) -> str:
    """Which variant is best and why, in one paragraph (terminal, page, MCP)."""
    rows = result["variants"]
    best = result["best"]
    if best is None:
        return "No variant has a score yet: every item errored or nothing was evaluated."
    top = rows[0]
    worse = [r["label"] for r in rows[1:] if r["vsBest"] and r["vsBest"]["verdict"] == WORSE]
    tied = [r["label"] for r in rows[1:] if r["vsBest"] and r["vsBest"]["verdict"] == SAME]
    text = f"Best: {best} (mean score {top['meanScore']:.3f}"
    if top["passRate"] is not None:
        text += f", pass rate {top['passRate']:.0%}"
    text += ")."
    if worse:
        text += f" Significantly worse after Holm at α {result['alpha']:g}: {', '.join(worse)}."
    if tied:
        text += f" Not distinguishable from it on these items: {', '.join(tied)}"
        cheaper = [r["label"] for r in rows if r["label"] in tied and r["pareto"]]
        text += f" (of these, on the Pareto front: {', '.join(cheaper)})." if cheaper else "."
    failed = [r["label"] for r in rows if r["meanScore"] is None]
    if failed:
        text += f" Without any score (every item errored): {', '.join(failed)}."
    return text
