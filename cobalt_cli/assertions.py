"""`cobalt.assert_scores(report, thresholds)`: a run's thresholds as a test's assertion.

A door for a plain `def test_…` function in pytest: it applies the engine's CI gates
(`cobalt.gates`) to an `ExperimentReport`, so it lives above the engine; `cobalt` re-exports
it on first use.
"""

from __future__ import annotations

from typing import Any

from cobalt import gates
from cobalt.report import ExperimentReport


def assert_scores(report: ExperimentReport, thresholds: dict[str, Any]) -> None:
    """Fail (AssertionError) unless the run meets `thresholds`, in the experiment's
    `thresholds=` form: `{"exact": 0.8}` (the average) or `{"exact": {"avg": 0.8, "p95":
    0.9, "pass_rate": 0.9}, "latency": {"p95": 2000}, "cost": {"total": 0.5}}`.
    For a plain `def test_…` function in pytest."""
    shaped = {
        name: limits if isinstance(limits, dict) else {"avg": limits}
        for name, limits in thresholds.items()
    }
    settings = gates.resolve_settings(None, shaped, report.statistics)
    checks = gates.check_run(report.summary, settings, status=report.status)
    named = set(shaped) | {"run"}
    failed = [c.line() for c in checks if not c.passed and c.gate in named and c.metric != "errors"]
    if failed:
        raise AssertionError(
            f"run {report.id} ({report.name}) misses its thresholds:\n  " + "\n  ".join(failed)
        )
