"""CI quality gates: thresholds from the config and the experiment, checked against a run.

`check_run()` and `check_baseline()` are plain functions over a run's summary and settings;
`ci_verdict.gate_runs()` gathers what they need from the database for the runs of one
`cobalt run --ci`.
Score metrics are floors, latency and cost are ceilings; a value equal to its threshold passes
(compared with a tolerance of 1e-9, so float noise in a percentile never fails a gate).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cobalt.config import (
    CI_SETTINGS,
    METRIC_ALIASES,
    SCORE_METRICS,
    Config,
    ConfigError,
    check_thresholds,
)
from cobalt.verdict import DEFAULT_PASS_THRESHOLD, pass_mark

TOLERANCE = 1e-9
SUMMARY_KEYS = {"pass_rate": "passRate"}


@dataclass(frozen=True)
class Check:
    """One gate check. `kind`: floor (actual >= threshold), ceiling (actual <= threshold),
    missing (a named evaluator is not in the run), status, or calibration (a judge without
    its certificate, under `[ci] require_calibrated`). `actual` None: nothing measured."""

    gate: str
    metric: str
    actual: float | str | None
    threshold: float | str | None
    kind: str
    passed: bool
    unit: str = ""
    note: str = ""

    def line(self) -> str:
        """`exact avg 0.5 < 0.8`, `latency p95 2300ms > 2000ms`, `relevance avg missing < 0.8`."""
        threshold = self._fmt(self.threshold, self.actual)
        if self.kind == "significance":  # `--significance`: the paired test says it all
            verdict = "no significant regression" if self.passed else "significant regression"
            return f"{self.gate} {verdict}: {self.note}"
        if self.kind == "sweep":  # `[ci.sweep]`: the sweep's paired test says it all
            return (
                f"{self.gate} {self.metric}: {'passed' if self.passed else 'FAILED'}: {self.note}"
            )
        if self.kind == "calibration":  # `[ci] require_calibrated`: the certificate says it all
            return f"{self.gate}: judge not calibrated, not gating on it: {self.note}"
        if self.kind == "status":
            text = f"{self.gate} {self.metric} {self.actual} != {self.threshold}"
        elif self.kind == "missing":
            text = f"{self.gate} {self.metric} missing"
            text += f" < {threshold}" if self.threshold is not None else ""
        else:
            floor = self.kind == "floor"
            signs = (">=", "<=") if self.passed else ("<", ">")
            sign = signs[0] if floor else signs[1]
            actual = "none" if self.actual is None else self._fmt(self.actual, self.threshold)
            text = f"{self.gate} {self.metric} {actual} {sign} {threshold}"
        return f"{text} ({self.note})" if self.note else text

    def _fmt(self, value: Any, other: Any) -> str:
        if not isinstance(value, int | float) or isinstance(value, bool):
            return str(value)
        text = fmt_number(value, other)
        if self.unit == "ms":
            return f"{text}ms"
        if self.unit == "$":
            return f"${text}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "gate": self.gate,
            "metric": self.metric,
            "actual": self.actual,
            "threshold": self.threshold,
            "kind": self.kind,
            "passed": self.passed,
            "message": self.line(),
        }


def fmt_number(value: float, other: Any = None) -> str:
    """Shortest rounding (2 to 6 decimals) that still tells `value` apart from `other`."""
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    for digits in range(2, 7):
        text = f"{value:.{digits}f}".rstrip("0").rstrip(".")
        if not isinstance(other, int | float) or math.isclose(value, other, abs_tol=TOLERANCE):
            return text
        if text != f"{other:.{digits}f}".rstrip("0").rstrip("."):
            return text
    return repr(value)


@dataclass(frozen=True)
class GateSettings:
    """The thresholds that apply to one run, merged from the config and the experiment."""

    evaluators: dict[str, dict[str, float]] = field(default_factory=dict)
    latency: dict[str, float] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)
    fail_on_error: bool = True
    max_error_rate: float | None = None
    max_regression: float = 0.0


def canonical(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {METRIC_ALIASES.get(k, k): float(v) for k, v in metrics.items()}


def resolve_settings(
    ci: Mapping[str, Any] | None,
    experiment_thresholds: Mapping[str, Any] | None,
    run_evaluators: Iterable[str],
) -> GateSettings:
    """Config thresholds apply to runs that have the evaluator; the experiment's always do.

    The experiment's values win metric by metric. `fail_on_error` defaults to true, unless
    `max_error_rate` is set and `fail_on_error` is not: then the rate decides.
    """
    ci = dict(ci or {})
    own = dict(experiment_thresholds or {})
    present = set(run_evaluators)
    evaluators: dict[str, dict[str, float]] = {}
    latency: dict[str, float] = {}
    cost: dict[str, float] = {}
    for source, is_own in ((ci.get("thresholds") or {}, False), (own, True)):
        for name, metrics in source.items():
            if not isinstance(metrics, Mapping):
                continue  # a setting beside the tables (experiment thresholds)
            if name == "latency":
                latency.update(canonical(metrics))
            elif name == "cost":
                cost.update(canonical(metrics))
            elif is_own or name in present:
                evaluators.setdefault(name, {}).update(canonical(metrics))
    settings = {k: ci[k] for k in CI_SETTINGS if k in ci}
    settings.update({k: own[k] for k in CI_SETTINGS if k in own})
    max_error_rate = settings.get("max_error_rate")
    fail_on_error = settings.get("fail_on_error", max_error_rate is None)
    return GateSettings(
        evaluators=evaluators,
        latency=latency,
        cost=cost,
        fail_on_error=bool(fail_on_error),
        max_error_rate=None if max_error_rate is None else float(max_error_rate),
        max_regression=float(settings.get("max_regression", 0.0)),
    )


def _compare(
    gate: str, metric: str, actual: float | None, threshold: float, *, floor: bool, unit: str = ""
) -> Check:
    kind = "floor" if floor else "ceiling"
    if actual is None:
        return Check(gate, metric, None, threshold, kind, False, unit, "nothing was scored")
    passed = actual >= threshold - TOLERANCE if floor else actual <= threshold + TOLERANCE
    return Check(gate, metric, actual, threshold, kind, passed, unit)


def check_run(
    summary: Mapping[str, Any],
    settings: GateSettings,
    *,
    status: str = "completed",
    pass_rate_at: Callable[[str, float], float | None] | None = None,
    corrected_at: Callable[[str], tuple[float | None, str]] | None = None,
) -> list[Check]:
    """Every check of one run: evaluator floors, latency and cost ceilings, errors, scoring.

    A `pass_rate` counts the scores at or above `min_score`, by default the evaluator's pass
    mark (`cobalt.verdict`), at which the summary's `passRate` is counted (`passMark`: 0.5 in
    summaries stored before it was kept). `pass_rate_at(evaluator, min_score)` supplies pass
    rates at another `min_score`. A `pass_rate_corrected` is the pass rate corrected for the
    judge's measured error rates (`cobalt.calibration`): `corrected_at(evaluator)` gives it
    with a note (why it is missing, when it is).
    """
    checks: list[Check] = []
    scores: Mapping[str, Mapping[str, Any]] = summary.get("scores") or {}
    if status != "completed":
        checks.append(Check("run", "status", status, "completed", "status", False))
    scored = sum(int(values.get("count") or 0) for values in scores.values())
    note = "" if scores else "the experiment has no evaluators"
    checks.append(Check("run", "scored", scored, 1, "floor", scored >= 1, note=note))
    for name, metrics in settings.evaluators.items():
        floors = {m: v for m, v in metrics.items() if m != "min_score"}
        if name not in scores:
            note = f"no evaluator named {name!r} in this run"
            for metric, threshold in floors.items() or [("avg", None)]:
                checks.append(Check(name, metric, None, threshold, "missing", False, note=note))
            continue
        values = scores[name]
        mark = pass_mark(values.get("passMark"))  # the mark the summary's passRate counts
        min_score = metrics.get("min_score", mark)
        for metric in SCORE_METRICS:
            if metric not in floors:
                continue
            actual = values.get(SUMMARY_KEYS.get(metric, metric))
            if metric == "pass_rate_corrected":
                actual, note = corrected_at(name) if corrected_at else (None, "no calibration")
                check = _compare(name, metric, actual, floors[metric], floor=True)
                checks.append(replace(check, note=note))
                continue
            if metric == "pass_rate" and not math.isclose(min_score, mark):
                actual = pass_rate_at(name, min_score) if pass_rate_at else None
            check = _compare(name, metric, actual, floors[metric], floor=True)
            if metric == "pass_rate" and "min_score" in metrics:
                check = replace(check, note=f"min_score {fmt_number(min_score)}")
            elif metric == "pass_rate" and not math.isclose(mark, DEFAULT_PASS_THRESHOLD):
                check = replace(check, note=f"pass mark {fmt_number(mark)}")
            checks.append(check)
    for metric, threshold in settings.latency.items():
        actual = (summary.get("latency") or {}).get(metric)
        checks.append(_compare("latency", metric, actual, threshold, floor=False, unit="ms"))
    for metric, threshold in settings.cost.items():
        actual = summary.get("estimatedCost") if metric == "total" else None
        checks.append(_compare("cost", metric, actual, threshold, floor=False, unit="$"))
    checks.extend(error_checks(summary, settings))
    return checks


def error_checks(summary: Mapping[str, Any], settings: GateSettings) -> list[Check]:
    """Items that errored or timed out, and evaluations that errored."""
    checks: list[Check] = []
    total = int(summary.get("totalItems") or 0)
    ok = int((summary.get("itemStatus") or {}).get("ok") or 0)
    failed = max(total - ok, 0)
    scores: Mapping[str, Mapping[str, Any]] = summary.get("scores") or {}
    if settings.fail_on_error:
        checks.append(_compare("items", "errored", failed, 0, floor=False))
        for name, values in scores.items():
            errors = int(values.get("errors") or 0)
            checks.append(_compare(name, "errors", errors, 0, floor=False))
    if settings.max_error_rate is not None:
        rate = failed / total if total else None
        checks.append(_compare("items", "error_rate", rate, settings.max_error_rate, floor=False))
        for name, values in scores.items():
            errors = int(values.get("errors") or 0)
            attempted = errors + int(values.get("count") or 0)
            rate = errors / attempted if attempted else None
            if rate is not None:
                checks.append(
                    _compare(name, "error_rate", rate, settings.max_error_rate, floor=False)
                )
    return checks


def check_baseline(
    current: Mapping[str, Mapping[str, float]],
    baseline: Mapping[str, Mapping[str, float]],
    evaluators: Iterable[str],
    *,
    max_regression: float,
    baseline_id: str,
) -> tuple[list[Check], list[str]]:
    """Per evaluator: the drop of the average over items matched by key (both runs scored them).

    `current`/`baseline` map item key → evaluator → mean score. Returns checks and notes.
    """
    checks: list[Check] = []
    notes: list[str] = []
    for name in evaluators:
        keys = [k for k in current if name in current[k] and name in baseline.get(k, {})]
        if not keys:
            notes.append(f"{name}: no item scored in both this run and baseline {baseline_id}")
            continue
        before = math.fsum(baseline[k][name] for k in keys) / len(keys)
        after = math.fsum(current[k][name] for k in keys) / len(keys)
        drop = before - after
        check = _compare(name, "regression", max(drop, 0.0), max_regression, floor=False)
        note = (
            f"avg {fmt_number(before)} → {fmt_number(after)} over {len(keys)} items "
            f"matched with run {baseline_id}"
        )
        checks.append(replace(check, note=note))
    return checks, notes


def check_significance(
    current: Mapping[str, Mapping[str, float]],
    baseline: Mapping[str, Mapping[str, float]],
    evaluators: Iterable[str],
    *,
    alpha: float,
    max_regression: float,
    baseline_id: str,
) -> tuple[list[Check], list[str]]:
    """`--significance ALPHA`: per evaluator, a paired test over items matched by key.

    Fails only when the drop is significant at `alpha` and larger than `max_regression`;
    noise passes. Items scored in only one of the runs are named in the notes.
    """
    from cobalt import significance

    checks: list[Check] = []
    notes: list[str] = []
    results = significance.compare_scores(baseline, current, evaluators, alpha=alpha)
    for name, entry in results.items():
        unpaired = entry["onlyInA"] + entry["onlyInB"]
        if unpaired:
            notes.append(
                f"{name}: {entry['onlyInA']} item(s) scored only in baseline {baseline_id}, "
                f"{entry['onlyInB']} only in this run; the test pairs the other {entry['n']}"
            )
        if entry["verdict"] == significance.INSUFFICIENT:
            notes.append(f"{name}: fewer than 2 items scored in both this run and {baseline_id}")
            continue
        drop = -entry["delta"]
        failed = entry["verdict"] == significance.REGRESSED and drop > max_regression + TOLERANCE
        note = f"{significance.describe_result(entry)} at α {fmt_number(alpha)}"
        note += f" vs run {baseline_id}"
        checks.append(
            Check(name, "regression", entry["pValue"], alpha, "significance", not failed, note=note)
        )
        if not failed:  # passing checks are not listed; say what the test found
            notes.append(f"{name}: {note}")
    return checks, notes


def validate_experiment_thresholds(thresholds: Any, *, name: str, file: str) -> None:
    """Raise ConfigError naming the experiment and file when its thresholds are malformed."""
    where = f"{file or '<experiment>'}: experiment {name!r} `thresholds"
    check_thresholds(thresholds, where=where, allow_settings=True)


def experiment_threshold_errors(experiments: Iterable[Any], config: Config) -> list[str]:
    """Malformed `experiment(..., thresholds=...)` values, each naming its experiment and file."""
    problems: list[str] = []
    for experiment in experiments:
        file = experiment.file or ""
        with contextlib.suppress(ValueError):
            file = Path(file).resolve().relative_to(config.project_dir).as_posix()
        try:
            validate_experiment_thresholds(experiment.thresholds, name=experiment.name, file=file)
        except ConfigError as exc:
            problems.append(str(exc))
    return problems


def check_sweep(
    gate: Mapping[str, Any], result: Mapping[str, Any], chosen: str, paired: Mapping[str, Any]
) -> Check:
    """`[ci.sweep]`: `not-worse-than-best` fails when the chosen variant is significantly worse
    than the best after Holm (`result` from `sweep_stats.analyse`); `candidate-beats-default`
    fails unless the candidate is significantly better than the chosen one (`paired`: the
    candidate against it, `sweep_stats.paired`)."""
    alpha = float(gate.get("alpha", 0.05))
    name = f"sweep {result['name']}"
    if gate["require"] == "not-worse-than-best":
        row = next(r for r in result["variants"] if r["label"] == chosen)
        test = row.get("vsBest") or {}
        p = test.get("pHolm")
        # At the gate's α (the stored verdict is at the analysis' α).
        worse = p is not None and p < alpha and (test.get("delta") or 0) < 0
        note = f"{chosen} is the best" if row["isBest"] else f"{chosen} vs best {result['best']}: "
        if row["meanScore"] is None:  # every item errored: nothing says it is not worse
            note = f"{chosen} has no score ({row['errors']} items errored)"
            return Check(name, "not worse than best", None, alpha, "sweep", False, note=note)
        if test:
            verdict = "worse than the best" if worse else "not significantly worse"
            if p is None:
                verdict = test.get("verdict") or "not enough data"
            note += f"Δ {test.get('delta') or 0:+.3f}, Holm p {'—' if p is None else f'{p:.3g}'} "
            note += f"at α {alpha:g} → {verdict}"
        return Check(
            name, "not worse than best", test.get("pHolm"), alpha, "sweep", not worse, note=note
        )
    candidate = gate["candidate"]
    beats = (
        paired.get("pValue") is not None and paired["pValue"] < alpha and (paired["delta"] or 0) > 0
    )
    p = paired.get("pValue")
    note = (
        f"{candidate} vs default {chosen}: Δ {paired.get('delta') or 0:+.3f}, "
        f"p {'—' if p is None else f'{p:.3g}'} ({paired.get('test')}, {paired.get('n')} items)"
    )
    return Check(name, "candidate beats default", p, alpha, "sweep", beats, note=note)
