"""Score statistics. Only scored evaluations enter them; errors are counted beside them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cobalt import verdict

if TYPE_CHECKING:
    import numpy as np

SCORE_RANGE = (0.0, 1.0)  # every score (a function's score outside it is an evaluation error)


def clip_to_score_range(value: float) -> float:
    """A bound of an interval over scores, kept to the values scores can take."""
    low, high = SCORE_RANGE
    return min(high, max(low, value))


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Linear interpolation at rank p/100 · (n − 1) of already sorted values."""
    if len(sorted_values) == 0:
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
    beside it as `passMark`.

    The scores are sorted as one array of floats (a run's summary passes a million of them:
    8 bytes each, where a list of Python floats takes 32)."""
    values = _sorted_array(scores)
    n = int(values.size)
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
    variance = math.fsum((float(v) - mean) ** 2 for v in values) / n
    return {
        "avg": mean,
        "min": float(values[0]),
        "max": float(values[-1]),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "stddev": math.sqrt(variance),
        "count": n,
        "errors": errors,
        "passRate": verdict.sorted_pass_rate(values, mark),
        "passMark": mark,
    }


def latency_stats(latencies: Sequence[float]) -> dict[str, float | None]:
    values = _sorted_array(latencies)
    if values.size == 0:
        return {"avg": None, "p50": None, "p95": None, "p99": None, "max": None}
    return {
        "avg": math.fsum(values) / values.size,
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": float(values[-1]),
    }


def _sorted_array(values: Sequence[float]) -> np.ndarray:
    import numpy as np  # here: only a run's end sorts its scores, not every `cobalt` start

    return np.sort(np.asarray(values, dtype=float))
