"""`python my.cobalt.py`: run an experiment declared in the executed file, right away."""

from __future__ import annotations

from typing import Any


def run_directly(definition: Any) -> Any:
    from cobalt.report import ExperimentReport
    from cobalt_project import bootstrap

    config = bootstrap.setup()
    from cobalt_app import launcher, results
    from cobalt_cli.reporter import ConsoleReporter

    reporter = ConsoleReporter()
    reporter.banner()
    (run,) = launcher.execute([definition], config, reporter=reporter)
    return ExperimentReport(results.run_results(run), results_path=run.results_path or None)
