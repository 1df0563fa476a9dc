"""The verdict of one `cobalt run --ci`: every run's gates (`gates.check_run`, and the
baseline comparison) with what they need from the database (scores at another `min_score`,
errored items, evaluation errors grouped by cause, the baseline run), gathered into a
`GateReport` per run and one `CiOutcome` for the console, JUnit, GitHub and webhooks.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cobalt import verdict
from cobalt.config import Config, ConfigError
from cobalt.errors import NotFoundError
from cobalt.gates import (
    Check,
    GateSettings,
    canonical,
    check_baseline,
    check_run,
    check_significance,
    resolve_settings,
)
from cobalt.run_settings import RunSettings
from cobalt_app import sweeps
from cobalt_app.pricing import NO_MODEL

RESERVED = ("latency", "cost")
ERRORED_ITEMS_SHOWN = 200
QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
NUMBER = re.compile(r"\d+(?:\.\d+)?")


@dataclass
class ErroredItem:
    index: int
    run_index: int
    key: str
    status: str
    error: str
    traceback: str
    latency_ms: float | None


@dataclass
class ErrorClass:
    """The evaluation errors of one evaluator that share a cause: how many, the first message."""

    evaluator: str
    count: int
    first: str

    def line(self) -> str:
        plural = "s" * (self.count != 1)
        return f"{self.evaluator}: {self.count} evaluation error{plural}, first: {self.first}"


@dataclass
class GateReport:
    """The gates of one run."""

    run_id: str
    name: str
    file: str
    status: str
    summary: dict[str, Any]
    evaluators: list[str]
    settings: GateSettings
    checks: list[Check] = field(default_factory=list)
    errored_items: list[ErroredItem] = field(default_factory=list)
    error_classes: list[ErrorClass] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    baseline_id: str | None = None
    results_path: str = ""
    runs: int = 1

    @property
    def violations(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    @property
    def passed(self) -> bool:
        return not self.violations


@dataclass
class ImportFailure:
    file: str
    error: str
    traceback: str = ""


@dataclass
class CiOutcome:
    """Everything one `cobalt run --ci` decided, for the console, JUnit, GitHub and webhooks."""

    reports: list[GateReport] = field(default_factory=list)
    global_checks: list[Check] = field(default_factory=list)
    import_failures: list[ImportFailure] = field(default_factory=list)
    config_errors: list[str] = field(default_factory=list)

    @property
    def violations(self) -> list[Check]:
        found = [c for c in self.global_checks if not c.passed]
        for report in self.reports:
            found.extend(report.violations)
        return found

    @property
    def exit_code(self) -> int:
        if self.import_failures or self.config_errors:
            return 2
        return 1 if self.violations else 0

    @property
    def passed(self) -> bool:
        return self.exit_code == 0


class BaselineError(NotFoundError):
    pass


def scores_of(run_id: str, evaluator: str) -> list[float]:
    from cobalt_app.models import Evaluation

    rows = Evaluation.objects.filter(
        run_id=run_id, evaluator=evaluator, status=Evaluation.Status.OK, score__isnull=False
    ).values_list("score", flat=True)
    return list(rows.iterator(chunk_size=5000))


def pass_rate(run_id: str, evaluator: str, min_score: float) -> float | None:
    """The share of the evaluator's scores at or above `min_score` (the verdict rule's)."""
    return verdict.pass_rate(scores_of(run_id, evaluator), min_score)


def judge_calibrations(run: Any, config: Config, settings: GateSettings) -> dict[str, Any]:
    """The run's judges' calibrations, at the project's `[calibration]` marks, when a gate
    needs them (`[ci] require_calibrated`, a `pass_rate_corrected` threshold)."""
    from cobalt_app.calibration import run_calibration

    required = (config.get("ci") or {}).get("require_calibrated", False)
    corrected = any("pass_rate_corrected" in m for m in settings.evaluators.values())
    if not required and not corrected:
        return {}
    marks = dict(RunSettings.from_config(config).calibration.as_dict())
    found = run_calibration(run, **marks)
    if isinstance(required, list):
        named = [n for n in required if n in run.evaluator_names and n not in found]
        found.update(run_calibration(run, named, **marks) if named else {})
    return found


def corrected_rate(found: Any) -> tuple[float | None, str]:
    """A `pass_rate_corrected` gate's value and note (why it is missing, when it is)."""
    if found is None:
        return None, "no calibration: label its outputs (`cobalt review`)"
    corrected = found.corrected
    if corrected is None or corrected.value is None:
        state = corrected.state if corrected else "nothing was scored"
        why = found.kappa_text if state == found.agreement.state else f"{state}, {found.kappa_text}"
        return None, f"no corrected rate: {why}"
    return corrected.value, f"raw {corrected.raw:.2f}, {found.corrected_text}"


