"""How far a judge agrees with people, whether it is certified, and pass rates corrected for it.

Pure statistics over verdicts (True: pass, the positive class; False: fail): the pages, the
terminal, the API, MCP, the results file and the CI gate all read these types.

Interval methods, and why:

- Cohen's κ: the large-sample variance of Fleiss, Cohen & Everitt (1969), κ ± 1.96·SE, clipped
  to [-1, 1]. It is exact in form for 2×2 tables, needs no resampling (the CI gate and the
  pages compute it for every evaluator) and covers the true κ in ~95% of simulated label sets
  of 100+ labels (tests/test_calibration_stats.py).
- True-positive and true-negative rates: Wilson score intervals (scipy's
  `binomtest(...).proportion_ci(method="wilson")`); unlike the normal (Wald) interval they stay
  inside [0, 1] and keep their coverage at rates near 1, where a good judge lives.
- Spearman's ρ: scipy's `spearmanr`, when the judge's scores are continuous.
- The corrected pass rate: Rogan–Gladen, (p + TNR − 1)/(TPR + TNR − 1) clipped to [0, 1], with a
  seeded parametric bootstrap over both sources of error: the run's pass rate p and the judge's
  TPR and TNR are each drawn from their Jeffreys Beta(k + ½, n − k + ½) distribution, and the
  interval is the 2.5/97.5 percentiles of the corrected rates. A delta-method interval breaks
  down where the correction is non-linear (a denominator near 0, a clipped estimate), and a
  plain binomial bootstrap collapses to a point when a rate is observed as exactly 1; Jeffreys
  draws keep the uncertainty of a perfect-looking judge.
- Agreement between reviewers: Cohen's κ for two reviewers (on the items both labelled),
  Krippendorff's α (nominal) for three or more, since it takes items labelled by any subset of
  reviewers, which Fleiss' κ does not.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

MIN_AGREEMENT_LABELS = 10  # below this, no κ or rate is shown: a handful says nothing
DEFAULT_MIN_LABELS = 30  # per class, for a certificate
DEFAULT_MIN_RATE = 0.80  # both 95% lower bounds (TPR, TNR) must reach it
CONFIDENCE = 0.95
_Z = 1.959963984540054
BOOTSTRAP_DRAWS = 4000

NOT_ENOUGH = "not enough labels"
ONE_CLASS = "κ undefined: all labels one class"


@dataclass(frozen=True)
class Rate:
    """A rate (TPR or TNR) with its Wilson 95% interval; None values when it has no cases."""

    successes: int
    total: int
    value: float | None
    low: float | None
    high: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "successes": self.successes,
            "total": self.total,
            "value": self.value,
            "low": self.low,
            "high": self.high,
        }


@dataclass(frozen=True)
class Agreement:
    """A judge's agreement with people on `n` labelled items.

    The confusion matrix is at the pass mark: `tp` judge pass / human pass, `fn` judge fail /
    human pass, `fp` judge pass / human fail, `tn` judge fail / human fail. `state` is "ok", or
    says why there are no numbers (`kappa` and the rates are then None): "not enough labels",
    "κ undefined: all labels one class". The rates have their own cases: with only pass labels
    there is a TPR and no TNR."""

    n: int
    tp: int
    fn: int
    fp: int
    tn: int
    state: str
    kappa: float | None
    kappa_low: float | None
    kappa_high: float | None
    tpr: Rate
    tnr: Rate
    spearman: float | None = None
    observed_agreement: float | None = None

    @property
    def human_pass(self) -> int:
        return self.tp + self.fn

    @property
    def human_fail(self) -> int:
        return self.fp + self.tn

    @property
    def ok(self) -> bool:
        return self.state == "ok"

    def as_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "state": self.state,
            "confusion": {"tp": self.tp, "fn": self.fn, "fp": self.fp, "tn": self.tn},
            "labels": {"pass": self.human_pass, "fail": self.human_fail},
            "observed_agreement": self.observed_agreement,
            "kappa": self.kappa,
            "kappa_low": self.kappa_low,
            "kappa_high": self.kappa_high,
            "tpr": self.tpr.as_dict(),
            "tnr": self.tnr.as_dict(),
            "spearman": self.spearman,
        }


def wilson(successes: int, total: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval of `successes` out of `total` (total > 0), as scipy's
    `binomtest(...).proportion_ci(method="wilson")` gives it (tests check), in closed form:
    importing scipy.stats costs every `cobalt run` half a second."""
    z = _Z if confidence == CONFIDENCE else statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, centre - half), min(1.0, centre + half)


