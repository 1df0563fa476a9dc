"""Signal or noise: confidence intervals, paired tests between runs and their verdicts.

Plain functions over lists and dicts (no ORM), built on scipy.stats:

- `mean_ci()`: the confidence interval of a mean — Student's t over scores, Wilson's score
  interval when every value is 0 or 1 (a pass rate).
- `run_statistics()` / `pass_at_k()`: per item, how its scores spread across the
  repetitions of a run; pass@k and pass^k for pass/fail scores.
- `paired_compare()`: one evaluator of two runs over the items both scored, matched by key —
  a paired bootstrap interval of the mean difference and Wilcoxon's signed-rank test
  (McNemar's test when every per-item value is 0 or 1), with a verdict at level `alpha`.

Everything is deterministic: the bootstrap draws from a fixed seed, so the CLI, the pages, the
API and the MCP tool show the same interval for the same two runs. `scipy.stats` takes about
a second to import, so it is imported where a test needs it, not by every `cobalt run`.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain, repeat
from statistics import NormalDist
from typing import Any

import numpy as np

from cobalt.stats import clip_to_score_range

ALPHA = 0.05
CONFIDENCE = 0.95
REGRESSED = "regressed"
IMPROVED = "improved"
NO_CHANGE = "no significant change"
INSUFFICIENT = "not enough data"

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20240917
# Above this many pairs the bootstrap and the t-interval agree to the third decimal (central
# limit theorem) and the t-interval costs nothing; below it the bootstrap makes no assumption.
BOOTSTRAP_MAX_PAIRS = 10_000
# McNemar: exact binomial test below this many discordant pairs, else chi-square (corrected).
MCNEMAR_EXACT_BELOW = 25
# From this many differences, Wilcoxon's p-value is SciPy's normal approximation worked out
# from one sort (`_wilcoxon_sorted`); below it (and for every exact case) SciPy computes it.
WILCOXON_SORTED_FROM = 5_000


def check_alpha(alpha: float) -> float:
    """`alpha` as a float in (0, 0.5]; ValueError with what to pass otherwise."""
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"significance level must be a number like 0.05 (got {alpha!r})") from None
    if not 0 < value <= 0.5 or math.isnan(value):
        raise ValueError(f"significance level must be above 0 and at most 0.5 (got {alpha!r})")
    return value


def is_binary(values: Iterable[float]) -> bool:
    """True when every value is exactly 0 or 1 (and there is at least one)."""
    seen = False
    for value in values:
        if value != 0 and value != 1:
            return False
        seen = True
    return seen


def _all_binary(values: np.ndarray) -> bool:
    return bool(np.all((values == 0) | (values == 1)))


def _f(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def mean_ci(values: Sequence[float], *, level: float = CONFIDENCE) -> dict[str, Any] | None:
    """The `level` confidence interval of the mean of `values`; None with fewer than 2 values.

    0/1 values get Wilson's score interval (stays inside [0, 1] and keeps its coverage near
    0 and 1, where the t-interval collapses); other scores get Student's t-interval, clipped
    to the score range 0..1 (a mean of scores cannot lie outside it).
    """
    data = np.asarray(values, dtype=float)
    n = int(data.size)
    if n < 2:
        return None
    mean = float(data.mean())
    if _all_binary(data):
        low, high = wilson_interval(int(data.sum()), n, level=level)
        method = "wilson"
    else:
        low, high = t_interval(mean, float(data.std(ddof=1)) / math.sqrt(n), n - 1, level)
        low, high = clip_to_score_range(low), clip_to_score_range(high)
        method = "t"
    return {"low": low, "high": high, "mean": mean, "n": n, "level": level, "method": method}


def t_interval(mean: float, sem: float, df: int, level: float) -> tuple[float, float]:
    """mean ± t(df, (1 + level) / 2) · sem."""
    if sem == 0:
        return mean, mean
    half = t_quantile(df, (1 + level) / 2) * sem
    return mean - half, mean + half


# Student's t 0.975 quantiles for df 1..30, as scipy.special.stdtrit gives them. Every run
# summary needs a 95% interval; importing scipy for it costs a third of a second of CPU on
# each `cobalt run`. tests/test_significance.py checks these against scipy.
T_975 = (
    12.706204736175, 4.302652729749, 3.182446305284, 2.776445105198, 2.570581835636,
    2.446911851145, 2.364624251593, 2.306004135204, 2.262157162798, 2.228138851986,
    2.200985160092, 2.178812829667, 2.160368656463, 2.144786687918, 2.13144954556,
    2.119905299221, 2.109815577833, 2.100922040241, 2.093024054408, 2.085963447266,
    2.079613844728, 2.073873067904, 2.068657610419, 2.063898561628, 2.059538552753,
    2.055529438643, 2.05183051648, 2.048407141795, 2.045229642133, 2.042272456301,
)  # fmt: skip


def t_quantile(df: int, p: float) -> float:
    """The p quantile of Student's t with df degrees of freedom.

    The 95% table for small df; above 30 df the Cornish-Fisher expansion around the normal
    quantile (error below 1e-7); anything else from scipy.
    """
    if p == 0.975 and 1 <= df <= len(T_975):
        return T_975[df - 1]
    if df > 30:
        z = NormalDist().inv_cdf(p)
        g1 = (z**3 + z) / 4
        g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
        g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
        g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
        return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4
    from scipy.special import stdtrit

    return float(stdtrit(df, p))


def wilson_interval(successes: int, n: int, *, level: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson's score interval of a proportion (the same as scipy's `proportion_ci`)."""
    z = NormalDist().inv_cdf((1 + level) / 2)
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def describe_repetitions(values: Sequence[float]) -> dict[str, Any]:
    """Mean, population stddev, min, max and count of one item's scores across repetitions."""
    data = np.asarray(values, dtype=float)
    return {
        "mean": float(data.mean()),
        "stddev": float(data.std()),
        "min": float(data.min()),
        "max": float(data.max()),
        "n": int(data.size),
    }


