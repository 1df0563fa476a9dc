"""Score statistics. Only scored evaluations enter them; errors are counted beside them."""

from __future__ import annotations

import math
from collections.abc import Sequence

from cobalt import verdict

SCORE_RANGE = (0.0, 1.0)  # every score (a function's score outside it is an evaluation error)


def clip_to_score_range(value: float) -> float:
    """A bound of an interval over scores, kept to the values scores can take."""
    low, high = SCORE_RANGE
    return min(high, max(low, value))


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Linear interpolation at rank p/100 · (n − 1) of already sorted values."""
    if not sorted_values:
        return None
    rank = (p / 100) * (len(sorted_values) - 1)
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return float(sorted_values[low])
    fraction = rank - low
    return float(sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction)


def describe(
    scores: Sequence[float], *, errors: int = 0, pass_mark: float | None = None
) -> dict[str, float | int | None]:
    """avg, min, max, p50, p95, p99, population stddev, count, errors, and the pass rate at
    the evaluator's pass mark (`verdict.pass_mark`: the default when None), which is kept
    beside it as `passMark`."""
    values = sorted(float(s) for s in scores)
    n = len(values)
    mark = verdict.pass_mark(pass_mark)
    if n == 0:
        return {
            "avg": None,
            "min": None,
            "max": None,
            "p50": None,
            "p95": None,
            "p99": None,
            "stddev": None,
            "count": 0,
            "errors": errors,
            "passRate": None,
            "passMark": mark,
        }
    mean = math.fsum(values) / n
    variance = math.fsum((v - mean) ** 2 for v in values) / n
    return {
        "avg": mean,
        "min": values[0],
        "max": values[-1],
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "stddev": math.sqrt(variance),
        "count": n,
        "errors": errors,
        "passRate": verdict.pass_rate(values, mark),
        "passMark": mark,
    }


def latency_stats(latencies: Sequence[float]) -> dict[str, float | None]:
    values = sorted(latencies)
    if not values:
        return {"avg": None, "p50": None, "p95": None, "p99": None, "max": None}
    return {
        "avg": math.fsum(values) / len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": values[-1],
    }