def calibration_checks(run: Any, config: Config, calibrations: dict[str, Any]) -> list[Check]:
    """`[ci] require_calibrated` (true: every judge of the run; a list: the judges named): a
    failed check per judge without its certificate, naming its n, lower bounds and the labels
    still needed."""
    required = (config.get("ci") or {}).get("require_calibrated", False)
    if not required:
        return []
    names = list(calibrations) if required is True else list(required)
    checks: list[Check] = []
    for name in names:
        found = calibrations.get(name)
        if found is None:
            note = f"`ci.require_calibrated` names {name!r}, which this run has no judge of"
            checks.append(
                Check(name, "calibrated", None, "calibrated", "missing", False, note=note)
            )
            continue
        passed = found.certificate.calibrated
        checks.append(
            Check(name, "calibrated", passed, True, "calibration", passed, note=found.line())
        )
    return checks


def errored_items(run_id: str, limit: int = ERRORED_ITEMS_SHOWN) -> list[ErroredItem]:
    """The run's first items that did not end `ok` (errors, timeouts, and what never ran)."""
    from cobalt_app.models import ItemResult
    from cobalt_app.selectors import failed_items

    unfinished = [s for s in ItemResult.Status.values if s != ItemResult.Status.OK]
    rows = failed_items(run_id, statuses=unfinished).values_list(
        "item_index", "run_index", "item_key", "status", "error", "traceback", "latency_ms"
    )[:limit]
    return [ErroredItem(*row) for row in rows]


def error_cause(message: str) -> str:
    """A message without its particulars (quoted text, numbers): one cause, one class."""
    first = message.splitlines()[0] if message else ""
    return NUMBER.sub("#", QUOTED.sub("…", first))


def evaluation_error_classes(run_id: str) -> list[ErrorClass]:
    """The run's evaluation errors grouped by evaluator and cause, the most frequent first."""
    from cobalt_app.selectors import evaluation_errors

    classes: dict[tuple[str, str], ErrorClass] = {}
    for evaluator, error in evaluation_errors(run_id).iterator(chunk_size=5000):
        key = (evaluator, error_cause(error))
        if key in classes:
            classes[key].count += 1
        else:
            first = error.splitlines()[0] if error else "(no message)"
            classes[key] = ErrorClass(evaluator, 1, first)
    return sorted(classes.values(), key=lambda c: -c.count)


def resolve_baseline(spec: str | None) -> Any:
    """`--baseline`: None, "latest" (resolved per run) or a run that must exist."""
    if not spec or spec == "latest":
        return spec
    from cobalt_app.selectors import RunNotFound, run_get

    try:
        return run_get(spec)
    except RunNotFound as exc:
        raise BaselineError(f"--baseline: {exc}") from None