def _rate(successes: int, total: int, enough: bool) -> Rate:
    if total == 0 or not enough:
        return Rate(successes, total, None, None, None)
    low, high = wilson(successes, total)
    return Rate(successes, total, successes / total, low, high)


def kappa_interval(tp: int, fn: int, fp: int, tn: int) -> tuple[float, float, float] | None:
    """Cohen's κ of a 2×2 table and its 95% interval (Fleiss, Cohen & Everitt 1969 variance);
    None when κ is undefined (chance agreement is 1)."""
    import numpy as np  # here: `cobalt run` reads calibration, rarely computes one

    n = tp + fn + fp + tn
    if n == 0:
        return None
    table = np.array([[tn, fp], [fn, tp]], dtype=float) / n  # rows: human, columns: judge
    rows, cols = table.sum(axis=1), table.sum(axis=0)
    observed = float(np.trace(table))
    chance = float(rows @ cols)
    if chance >= 1.0:
        return None
    kappa = (observed - chance) / (1 - chance)
    diagonal = sum(table[i, i] * (1 - (rows[i] + cols[i]) * (1 - kappa)) ** 2 for i in range(2))
    off = sum(table[i, j] * (cols[i] + rows[j]) ** 2 for i in range(2) for j in range(2) if i != j)
    variance = (diagonal + (1 - kappa) ** 2 * off - (kappa - chance * (1 - kappa)) ** 2) / (
        n * (1 - chance) ** 2
    )
    se = math.sqrt(max(variance, 0.0))
    return kappa, max(-1.0, kappa - _Z * se), min(1.0, kappa + _Z * se)


def _spearman(judge_scores: Sequence[float] | None, human: Sequence[float]) -> float | None:
    if judge_scores is None or len(set(judge_scores)) < 3 or len(set(human)) < 2:
        return None
    from scipy import stats  # here: scipy.stats costs half a second to import

    rho = stats.spearmanr(judge_scores, human).statistic
    return None if math.isnan(rho) else float(rho)


def agreement(
    judge: Sequence[bool],
    human: Sequence[bool],
    *,
    judge_scores: Sequence[float] | None = None,
    human_scores: Sequence[float] | None = None,
    min_labels: int = MIN_AGREEMENT_LABELS,
) -> Agreement:
    """The judge's verdicts against people's on the same items (pass = True).

    Below `min_labels` labelled items the state is "not enough labels" and no κ or rate is
    given; when every label is one class κ is undefined and said so. Spearman's ρ is given when
    the judge's scores are continuous (3+ distinct values), against `human_scores` or else the
    human verdicts."""
    if len(judge) != len(human):
        raise ValueError(f"{len(judge)} judge verdicts against {len(human)} labels")
    pairs = list(zip((bool(j) for j in judge), (bool(h) for h in human), strict=True))
    tp = sum(1 for j, h in pairs if j and h)
    fn = sum(1 for j, h in pairs if not j and h)
    fp = sum(1 for j, h in pairs if j and not h)
    tn = len(pairs) - tp - fn - fp
    n = len(pairs)
    enough = n >= min_labels
    tpr, tnr = _rate(tp, tp + fn, enough), _rate(tn, tn + fp, enough)
    if not enough:
        return Agreement(n, tp, fn, fp, tn, NOT_ENOUGH, None, None, None, tpr, tnr)
    interval = None if tp + fn == 0 or fp + tn == 0 else kappa_interval(tp, fn, fp, tn)
    state = "ok" if interval else ONE_CLASS
    humans = human_scores if human_scores is not None else [float(h) for _, h in pairs]
    return Agreement(
        n,
        tp,
        fn,
        fp,
        tn,
        state,
        *(interval if interval else (None, None, None)),
        tpr,
        tnr,
        spearman=_spearman(judge_scores, humans),
        observed_agreement=(tp + tn) / n,
    )