def _comb(n: int, k: int) -> float:
    return float(math.comb(n, k))


def pass_at_k(passes: int, trials: int, k: int) -> tuple[float, float]:
    """(pass@k, pass^k) of one item with `passes` out of `trials`, unbiased for k <= trials.

    pass@k: the chance that at least one of k repetitions drawn without replacement passes
    (Chen et al. 2021); pass^k: the chance that all k pass (Yao et al. 2024, τ-bench).
    """
    if not 1 <= k <= trials:
        raise ValueError(f"k must be between 1 and the number of trials ({trials}), got {k}")
    total = _comb(trials, k)
    at_least_one = 1.0 - _comb(trials - passes, k) / total
    every = _comb(passes, k) / total
    return at_least_one, every


def pass_k_table(tally: Mapping[tuple[int, int], int], k_max: int) -> dict[str, Any] | None:
    """pass@k and pass^k for k = 1..k_max, averaged over items with at least k repetitions.

    `tally`: how many items had each (passes, repetitions) of their 0/1 scores; None without
    items. Items with the same pair count as many times (an exact sum, `math.fsum`).
    """
    if not tally or k_max < 1:
        return None
    at: dict[str, float] = {}
    hat: dict[str, float] = {}
    counted: dict[str, int] = {}
    for k in range(1, k_max + 1):
        eligible = [(pair, n) for pair, n in tally.items() if pair[1] >= k]
        if not eligible:
            break
        pairs = [(pass_at_k(passes, trials, k), n) for (passes, trials), n in eligible]
        items = sum(n for _, n in pairs)
        at[str(k)] = math.fsum(chain.from_iterable(repeat(p[0], n) for p, n in pairs)) / items
        hat[str(k)] = math.fsum(chain.from_iterable(repeat(p[1], n) for p, n in pairs)) / items
        counted[str(k)] = items
    return {"k": max(int(k) for k in at), "passAtK": at, "passHatK": hat, "items": counted}


