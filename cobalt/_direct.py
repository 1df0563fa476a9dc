"""`python my.cobalt.py`: run an experiment declared in the executed file, right away."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def run_directly(definition: Any) -> Any:
    from cobalt.config import load_config
    from cobalt.report import ExperimentReport
    from cobalt_project import bootstrap

    # The project holding the experiment file, wherever Python was started from.
    config = bootstrap.setup(load_config(near=definition.file))
    from cobalt_app import launcher, results
    from cobalt_app.preflight import PreflightError
    from cobalt_cli import interrupts
    from cobalt_cli.reporter import ConsoleReporter

    reporter = ConsoleReporter()
    reporter.banner()
    restore_signals = interrupts.raise_on_signals()  # SIGTERM, SIGHUP: cancelled, as Ctrl-C
    try:
        (run,) = launcher.execute([definition], config, reporter=reporter)
    except PreflightError as exc:
        if not _is_script(definition.file):
            raise  # imported (a notebook, another script): the caller decides
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt as exc:
        if not _is_script(definition.file):
            raise
        print(f"\n{interrupts.hint(exc)}", file=sys.stderr)
        raise SystemExit(interrupts.exit_code(exc)) from None
    finally:
        restore_signals()
    return ExperimentReport(results.run_results(run), results_path=run.results_path or None)


def _is_script(file: str | None) -> bool:
    """Whether the experiment is declared in the file Python was started with."""
    return (
        bool(file and sys.argv and sys.argv[0])
        and Path(file).resolve() == Path(sys.argv[0]).resolve()
    )
