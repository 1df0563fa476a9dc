"""The one verdict rule: did an evaluation pass, and did an item?

Every door asks these functions — the terminal, summaries and the results file, exports, JUnit
and GitHub annotations, CI gates, MCP, the API, `ExperimentReport`, the pytest plugin, flaky
detection and the pages — so a score means the same thing wherever it is read.

An evaluation passes when its score reaches its evaluator's pass mark (`pass_threshold`, 0.5
by default); a passing score less than `BORDERLINE_MARGIN` above the mark is borderline (it
passes, only just). An evaluation error is neither a pass nor a fail; an item with one is not
passed (its verdict is `ERROR` unless another evaluation failed).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any

DEFAULT_PASS_THRESHOLD = 0.5
BORDERLINE_MARGIN = 0.1


class Verdict(StrEnum):
    PASS = "pass"
    BORDERLINE = "borderline"  # passed, by less than BORDERLINE_MARGIN
    FAIL = "fail"
    ERROR = "error"  # the evaluation (or the item) errored: neither pass nor fail
    NONE = "none"  # nothing to judge (no score yet)

    @property
    def passed(self) -> bool | None:
        """True for pass and borderline, False for fail, None when nothing was judged."""
        if self in (Verdict.PASS, Verdict.BORDERLINE):
            return True
        if self is Verdict.FAIL:
            return False
        return None


def pass_mark(threshold: float | None) -> float:
    """An evaluator's pass mark: its `pass_threshold`, or the default."""
    return DEFAULT_PASS_THRESHOLD if threshold is None else float(threshold)


def score_verdict(score: float | None, threshold: float | None = None) -> Verdict:
    """The verdict of a score against a pass mark (`None`: the default mark)."""
    if score is None:
        return Verdict.NONE
    mark = pass_mark(threshold)
    if score < mark:
        return Verdict.FAIL
    # A perfect score is never borderline, however close to 1 the mark is.
    return Verdict.BORDERLINE if score < min(mark + BORDERLINE_MARGIN, 1.0) else Verdict.PASS


def evaluation_verdict(
    score: float | None, threshold: float | None = None, *, error: bool = False
) -> Verdict:
    """The verdict of one evaluation: an errored one (or one without a score) is `ERROR`."""
    if error or score is None:
        return Verdict.ERROR
    return score_verdict(score, threshold)


def passes(score: float | None, threshold: float | None = None) -> bool | None:
    """Whether a score passes its mark; None without a score."""
    return score_verdict(score, threshold).passed


def item_verdict(evaluations: Iterable[Verdict], *, errored: bool = False) -> Verdict:
    """An item's verdict: `ERROR` when the item itself errored (or timed out); `FAIL` when any
    evaluation failed; `ERROR` when an evaluation errored and none failed (a check that could
    not run leaves the item unproven, as an exception in a pytest test is an error, not a
    pass); `PASS` (or `BORDERLINE`) when every evaluation passed; `NONE` without evaluations."""
    if errored:
        return Verdict.ERROR
    verdicts = list(evaluations)
    if Verdict.FAIL in verdicts:
        return Verdict.FAIL
    if Verdict.ERROR in verdicts:
        return Verdict.ERROR
    if Verdict.BORDERLINE in verdicts:
        return Verdict.BORDERLINE
    return Verdict.PASS if Verdict.PASS in verdicts else Verdict.NONE


def pass_marks(evaluators: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Each described evaluator's pass mark (a run's `config["evaluators"]`, or
    `Evaluator.describe()` results), by name."""
    return {
        described["name"]: pass_mark(described.get("pass_threshold"))
        for described in evaluators
        if described.get("name")
    }


def sorted_pass_rate(scores: Sequence[float], threshold: float | None = None) -> float | None:
    """`pass_rate` of scores sorted in ascending order (NaN last, as numpy sorts them): those
    below the mark come first, one binary search counts them (a run's summary: 50,000
    scores one at a time took 40 ms)."""
    if not len(scores):
        return None
    below = bisect.bisect_left(scores, pass_mark(threshold))
    return (len(scores) - below) / len(scores)


def pass_rate(scores: Iterable[float], threshold: float | None = None) -> float | None:
    """The share of scores that pass their mark; None without scores. Counted as they come:
    a run's summary passes an array of a million."""
    counted = passed = 0
    for score in scores:
        counted += 1
        passed += bool(passes(score, threshold))
    return passed / counted if counted else None