def run_statistics(
    items: Iterable[tuple[str, Mapping[str, Sequence[float]]]],
    evaluators: Iterable[str],
    *,
    runs: int = 1,
) -> dict[str, Any]:
    """What a run summary needs of its scores, in one pass over its items: (item key,
    evaluator → the item's scores across repetitions), each key once, in the order given.

    - `scores[evaluator]`: all its scores, one array of floats.
    - `ci95[evaluator]`: the 95% interval of the mean over items (each item counted once, at
      the mean of its repetitions, so repeating an item does not narrow the interval).
    - `passAtK[evaluator]`: pass@k and pass^k for k = 1..runs when runs > 1 and the
      evaluator's scores are all 0 or 1.
    - `repetitions`: per item repeated more than once, the spread of each evaluator's scores.

    Per item it keeps 8 bytes for each score and for each evaluator's mean (a million-item
    run's summary holds no Python object per item), and per (passes, repetitions) a count.
    """
    names = list(evaluators)
    scores = {name: array("d") for name in names}
    means = {name: array("d") for name in names}
    # pass@k is for runs > 1: a single run's scores are not tallied (issue 41).
    tallies: dict[str, Counter[tuple[int, int]] | None] = {
        name: Counter() if runs > 1 else None for name in names
    }
    repeated: dict[str, dict[str, dict[str, Any]]] = {}
    for key, by_name in items:
        if by_name and max(map(len, by_name.values())) > 1:
            repeated[key] = {
                name: describe_repetitions(values) for name, values in by_name.items() if values
            }
        for name in names:
            values = by_name.get(name)
            if not values:
                continue
            scores[name].extend(values)
            means[name].append(sum(values) / len(values))
            tally = tallies[name]
            if tally is not None and is_binary(values):
                tally[int(sum(values)), len(values)] += 1
            else:
                tallies[name] = None  # a score that is not 0 or 1: no pass@k
    pass_k: dict[str, Any] = {}
    for name, tally in tallies.items():
        table = pass_k_table(tally, runs) if runs > 1 and tally is not None else None
        if table is not None:
            pass_k[name] = table
    return {
        "scores": {name: np.frombuffer(values, dtype=float) for name, values in scores.items()},
        "ci95": {name: mean_ci(np.frombuffer(means[name], dtype=float)) for name in names},
        "passAtK": pass_k,
        "repetitions": {"runs": runs, "items": repeated} if repeated else None,
    }


# --- paired comparison -----------------------------------------------------------------------


def mcnemar(pass_to_fail: int, fail_to_pass: int, *, exact: bool | None = None) -> float:
    """Two-sided p-value of McNemar's test from the two discordant counts.

    Exact (binomial, p = 0.5) below 25 discordant pairs unless told otherwise; else the
    chi-square statistic with Edwards' continuity correction, (|b − c| − 1)² / (b + c).
    """
    b, c = int(pass_to_fail), int(fail_to_pass)
    if b < 0 or c < 0:
        raise ValueError("McNemar counts must be non-negative")
    discordant = b + c
    if discordant == 0:
        return 1.0
    if exact is None:
        exact = discordant < MCNEMAR_EXACT_BELOW
    from scipy import stats

    if exact:
        return float(stats.binomtest(b, discordant, 0.5).pvalue)
    statistic = (abs(b - c) - 1) ** 2 / discordant
    return float(stats.chi2.sf(statistic, 1))


def wilcoxon(differences: Sequence[float]) -> float | None:
    """Two-sided p-value of Wilcoxon's signed-rank test (zero differences dropped).

    1.0 when no difference is non-zero; None with fewer than 2 differences.
    """
    data = np.asarray(differences, dtype=float)
    if data.size < 2:
        return None
    if not np.any(data != 0):
        return 1.0
    if data.size >= WILCOXON_SORTED_FROM:
        return _wilcoxon_sorted(data[data != 0])
    from scipy import stats

    result = stats.wilcoxon(data, zero_method="wilcox", alternative="two-sided")
    return _f(result.pvalue)


