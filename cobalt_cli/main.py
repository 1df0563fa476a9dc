"""The `cobalt` command."""

from __future__ import annotations

import atexit
import gc
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cobalt_cli import interrupts, on_demand
from cobalt_cli.console import err, out

if TYPE_CHECKING:
    from cobalt.config import Config

# Every command registers on `commands`; `app`, the `cobalt` command, builds the one it runs.
commands = typer.Typer(
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: Typer's Rich help imports Markdown (~50 ms per command)
)
app = typer.Typer(
    name="cobalt",
    help="Cypress for AI agents: run experiments on your agent, score them, keep every run.",
    cls=on_demand.group_of(commands),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    from rich.markup import escape

    err().print(f"[red]error:[/] {escape(message)}")
    return typer.Exit(code)


def setup(*, migrate: bool = True, config: Config | None = None) -> Config:
    """Start Django for the project (migrating the embedded database): `config`'s, or by
    default the one found from the current folder, which must exist (exit 2 otherwise)."""
    from cobalt.config import ConfigError, load_config

    if config is None:
        try:
            config = load_config(require_project=True)
        except ConfigError as exc:
            raise fail(str(exc)) from None
    from cobalt_project import bootstrap

    try:
        bootstrap.setup(config, migrate=migrate)
    except Exception as exc:
        raise fail(f"could not open the database: {exc}") from None
    return config


def _print_version(value: bool) -> None:
    if value:
        from cobalt.version import __version__

        typer.echo(f"cobalt-agents {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Cypress for AI agents: run experiments on your agent, score them, keep every run."""


@commands.command()
def init(
    directory: Annotated[Path, typer.Argument(help="Project folder (default: here).")] = Path(),
) -> None:
    """Create cobalt.toml, an example experiment that runs offline and its dataset."""
    from rich.markup import escape

    from cobalt_cli.scaffold import scaffold

    target = directory.resolve()
    for relative, written in scaffold(target):
        mark = "[green]created[/]" if written else "[dim]kept   [/]"
        out().print(f"  {mark} {escape(relative)}")
    out().print("\n Next: [bold]cobalt run[/]  (then [bold]cobalt serve[/] for the dashboard)")


@commands.command()
def run(
    paths: Annotated[
        list[str] | None, typer.Argument(help="Experiment files or folders (default: test_dir).")
    ] = None,
    filter: Annotated[
        str | None, typer.Option("--filter", "-f", help="Experiment name glob or substring.")
    ] = None,
    tag: Annotated[str | None, typer.Option(help="Only experiments with this tag.")] = None,
    concurrency: Annotated[int | None, typer.Option(min=1, help="Items in parallel.")] = None,
    runs: Annotated[int | None, typer.Option(min=1, help="Repetitions of each item.")] = None,
    timeout: Annotated[float | None, typer.Option(min=0.001, help="Seconds per item.")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Bypass the judge cache.")] = False,
    resume: Annotated[
        str | None, typer.Option("--resume", help="Run only the missing/failed items of RUN.")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No per-item lines.")] = False,
    ci: Annotated[
        bool, typer.Option("--ci", help="Quality gates: exit 1 on a violated threshold.")
    ] = False,
    junit: Annotated[
        Path | None, typer.Option("--junit", help="With --ci: write a JUnit XML report.")
    ] = None,
    reporter_name: Annotated[
        str, typer.Option("--reporter", help="console, or json (JSON lines on stdout).")
    ] = "console",
    baseline: Annotated[
        str | None,
        typer.Option("--baseline", help="With --ci: RUN_ID or latest; fail on regressions."),
    ] = None,
    significance: Annotated[
        float | None,
        typer.Option(
            "--significance",
            metavar="ALPHA",
            help="With --baseline: fail only on a regression significant at ALPHA (e.g. 0.05).",
        ),
    ] = None,
    repeat_flaky: Annotated[
        int | None,
        typer.Option(
            "--repeat-flaky",
            metavar="N",
            min=2,
            help="Run the items that flipped in earlier runs N times (see `cobalt flaky`).",
        ),
    ] = None,
    ui: Annotated[
        bool,
        typer.Option("--ui", help="Then open the run in the dashboard (served until Ctrl+C)."),
    ] = False,
    watch: Annotated[
        bool,
        typer.Option("--watch", help="Then rerun the experiments whose files or inputs change."),
    ] = False,
    record: Annotated[
        bool, typer.Option("--record", help="Record the agent's model calls, item by item.")
    ] = False,
    replay: Annotated[
        bool,
        typer.Option("--replay", help="Answer the agent's model calls from the recordings."),
    ] = False,
    record_new: Annotated[
        bool,
        typer.Option("--record-new", help="Replay what is recorded; record what is new."),
    ] = False,
) -> None:
    """Run experiments and print scores as they stream in."""
    interrupts.raise_on_signals()  # SIGTERM and SIGHUP cancel the run as Ctrl-C does
    paths = [os.path.abspath(path) for path in paths or []]  # before moving to the project
    config = setup(config=run_project(paths))
    os.chdir(config.project_dir)
    from cobalt_cli.commands_recordings import ReplayOptionError, replay_mode

    try:
        mode = replay_mode(config, record=record, replay=replay, record_new=record_new, ci=ci)
    except ReplayOptionError as exc:
        raise fail(str(exc)) from None
    from cobalt_app import recordings

    recordings.stand_in_keys(mode)
    if watch:
        if ci or resume or ui or repeat_flaky:
            raise fail("--watch reruns on changes; it does not combine with --ci, --resume, --ui")
        from cobalt_cli.watch import watch as watch_files

        given = {
            "--filter": filter,
            "--tag": tag,
            "--concurrency": concurrency,
            "--runs": runs,
            "--timeout": timeout,
        }
        run_args = [part for flag, value in given.items() if value for part in (flag, str(value))]
        run_args += ["--no-cache"] * no_cache + ["--quiet"] * quiet
        flags = {"record": "--record", "replay": "--replay", "new-only": "--record-new"}
        run_args += [flags[mode]] if mode else []
        raise typer.Exit(watch_files(config, paths, run_args, out()))
    from cobalt_app import discovery, launcher
    from cobalt_app.plugins import PluginError
    from cobalt_app.preflight import PreflightError
    from cobalt_app.runs import TeamModeError
    from cobalt_cli import commands_ci

    ci_options = commands_ci.CiOptions(
        ci=ci, junit=junit, reporter=reporter_name, baseline=baseline, significance=significance
    )
    reporter = commands_ci.make_reporter(ci_options, out(), quiet=quiet)
    reporter.banner()
    overrides = {"concurrency": concurrency, "runs": runs, "timeout": timeout, "replay": mode}
    if resume and (record or replay or record_new):
        raise fail("--resume keeps the --record/--replay mode of the run it resumes")
    if repeat_flaky and resume:
        raise fail("--repeat-flaky plans a new run; --resume keeps the plan of the run it resumes")
    overrides["repeat_flaky"] = repeat_flaky
    try:
        if resume:
            result = launcher.resume(config, resume, reporter=reporter, no_cache=no_cache)
        else:
            experiments, errors, files = launcher.load_experiments(
                config, paths, name_filter=filter, tag=tag
            )
            result = launcher.LaunchResult(load_errors=errors, files=files)
            report_load_errors(config, errors)
            if not files:
                raise fail(
                    f"no experiment files found under {config.test_dir} "
                    f"(looking for {', '.join(config.get('test_match'))}); "
                    "`cobalt init` creates an example"
                )
            if not experiments and not errors:
                raise fail("no experiment matched" + (f" --filter {filter!r}" if filter else ""))
            commands_ci.prepare(ci_options, config, experiments)
            result.runs = launcher.execute(
                experiments, config, reporter=reporter, no_cache=no_cache, overrides=overrides
            )
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP, or the output was closed
        reporter.stop_progress()
        report_interrupt(exc)
        raise typer.Exit(interrupts.exit_code(exc)) from None
    except (discovery.FileRefused, FileNotFoundError, launcher.ResumeError) as exc:
        raise fail(str(exc)) from None
    except (LookupError, PluginError, TeamModeError) as exc:
        raise fail(str(exc)) from None
    except PreflightError as exc:  # nothing ran: exit 2, like any other usage error
        raise fail(str(exc)) from None
    if resume:
        report_load_errors(config, result.load_errors)
    if ui and result.runs and not ci:  # CI mode never opens the dashboard
        from cobalt_cli.commands_dashboard import open_ui

        open_ui(config, result.runs)
    if ci:
        raise typer.Exit(commands_ci.finish(ci_options, config, result))
    if result.load_errors:
        raise typer.Exit(EXIT_USAGE)
    if any(r.status == "cancelled" for r in result.runs):  # team mode: `cobalt cancel RUN`
        raise typer.Exit(EXIT_FAILED)


def run_project(paths: list[str]) -> Config:
    """`cobalt run`'s project: the one holding the first path given, else the one found from
    here. With no configuration file anywhere, the current folder when it holds experiment
    files (a project without configuration, as before); otherwise there is no project here."""
    from cobalt.config import ConfigError, NoProjectError, load_config
    from cobalt_app import discovery

    try:
        try:
            return load_config(near=paths[0] if paths else None, require_project=True)
        except NoProjectError as missing:
            no_project = missing
        config = load_config()
    except ConfigError as exc:
        raise fail(str(exc)) from None
    try:
        found = discovery.discover(config, paths)
    except (discovery.FileRefused, FileNotFoundError):
        found = []
    if not found:
        raise fail(str(no_project))
    return config


def report_interrupt(exc: KeyboardInterrupt) -> None:
    from rich.markup import escape

    from cobalt_app.team_wait import Detached

    if isinstance(exc, Detached):  # team mode: the workers carry on
        err().print(
            f"\n[yellow]{interrupts.reason(exc)}.[/] Run {exc.run_id} goes on on the workers; "
            f"re-attach with [bold]cobalt watch {exc.run_id}[/], "
            f"stop it with [bold]cobalt cancel {exc.run_id}[/]."
        )
        return
    err().print(f"\n[yellow]{escape(interrupts.hint(exc))}[/]")


def report_load_errors(config: Config, errors) -> None:
    from rich.markup import escape

    for loaded in errors:
        try:
            name = loaded.path.relative_to(config.project_dir)
        except ValueError:
            name = loaded.path
        err().print(f"\n[red]✗ {escape(str(name))} failed to import:[/] {escape(loaded.error)}")
        if loaded.traceback:
            err().print(f"[dim]{escape(loaded.traceback.rstrip())}[/]")


@commands.command()
def history(
    limit: Annotated[int, typer.Option(min=1, help="Runs to show.")] = 20,
    name: Annotated[str | None, typer.Option(help="Experiment name contains.")] = None,
    tag: Annotated[str | None, typer.Option(help="Runs with this tag.")] = None,
) -> None:
    """List past runs, newest first."""
    from rich.markup import escape
    from rich.table import Table

    setup()
    from cobalt_app.liveness import settle
    from cobalt_app.selectors import run_list

    table = Table(box=None, padding=(0, 2), header_style="bold")
    for column in ("ID", "Name", "Timestamp", "Status", "Items", "Scores", "Errors", "Cost"):
        table.add_column(column, no_wrap=column != "Scores")
    found = 0
    for item in settle(run_list(name=name, tag=tag, limit=limit)):
        found += 1
        scores = "  ".join(
            f"{escape(k)} {v['avg']:.2f}" if v.get("avg") is not None else f"{escape(k)} —"
            for k, v in item.summary.get("scores", {}).items()
        )
        table.add_row(
            item.id,
            escape(item.name),
            item.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            item.status,
            str(item.total_items),
            scores or "—",
            str(item.error_count + item.timeout_count),
            f"${item.estimated_cost:.4f}",
        )
    if not found:
        out().print("No runs yet. `cobalt run` starts one.")
        return
    out().print(table, soft_wrap=False)


@commands.command()
def compare(
    run_a: Annotated[str, typer.Argument(help="Baseline run id.")],
    run_b: Annotated[str, typer.Argument(help="Candidate run id.")],
    top: Annotated[int, typer.Option(help="Items to list per direction.")] = 5,
    alpha: Annotated[
        float, typer.Option(help="Significance level of the paired tests (verdicts).")
    ] = 0.05,
) -> None:
    """Compare two runs: per-evaluator deltas and the items that changed most (by item key)."""
    from rich.markup import escape
    from rich.table import Table

    setup()
    from cobalt_app.selectors import RunNotFound, compare_runs, run_get
    from cobalt_app.significance import check_alpha
    from cobalt_cli.commands_stats import print_significance

    try:
        alpha = check_alpha(alpha)
    except ValueError as exc:
        raise fail(f"--alpha: {exc}") from None

    try:
        a, b = run_get(run_a), run_get(run_b)
    except RunNotFound as exc:
        raise fail(str(exc)) from None
    diff = compare_runs(a, b, top=top, alpha=alpha)
    out().print(
        f"\n Comparison: [bold]{a.id}[/] ({escape(a.name)}) vs [bold]{b.id}[/] ({escape(b.name)})\n"
    )
    table = Table(box=None, padding=(0, 2), header_style="bold")
    for column in ("Metric", "Run A", "Run B", "Diff"):
        table.add_column(column, justify="left" if column == "Metric" else "right")
    for evaluator, values in diff["evaluators"].items():
        table.add_row(
            escape(evaluator), _score(values["a"]), _score(values["b"]), _delta(values["delta"])
        )
    cost = diff["cost"]
    table.add_row("cost", f"${cost['a']:.4f}", f"${cost['b']:.4f}", f"{cost['b'] - cost['a']:+.4f}")
    out().print(table, soft_wrap=False)
    print_significance(out(), diff)
    out().print(
        f"\n Matched items: {diff['matchedItems']}"
        f"  (only in A: {len(diff['onlyInA'])}, only in B: {len(diff['onlyInB'])})"
    )
    for title, rows, colour in (
        ("Regressions", diff["regressions"], "red"),
        ("Improvements", diff["improvements"], "green"),
    ):
        count = diff["regressionCount" if title == "Regressions" else "improvementCount"]
        out().print(f"\n [{colour}]{title}[/] ({count})")
        for row in rows:
            out().print(
                f"   {escape(row['key'])} · {escape(row['evaluator'])}: "
                f"{row['a']:.2f} → {row['b']:.2f} ([{colour}]{row['delta']:+.2f}[/])"
            )
    for label, keys in (("Only in A", diff["onlyInA"]), ("Only in B", diff["onlyInB"])):
        if keys:
            out().print(
                f"\n {label}: {escape(', '.join(keys[:10]))}" + (" …" if len(keys) > 10 else "")
            )
    out().print()


def _score(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _delta(value: float | None) -> str:
    if value is None:
        return "—"
    colour = "green" if value > 0 else "red" if value < 0 else "dim"
    return f"[{colour}]{value:+.2f}[/]"


@commands.command()
def migrate() -> None:
    """Create or update the database tables (automatic for the embedded SQLite database)."""
    setup(migrate=False)
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=1)


# Commands of the other areas live in their own modules and register themselves here.
# (One import per module; keep this block sorted.)
from cobalt_cli import (  # noqa: E402
    commands_api,
    commands_ci,
    commands_clean,
    commands_dashboard,
    commands_labels,
    commands_mcp,
    commands_recordings,
    commands_stats,
    commands_team,
)

for _module in (
    commands_api,
    commands_ci,
    commands_clean,
    commands_dashboard,
    commands_labels,
    commands_mcp,
    commands_recordings,
    commands_stats,
    commands_team,
):
    _module.register(commands)


def main() -> None:
    # Skip the interpreter's final garbage collection of everything still alive (a third of
    # a second after a large run): the process is exiting anyway.
    atexit.register(gc.freeze)
    # A closed output (`cobalt run | head`) stops the command, whichever thread printed.
    sys.stdout = interrupts.GuardedOutput(sys.stdout)
    sys.stderr = interrupts.GuardedOutput(sys.stderr)
    try:
        app()
    except BrokenPipeError:
        sys.exit(EXIT_FAILED)


if __name__ == "__main__":
    main()