def gate_run(
    run: Any, config: Config, *, baseline: Any = None, significance: float | None = None
) -> GateReport:
    """Check one finished run against its thresholds (and its baseline run, if any)."""
    from cobalt_app.selectors import latest_run, scores_by_key

    run_config = run.config or {}
    evaluators = list(run.evaluator_names)
    settings = resolve_settings(config.get("ci") or {}, run_config.get("thresholds"), evaluators)
    report = GateReport(
        run_id=run.id,
        name=run.name,
        file=run.file,
        status=run.status,
        summary=run.summary or {},
        evaluators=evaluators,
        settings=settings,
        results_path=run.results_path or "",
        runs=RunSettings.from_run_config(run_config).runs,
    )
    calibrations = judge_calibrations(run, config, settings)
    report.checks = check_run(
        report.summary,
        settings,
        status=run.status,
        pass_rate_at=lambda name, min_score: pass_rate(run.id, name, min_score),
        corrected_at=lambda name: corrected_rate(calibrations.get(name)),
    )
    report.checks.extend(calibration_checks(run, config, calibrations))
    refused = {c.gate for c in report.violations if c.kind == "calibration"}
    report.notes.extend(
        f"{name}: judge calibration: {found.line()}"
        for name, found in calibrations.items()
        if name not in refused
    )
    report.errored_items = errored_items(run.id)
    if any(v.get("errors") for v in (report.summary.get("scores") or {}).values()):
        report.error_classes = evaluation_error_classes(run.id)
    if baseline == "latest":
        base = latest_run(run.name, exclude=run.id)
        if base is None:
            report.notes.append(f"no earlier completed run of {run.name!r}; baseline gate skipped")
    else:
        base = baseline if baseline is not None and baseline.name == run.name else None
    if base is not None:
        report.baseline_id = base.id
        check = check_baseline if significance is None else check_significance
        extra = {} if significance is None else {"alpha": significance}
        checks, notes = check(
            scores_by_key(run),
            scores_by_key(base),
            evaluators,
            max_regression=settings.max_regression,
            baseline_id=base.id,
            **extra,
        )
        report.checks.extend(checks)
        report.notes.extend(notes)
    return report


def gate_runs(
    runs: Iterable[Any],
    config: Config,
    *,
    baseline: Any = None,
    import_failures: Iterable[ImportFailure] = (),
    significance: float | None = None,
) -> CiOutcome:
    """The CI verdict over every run of one invocation."""
    runs = list(runs)
    outcome = CiOutcome(import_failures=list(import_failures))
    outcome.reports = [
        gate_run(run, config, baseline=baseline, significance=significance) for run in runs
    ]
    if baseline not in (None, "latest") and not any(r.name == baseline.name for r in runs):
        outcome.config_errors.append(
            f"--baseline {baseline.id} is a run of {baseline.name!r}, and no experiment of that "
            "name ran; pass a run of an experiment that ran, or `latest`"
        )
    for report in outcome.reports:
        unpriced = report.summary.get("unpricedModels") or []
        if report.settings.cost and unpriced:
            outcome.config_errors.append(unpriced_cost_error(report.name, unpriced))
    swept = [run.sweep_id for run in runs if run.sweep_id]
    try:
        outcome.global_checks.extend(sweeps.gate_checks(swept, config))
    except ConfigError as exc:
        outcome.config_errors.append(str(exc))
    seen = {name for run in runs for name in run.evaluator_names}
    configured = (config.get("ci") or {}).get("thresholds") or {}
    for name, metrics in configured.items():
        if name in RESERVED or name in seen or not isinstance(metrics, Mapping):
            continue
        note = f"[ci.thresholds.{name}] names an evaluator that no run has"
        floors = [m for m in canonical(metrics) if m != "min_score"] or ["avg"]
        for metric in floors:
            threshold = canonical(metrics).get(metric)
            outcome.global_checks.append(
                Check(name, metric, None, threshold, "missing", False, note=note)
            )
    return outcome


def unpriced_cost_error(experiment: str, models: list[str]) -> str:
    """A cost gate cannot be checked when part of the cost is unknown."""
    named = [m for m in models if m != NO_MODEL]
    example = f'"{named[0]}" = [2.5, 10]' if named else '"my-model" = [2.5, 10]'
    anonymous = (
        "; tokens reported without a `model` in metadata cannot be priced: report the model"
        if NO_MODEL in models
        else ""
    )
    return (
        f"experiment {experiment!r} has a cost threshold, but {', '.join(models)} spent tokens "
        f"and {'has' if len(models) == 1 else 'have'} no price, so the cost is unknown. Add "
        f"prices (USD per million input and output tokens) under [prices] in cobalt.toml, "
        f"e.g. {example}{anonymous}"
    )