def _wilcoxon_sorted(data: np.ndarray) -> float | None:
    """SciPy's two-sided Wilcoxon signed-rank p-value for many non-zero differences (its
    normal approximation with the tie correction, no continuity correction), with the ranks
    found from sorts of the absolute values instead of an argsort and a rank pass: at 500,000
    pairs ~25 ms of CPU where SciPy takes ~125 ms when scores tie (~90 against ~160 ms when
    none do; the compare page's first visit pays it per evaluator and run)."""
    n = data.size
    magnitudes = np.abs(data)
    ordered = np.sort(magnitudes)
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1], [True])))
    ties = np.diff(starts).astype(float)
    mean_ranks = starts[:-1] + (ties + 1) / 2  # 1-based, averaged over ties
    # How many positive differences each group of equal magnitudes holds: both sorted, so
    # one ordered search of the groups' values among the positive magnitudes counts them.
    positives = np.sort(magnitudes[data > 0])
    below = np.searchsorted(positives, ordered[starts[:-1]], side="right")
    r_plus = float((mean_ranks * np.diff(below, prepend=0)).sum())
    r_minus = n * (n + 1) / 2 - r_plus
    variance = n * (n + 1) * (2 * n + 1) / 24 - float((ties**3 - ties).sum()) / 48
    if variance <= 0:
        return None
    z = (min(r_plus, r_minus) - n * (n + 1) / 4) / math.sqrt(variance)
    return _f(math.erfc(abs(z) / math.sqrt(2)))  # 2·Φ(−|z|), exact far into the tail


