"""`cobalt run --ci`: quality gates, exit codes 0/1/2, JUnit, GitHub Actions, webhooks.

The `run` command (cobalt_cli/main.py) calls `make_reporter()` first, `prepare()` before it
executes experiments and `finish()` at the end; everything CI-specific lives here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from cobalt.config import Config

REPORTERS = ("console", "json")
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


@dataclass
class CiOptions:
    """What `cobalt run` was asked for: --ci, --junit, --reporter, --baseline."""

    ci: bool = False
    junit: Path | None = None
    reporter: str = "console"
    baseline: str | None = None
    significance: float | None = None
    baseline_run: Any = None
    problems: list[str] = field(default_factory=list)

    @property
    def json(self) -> bool:
        return self.reporter == "json"

    @property
    def github(self) -> bool:
        return os.environ.get("GITHUB_ACTIONS") == "true"

    def check(self) -> None:
        """Refuse combinations that would silently do nothing (exit 2)."""
        from cobalt_cli.console import fail

        if self.reporter not in REPORTERS:
            raise fail(f"--reporter must be one of {', '.join(REPORTERS)} (got {self.reporter!r})")
        if not self.ci:
            for flag, value in (("--junit", self.junit), ("--baseline", self.baseline)):
                if value:
                    raise fail(f"{flag} needs --ci (it reports or gates a CI run)")
        if self.significance is not None:
            from cobalt.significance import check_alpha

            if not (self.ci and self.baseline):
                raise fail("--significance needs --ci and --baseline (it tests the regression)")
            try:
                check_alpha(self.significance)
            except ValueError as exc:
                raise fail(f"--significance: {exc}") from None


def make_reporter(options: CiOptions, console: Console, *, quiet: bool = False) -> Any:
    """The run reporter: JSON lines, the minimal CI console, or the live console."""
    options.check()
    if options.json or options.ci:
        # A CI reporter's modules (gates, baselines, JUnit) only for them (issue 41).
        from cobalt_cli.ci_reporters import CiConsoleReporter, JsonLinesReporter

        if options.json:
            reporter = JsonLinesReporter()
            reporter.claim_stdout()
            return reporter
        return CiConsoleReporter(console)
    from cobalt_cli.reporter import ConsoleReporter

    return ConsoleReporter(console, quiet=quiet)


def prepare(options: CiOptions, config: Config, experiments: list[Any]) -> None:
    """Before anything runs: experiment thresholds well-formed, --baseline run exists, and
    the preflight (evaluator types, options, keys), reported like any configuration error."""
    if not options.ci:
        return
    from cobalt import gates
    from cobalt_app import ci_verdict, preflight

    problems = gates.experiment_threshold_errors(experiments, config)
    problems.extend(p.line() for p in preflight.problems(experiments, config))
    try:
        options.baseline_run = ci_verdict.resolve_baseline(options.baseline)
    except ci_verdict.BaselineError as exc:
        problems.append(str(exc))
    if problems:
        outcome = ci_verdict.CiOutcome(config_errors=problems)
        report(options, config, outcome)
        raise typer.Exit(outcome.exit_code)


def finish(options: CiOptions, config: Config, result: Any) -> int:
    """Gate the runs of this invocation, report the verdict everywhere asked; the exit code."""
    from cobalt_app import ci_verdict, webhooks

    if options.baseline and options.baseline_run is None:
        try:
            options.baseline_run = ci_verdict.resolve_baseline(options.baseline)
        except ci_verdict.BaselineError as exc:
            options.problems.append(str(exc))
    failures = [
        ci_verdict.ImportFailure(
            file=relative(config, loaded.path),
            error=loaded.error or "",
            traceback=loaded.traceback or "",
        )
        for loaded in result.load_errors
    ]
    outcome = ci_verdict.gate_runs(
        result.runs,
        config,
        baseline=options.baseline_run,
        import_failures=failures,
        significance=options.significance,
    )
    outcome.config_errors.extend(options.problems)
    report(options, config, outcome)
    webhooks.notify_ci(config, outcome)
    return outcome.exit_code


def report(options: CiOptions, config: Config, outcome: Any) -> None:
    from rich.markup import escape

    from cobalt_cli import ci_reporters
    from cobalt_cli.console import err, out

    # With --reporter json, sys.stdout already points at stderr (see JsonLinesReporter).
    ci_reporters.print_outcome(out(), outcome)
    if options.junit:
        path = ci_reporters.write_junit(options.junit, outcome)
        out().print(f"JUnit report: {escape(display(path))}")
    if options.github:
        for line in ci_reporters.github_annotations(outcome, config.project_dir):
            print(line, flush=True)
        summary_file = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary_file:
            try:
                ci_reporters.append_step_summary(Path(summary_file), outcome)
            except OSError as exc:
                err().print(f"[yellow]warning:[/] could not write the step summary: {exc}")


def relative(config: Config, path: Path) -> str:
    try:
        return path.resolve().relative_to(config.project_dir).as_posix()
    except ValueError:
        return str(path)


def display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def register(app: typer.Typer) -> None:
    """Add this area's commands to the `cobalt` app (CI mode lives in `cobalt run --ci`)."""


def runs_without_output(runs: list[Any]) -> list[str]:
    """A line per finished run none of whose items produced an output (each errored or timed
    out): such a run scored nothing, and `cobalt run` exits 1 (EXIT_FAILED) for it, as for a
    violated gate; 2 (EXIT_USAGE) stays for what was asked wrongly (flags, config, imports)."""
    lines = []
    for run in runs:
        summary = run.summary or {}
        counts = summary.get("itemStatus") or {}
        total = summary.get("totalItems") or 0
        if run.status == "cancelled" or not total or counts.get("ok", 0):
            continue
        parts = [
            f"{counts[s]} {s}{'s' * (counts[s] != 1)}"
            for s in ("error", "timeout")
            if counts.get(s)
        ]
        lines.append(
            f"no item of {run.name!r} produced an output ({', '.join(parts) or 'none ran'} "
            f"of {total}): nothing was scored; exit {EXIT_FAILED}"
        )
    return lines