# The certificate ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Certificate:
    """Whether a judge is calibrated: `min_labels` labels of each class and both Wilson 95%
    lower bounds (TPR, TNR) at `min_rate` or above. `needed` counts the labels still missing per
    class ("pass", "fail"); `reasons` say in words what is missing."""

    calibrated: bool
    min_labels: int
    min_rate: float
    needed: dict[str, int]
    reasons: list[str] = field(default_factory=list)

    @property
    def summary(self) -> str:
        if self.calibrated:
            return "calibrated"
        return "not calibrated: " + "; ".join(self.reasons)

    def as_dict(self) -> dict[str, Any]:
        return {
            "calibrated": self.calibrated,
            "summary": self.summary,
            "min_labels": self.min_labels,
            "min_rate": self.min_rate,
            "needed": dict(self.needed),
            "reasons": list(self.reasons),
        }


def labels_to_reach(rate: Rate, min_rate: float, cap: int = 10_000) -> int | None:
    """How many more labels of the class, agreeing at the observed rate, lift the Wilson lower
    bound to `min_rate`; None when the observed rate itself is below it (labels won't help)."""
    if rate.total == 0 or rate.value is None or rate.value <= min_rate:
        return None
    total = rate.total
    while total - rate.total <= cap:
        if wilson(round(rate.value * total), total)[0] >= min_rate:
            return total - rate.total
        total += max(1, total // 20)
    return None


def _rate_reason(name: str, cls: str, rate: Rate, min_rate: float) -> tuple[str, int]:
    more = labels_to_reach(rate, min_rate)
    low = f"{rate.low:.2f}" if rate.low is not None else "none"
    if more is None:
        return (
            f"{name} lower bound {low} < {min_rate:.2f} (observed {rate.value:.2f}): "
            "the judge disagrees with reviewers too often; improve the judge",
            0,
        )
    return f"{name} lower bound {low} < {min_rate:.2f}: ~{more} more '{cls}' labels needed", more


def certify(
    result: Agreement, *, min_labels: int = DEFAULT_MIN_LABELS, min_rate: float = DEFAULT_MIN_RATE
) -> Certificate:
    """The certificate of an agreement (see `Certificate`)."""
    needed = {
        "pass": max(0, min_labels - result.human_pass),
        "fail": max(0, min_labels - result.human_fail),
    }
    reasons = [f"{count} more '{cls}' labels needed" for cls, count in needed.items() if count]
    if not reasons:
        rates = (("TPR", "pass", result.tpr), ("TNR", "fail", result.tnr))
        for name, cls, rate in rates:
            if rate.low is None or rate.low < min_rate:
                reason, more = _rate_reason(name, cls, rate, min_rate)
                reasons.append(reason)
                needed[cls] = more
    return Certificate(not reasons, min_labels, min_rate, needed, reasons)


# Corrected pass rates -----------------------------------------------------------------------


@dataclass(frozen=True)
class CorrectedRate:
    """A pass rate corrected for the judge's error rates, with its 95% interval (bootstrap over
    the run's sampling and the calibration); `value` None with `state` saying why."""

    raw: float
    value: float | None
    low: float | None
    high: float | None
    state: str
    method: str = "Rogan–Gladen, parametric bootstrap (Jeffreys draws) over run and labels"

    def as_dict(self) -> dict[str, Any]:
        return {
            "raw": self.raw,
            "value": self.value,
            "low": self.low,
            "high": self.high,
            "state": self.state,
            "method": self.method,
        }


def rogan_gladen(p: Any, tpr: Any, tnr: Any) -> Any:
    """(p + TNR − 1)/(TPR + TNR − 1), clipped to [0, 1]; NaN where the judge is no better than
    chance (TPR + TNR ≤ 1). Works on numbers and numpy arrays."""
    import numpy as np

    p, tpr, tnr = np.asarray(p, float), np.asarray(tpr, float), np.asarray(tnr, float)
    denominator = tpr + tnr - 1
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.where(denominator > 0, (p + tnr - 1) / denominator, np.nan)
    return np.clip(value, 0.0, 1.0)


def corrected_pass_rate(
    passes: int,
    n: int,
    result: Agreement,
    *,
    draws: int = BOOTSTRAP_DRAWS,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> CorrectedRate:
    """The true pass rate of a run whose judge passed `passes` of `n` items, corrected for the
    judge's TPR and TNR measured in `result` (see the module docstring for the interval)."""
    import numpy as np

    raw = passes / n if n else 0.0
    if n == 0:
        return CorrectedRate(raw, None, None, None, "no judged items")
    if not result.ok or result.tpr.value is None or result.tnr.value is None:
        state = result.state if not result.ok else "needs labels of both classes"
        return CorrectedRate(raw, None, None, None, state)
    estimate = float(rogan_gladen(raw, result.tpr.value, result.tnr.value))
    if math.isnan(estimate):
        return CorrectedRate(raw, None, None, None, "judge no better than chance (TPR+TNR ≤ 1)")
    rng = np.random.default_rng(seed)
    p = rng.beta(passes + 0.5, n - passes + 0.5, draws)
    tpr = rng.beta(result.tp + 0.5, result.fn + 0.5, draws)
    tnr = rng.beta(result.tn + 0.5, result.fp + 0.5, draws)
    sample = rogan_gladen(p, tpr, tnr)
    sample = sample[~np.isnan(sample)]
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(sample, [tail, 100 - tail])
    return CorrectedRate(raw, estimate, float(low), float(high), "ok")


@dataclass(frozen=True)
class CorrectedDelta:
    """B's corrected pass rate minus A's, with its 95% interval; `within_error` when the
    interval holds 0: the change is within the judge's error (and the runs' sampling)."""

    raw: float
    value: float | None
    low: float | None
    high: float | None
    state: str

    @property
    def within_error(self) -> bool:
        return self.value is None or (self.low is not None and self.low <= 0 <= self.high)

    def as_dict(self) -> dict[str, Any]:
        return {
            "raw": self.raw,
            "value": self.value,
            "low": self.low,
            "high": self.high,
            "state": self.state,
            "withinError": self.within_error,
        }


def _draw_rates(rng: np.random.Generator, result: Agreement, draws: int) -> tuple[Any, Any]:
    return (
        rng.beta(result.tp + 0.5, result.fn + 0.5, draws),
        rng.beta(result.tn + 0.5, result.fp + 0.5, draws),
    )


def corrected_delta(
    a: tuple[int, int],
    b: tuple[int, int],
    calibration_a: Agreement,
    calibration_b: Agreement,
    *,
    shared: bool,
    draws: int = BOOTSTRAP_DRAWS,
    seed: int = 0,
) -> CorrectedDelta:
    """The change of the corrected pass rate from run A to run B, each `(passes, n)`. With
    `shared` (the same judge key: the same labels), one draw of the judge's rates corrects
    both runs, so its error cancels where it should; otherwise each is drawn on its own."""
    import numpy as np

    (passes_a, n_a), (passes_b, n_b) = a, b
    raw = (passes_b / n_b if n_b else 0.0) - (passes_a / n_a if n_a else 0.0)
    both = (calibration_a, calibration_b)
    if not n_a or not n_b:
        return CorrectedDelta(raw, None, None, None, "no judged items")
    if any(not c.ok or c.tpr.value is None or c.tnr.value is None for c in both):
        return CorrectedDelta(raw, None, None, None, "a judge without calibration")
    value = float(
        rogan_gladen(passes_b / n_b, calibration_b.tpr.value, calibration_b.tnr.value)
        - rogan_gladen(passes_a / n_a, calibration_a.tpr.value, calibration_a.tnr.value)
    )
    if math.isnan(value):
        return CorrectedDelta(raw, None, None, None, "judge no better than chance (TPR+TNR ≤ 1)")
    rng = np.random.default_rng(seed)
    rates_a = _draw_rates(rng, calibration_a, draws)
    rates_b = rates_a if shared else _draw_rates(rng, calibration_b, draws)
    p_a = rng.beta(passes_a + 0.5, n_a - passes_a + 0.5, draws)
    p_b = rng.beta(passes_b + 0.5, n_b - passes_b + 0.5, draws)
    sample = rogan_gladen(p_b, *rates_b) - rogan_gladen(p_a, *rates_a)
    sample = sample[~np.isnan(sample)]
    low, high = np.percentile(sample, [2.5, 97.5])
    return CorrectedDelta(raw, value, float(low), float(high), "ok")


# Agreement between reviewers ----------------------------------------------------------------


@dataclass(frozen=True)
class ReviewerAgreement:
    """How far reviewers agree among themselves: Cohen's κ (two reviewers) or Krippendorff's α
    (nominal, three or more), on the items labelled by at least two of them."""

    reviewers: int
    items: int  # items with two or more labels
    disagreements: int  # of those, items where reviewers gave different verdicts
    method: str | None
    value: float | None
    state: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "reviewers": self.reviewers,
            "items": self.items,
            "disagreements": self.disagreements,
            "method": self.method,
            "value": self.value,
            "state": self.state,
        }


def krippendorff_alpha(units: Sequence[Sequence[bool]]) -> float | None:
    """Krippendorff's α (nominal) of units each holding the values its raters gave (units with
    fewer than two values are not pairable and are left out); None when undefined."""
    pairable = [list(unit) for unit in units if len(unit) >= 2]
    total = sum(len(unit) for unit in pairable)
    if total < 2:
        return None
    observed = 0.0
    counts = {True: 0, False: 0}
    for unit in pairable:
        ones = sum(1 for v in unit if v)
        zeros = len(unit) - ones
        counts[True] += ones
        counts[False] += zeros
        observed += 2 * ones * zeros / (len(unit) - 1)
    expected = 2 * counts[True] * counts[False] / (total - 1)
    if expected == 0:
        return None
    return 1 - observed / expected


def reviewer_agreement(labels: Mapping[str, Mapping[str, bool]]) -> ReviewerAgreement:
    """Agreement between reviewers: `labels` maps each reviewer to {item: verdict}."""
    reviewers = [name for name, given in labels.items() if given]
    by_item: dict[str, list[bool]] = {}
    for name in reviewers:
        for item, verdict in labels[name].items():
            by_item.setdefault(item, []).append(bool(verdict))
    shared = [values for values in by_item.values() if len(values) >= 2]
    disagreements = sum(1 for values in shared if len(set(values)) > 1)
    base = (len(reviewers), len(shared), disagreements)
    if len(reviewers) < 2:
        return ReviewerAgreement(*base, None, None, "one reviewer: nothing to compare")
    if len(shared) < MIN_AGREEMENT_LABELS:
        return ReviewerAgreement(*base, None, None, NOT_ENOUGH)
    if len(reviewers) == 2:
        first, second = reviewers
        items = [item for item in labels[first] if item in labels[second]]
        result = kappa_interval(
            *_table([labels[second][i] for i in items], [labels[first][i] for i in items])
        )
        value = None if result is None else result[0]
        method = "cohen_kappa"
    else:
        value, method = krippendorff_alpha(shared), "krippendorff_alpha"
    state = "ok" if value is not None else ONE_CLASS
    return ReviewerAgreement(*base, method, value, state)


def _table(judge: Sequence[bool], human: Sequence[bool]) -> tuple[int, int, int, int]:
    pairs = list(zip(judge, human, strict=True))
    return (
        sum(1 for j, h in pairs if j and h),
        sum(1 for j, h in pairs if not j and h),
        sum(1 for j, h in pairs if j and not h),
        sum(1 for j, h in pairs if not j and not h),
    )