def mean_difference_ci(
    differences: Sequence[float],
    *,
    level: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, Any] | None:
    """Paired bootstrap (percentile) interval of the mean difference; t-interval when large."""
    data = np.asarray(differences, dtype=float)
    n = int(data.size)
    if n < 2:
        return None
    mean = float(data.mean())
    if float(np.ptp(data)) == 0.0:
        low = high = mean
        method = "exact"
    elif n > BOOTSTRAP_MAX_PAIRS:
        low, high = t_interval(mean, float(data.std(ddof=1)) / math.sqrt(n), n - 1, level)
        low, high = clip_to_score_range(low), clip_to_score_range(high)
        method = "t"
    else:
        from scipy import stats

        result = stats.bootstrap(
            (data,),
            np.mean,
            confidence_level=level,
            n_resamples=resamples,
            method="percentile",
            rng=np.random.default_rng(seed),
            batch=max(1, 2_000_000 // n),
        )
        low, high = result.confidence_interval.low, result.confidence_interval.high
        method = "bootstrap"
    return {"low": _f(low), "high": _f(high), "level": level, "method": method}


def verdict(delta: float | None, p_value: float | None, *, alpha: float = ALPHA) -> str:
    """regressed / improved when p < alpha (direction: the mean difference B − A)."""
    if delta is None or p_value is None:
        return INSUFFICIENT
    if p_value < alpha and delta < 0:
        return REGRESSED
    if p_value < alpha and delta > 0:
        return IMPROVED
    return NO_CHANGE


def paired_compare(
    a: Mapping[str, float],
    b: Mapping[str, float],
    *,
    alpha: float = ALPHA,
    keys_listed: int = 50,
) -> dict[str, Any]:
    """Compare one evaluator of run A (baseline) and run B (candidate), item by item.

    `a` and `b` map item key → that item's score (its mean over repetitions). Items scored in
    only one run are counted and listed (the first `keys_listed`), never silently dropped.
    """
    keys = sorted(a.keys() & b.keys())
    only_a = sorted(a.keys() - b.keys())
    only_b = sorted(b.keys() - a.keys())
    values_a = np.array([float(a[k]) for k in keys], dtype=float)
    values_b = np.array([float(b[k]) for k in keys], dtype=float)
    return paired_values(
        values_a,
        values_b,
        only_a=(len(only_a), only_a[:keys_listed]),
        only_b=(len(only_b), only_b[:keys_listed]),
        alpha=alpha,
    )


def paired_values(
    values_a: np.ndarray,
    values_b: np.ndarray,
    *,
    only_a: tuple[int, list[str]],
    only_b: tuple[int, list[str]],
    alpha: float = ALPHA,
    interval: bool = True,
) -> dict[str, Any]:
    """`paired_compare()` of scores already paired (`values_a[i]` and `values_b[i]` are one
    item's); `only_*` are (how many items only that run scored, the first of their keys).
    `interval=False` leaves out the interval (`ci` None): its bootstrap is most of the cost
    below 10,000 pairs, and a table of many small tests (a compare's groups) shows only p."""
    alpha = check_alpha(alpha)
    n = len(values_a)
    binary = n > 0 and _all_binary(values_a) and _all_binary(values_b)
    result: dict[str, Any] = {
        "n": n,
        "kind": "pass/fail" if binary else "score",
        "test": "mcnemar" if binary else "wilcoxon",
        "meanA": float(values_a.mean()) if n else None,
        "meanB": float(values_b.mean()) if n else None,
        "delta": float((values_b - values_a).mean()) if n else None,
        "ci": None,
        "pValue": None,
        "alpha": alpha,
        "verdict": INSUFFICIENT,
        "table": None,
        "onlyInA": only_a[0],
        "onlyInB": only_b[0],
        "onlyInAKeys": only_a[1],
        "onlyInBKeys": only_b[1],
    }
    if n < 2:
        return result
    differences = values_b - values_a
    if interval:
        result["ci"] = mean_difference_ci(differences, level=1 - alpha)
    if binary:
        pass_to_fail = int(np.sum((values_a == 1) & (values_b == 0)))
        fail_to_pass = int(np.sum((values_a == 0) & (values_b == 1)))
        result["table"] = {
            "passPass": int(np.sum((values_a == 1) & (values_b == 1))),
            "passFail": pass_to_fail,
            "failPass": fail_to_pass,
            "failFail": int(np.sum((values_a == 0) & (values_b == 0))),
        }
        result["pValue"] = mcnemar(pass_to_fail, fail_to_pass)
    else:
        result["pValue"] = wilcoxon(differences)
    result["verdict"] = verdict(result["delta"], result["pValue"], alpha=alpha)
    return result


def compare_scores(
    scores_a: Mapping[str, Mapping[str, float]],
    scores_b: Mapping[str, Mapping[str, float]],
    evaluators: Iterable[str],
    *,
    alpha: float = ALPHA,
) -> dict[str, dict[str, Any]]:
    """`paired_compare()` for each evaluator; `scores_*` map item key → evaluator → score."""
    result = {}
    for name in evaluators:
        a = {key: by[name] for key, by in scores_a.items() if by.get(name) is not None}
        b = {key: by[name] for key, by in scores_b.items() if by.get(name) is not None}
        result[name] = paired_compare(a, b, alpha=alpha)
    return result


def describe_result(entry: Mapping[str, Any], *, digits: int = 3) -> str:
    """`Δ -0.100 [-0.114, -0.086], p < 0.001 (wilcoxon, 200 items) → regressed`."""
    if entry.get("delta") is None:
        return f"no item scored in both runs → {entry.get('verdict', INSUFFICIENT)}"
    text = f"Δ {entry['delta']:+.{digits}f}"
    ci = entry.get("ci")
    if ci:
        text += f" [{ci['low']:+.{digits}f}, {ci['high']:+.{digits}f}]"
    text += f", {format_p(entry.get('pValue'))} ({entry['test']}, {entry['n']} items)"
    return f"{text} → {entry['verdict']}"


def format_p(p_value: float | None) -> str:
    if p_value is None:
        return "p —"
    if p_value < 0.001:
        return "p < 0.001"
    return f"p = {p_value:.3f}"
