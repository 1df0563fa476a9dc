"""The `cobalt` command."""

from __future__ import annotations

import atexit
import gc
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cobalt_cli import interrupts, on_demand
from cobalt_cli.console import EXIT_FAILED, EXIT_USAGE, err, fail, out
from cobalt_cli.project import setup

if TYPE_CHECKING:
    from cobalt.config import Config
    from cobalt_app.launcher import LaunchResult

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


# `cobalt run`'s arguments and options.
Paths = Annotated[
    list[str] | None, typer.Argument(help="Experiment files or folders (default: test_dir).")
]
Filter = Annotated[
    str | None, typer.Option("--filter", "-f", help="Experiment name glob or substring.")
]
Tag = Annotated[str | None, typer.Option(help="Only experiments with this tag.")]
Concurrency = Annotated[int | None, typer.Option(min=1, help="Items in parallel.")]
Runs = Annotated[int | None, typer.Option(min=1, help="Repetitions of each item.")]
Timeout = Annotated[float | None, typer.Option(min=0.001, help="Seconds per item.")]
NoCache = Annotated[bool, typer.Option("--no-cache", help="Bypass the judge cache.")]
Resume = Annotated[
    str | None,
    typer.Option(
        "--resume",
        help="Run only the missing/failed items of RUN (or unfinished variants of SWEEP).",
    ),
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No per-item lines.")]
VariantsPicked = Annotated[
    list[str] | None,
    typer.Option("--variants", help="Only these variants of a sweep: key=value (repeatable)."),
]
Ci = Annotated[bool, typer.Option("--ci", help="Quality gates: exit 1 on a violated threshold.")]
Junit = Annotated[Path | None, typer.Option("--junit", help="With --ci: write a JUnit XML report.")]
ReporterName = Annotated[
    str | None,
    typer.Option(
        "--reporter",
        help="console, or json (JSON lines on stdout); default: `reporters` in the config.",
    ),
]
Baseline = Annotated[
    str | None,
    typer.Option("--baseline", help="With --ci: RUN_ID or latest; fail on regressions."),
]
Significance = Annotated[
    float | None,
    typer.Option(
        "--significance",
        metavar="ALPHA",
        help="With --baseline: fail only on a regression significant at ALPHA (e.g. 0.05).",
    ),
]
RepeatFlaky = Annotated[
    int | None,
    typer.Option(
        "--repeat-flaky",
        metavar="N",
        min=2,
        help="Run the items that flipped in earlier runs N times (see `cobalt flaky`).",
    ),
]
Ui = Annotated[
    bool, typer.Option("--ui", help="Then open the run in the dashboard (served until Ctrl+C).")
]
Watch = Annotated[
    bool, typer.Option("--watch", help="Then rerun the experiments whose files or inputs change.")
]
Record = Annotated[
    bool,
    typer.Option("--record", help="Record the agent's model calls and HTTP requests, per item."),
]
Replay = Annotated[
    bool,
    typer.Option(
        "--replay",
        help="Answer the agent's model calls and HTTP requests from the recordings; "
        "nothing else goes out ([replay] allow_hosts excepted).",
    ),
]
RecordNew = Annotated[
    bool, typer.Option("--record-new", help="Replay what is recorded; record what is new.")
]

MaxLlmCalls = Annotated[
    int | None, typer.Option(min=1, help="Per item: stop the agent past N model calls.")
]
MaxToolCalls = Annotated[
    int | None, typer.Option(min=1, help="Per item: stop the agent past N tool calls.")
]
MaxTokens = Annotated[
    int | None, typer.Option(min=1, help="Per item: stop the agent once N tokens are used.")
]
MaxCost = Annotated[
    float | None, typer.Option(min=0.000001, help="Per item: stop the agent once $X is spent.")
]


@dataclass
class RunRequest:
    """What `cobalt run` was asked, its paths made absolute."""

    paths: list[str]
    filter: str | None
    tag: str | None
    concurrency: int | None
    runs: int | None
    timeout: float | None
    no_cache: bool
    resume: str | None
    quiet: bool
    ci: bool
    junit: Path | None
    reporter_name: str | None
    baseline: str | None
    significance: float | None
    repeat_flaky: int | None
    ui: bool
    watch: bool
    record: bool
    replay: bool
    record_new: bool
    variants: list[str] | None = None
    max_llm_calls: int | None = None
    max_tool_calls: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None
    mode: str | None = None  # the replay mode, once the flags are checked


@commands.command()
def run(
    paths: Paths = None,
    filter: Filter = None,
    tag: Tag = None,
    concurrency: Concurrency = None,
    runs: Runs = None,
    timeout: Timeout = None,
    no_cache: NoCache = False,
    resume: Resume = None,
    quiet: Quiet = False,
    ci: Ci = False,
    junit: Junit = None,
    reporter_name: ReporterName = None,
    baseline: Baseline = None,
    significance: Significance = None,
    repeat_flaky: RepeatFlaky = None,
    ui: Ui = False,
    watch: Watch = False,
    record: Record = False,
    replay: Replay = False,
    record_new: RecordNew = False,
    variants: VariantsPicked = None,
    max_llm_calls: MaxLlmCalls = None,
    max_tool_calls: MaxToolCalls = None,
    max_tokens: MaxTokens = None,
    max_cost: MaxCost = None,
) -> None:
    """Run experiments and print scores as they stream in."""
    interrupts.raise_on_signals()  # SIGTERM and SIGHUP cancel the run as Ctrl-C does
    asked = RunRequest(**{**locals(), "paths": [os.path.abspath(p) for p in paths or []]})
    config = setup(config=run_project(asked.paths))  # the paths made absolute before moving
    os.chdir(config.project_dir)
    from cobalt_app import recordings
    from cobalt_cli.commands_recordings import replay_mode

    asked.mode = replay_mode(config, record=record, replay=replay, record_new=record_new, ci=ci)
    recordings.stand_in_keys(asked.mode)
    if watch:
        raise typer.Exit(run_watching(config, asked))
    raise typer.Exit(run_once(config, asked))


def run_watching(config: Config, asked: RunRequest) -> int:
    """`cobalt run --watch`: run, then rerun what changes (subprocesses given these flags)."""
    if asked.ci or asked.resume or asked.ui or asked.repeat_flaky:
        raise fail("--watch reruns on changes; it does not combine with --ci, --resume, --ui")
    from cobalt_cli.watch import watch as watch_files

    given = {
        "--filter": asked.filter,
        "--tag": asked.tag,
        "--concurrency": asked.concurrency,
        "--runs": asked.runs,
        "--timeout": asked.timeout,
        "--max-llm-calls": asked.max_llm_calls,
        "--max-tool-calls": asked.max_tool_calls,
        "--max-tokens": asked.max_tokens,
        "--max-cost": asked.max_cost,
    }
    run_args = [part for flag, value in given.items() if value for part in (flag, str(value))]
    run_args += ["--no-cache"] * asked.no_cache + ["--quiet"] * asked.quiet
    flags = {"record": "--record", "replay": "--replay", "new-only": "--record-new"}
    run_args += [flags[asked.mode]] if asked.mode else []
    return watch_files(config, asked.paths, run_args, out())


def run_once(config: Config, asked: RunRequest) -> int:
    """Run (or resume) the experiments asked, report them; the exit code. A user's error
    (`CobaltError`) goes up to the CLI's one catch; anything else is a bug's traceback."""
    from rich.markup import escape as escape_markup

    from cobalt.config import terminal_reporter
    from cobalt_cli import commands_ci

    ci_options = commands_ci.CiOptions(
        ci=asked.ci,
        junit=asked.junit,
        reporter=asked.reporter_name or terminal_reporter(config),
        baseline=asked.baseline,
        significance=asked.significance,
    )
    reporter = commands_ci.make_reporter(ci_options, out(), quiet=asked.quiet)
    reporter.banner()
    if asked.resume and (asked.record or asked.replay or asked.record_new):
        raise fail("--resume keeps the --record/--replay mode of the run it resumes")
    if asked.repeat_flaky and asked.resume:
        raise fail("--repeat-flaky plans a new run; --resume keeps the plan of the run it resumes")
    try:
        if asked.resume:
            result = resume_run(config, asked, reporter)
        else:
            result = start_runs(config, asked, reporter, ci_options)
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP, or the output was closed
        reporter.stop_progress()
        report_interrupt(exc)
        return interrupts.exit_code(exc)
    if asked.ui and result.runs and not asked.ci:  # CI mode never opens the dashboard
        from cobalt_cli.commands_dashboard import open_ui

        open_ui(config, result.runs)
    if asked.ci:
        return commands_ci.finish(ci_options, config, result)
    if result.load_errors:
        return EXIT_USAGE
    if any(r.status == "cancelled" for r in result.runs):  # team mode: `cobalt cancel RUN`
        return EXIT_FAILED
    silent = commands_ci.runs_without_output(result.runs)
    for line in silent:
        err().print(f"\n[red]✗[/] {escape_markup(line)}")
    return EXIT_FAILED if silent else 0


def resume_run(config: Config, asked: RunRequest, reporter: Any) -> LaunchResult:
    """`cobalt run --resume RUN`: the missing, failed or timed-out items of RUN; `--resume
    SWEEP`: the variants of SWEEP whose runs did not complete."""
    from cobalt_app import launcher, sweeps
    from cobalt_cli import commands_sweeps

    if sweeps.sweep_exists(asked.resume):
        result = launcher.resume_sweep(
            config, asked.resume, reporter=reporter, no_cache=asked.no_cache
        )
        report_load_errors(config, result.load_errors)
        if not asked.quiet:
            commands_sweeps.print_sweeps(out(), [asked.resume])
        return result
    result = launcher.resume(config, asked.resume, reporter=reporter, no_cache=asked.no_cache)
    report_load_errors(config, result.load_errors)
    return result


def start_runs(config: Config, asked: RunRequest, reporter: Any, ci_options: Any) -> LaunchResult:
    """Load the experiment files asked for and run the experiments they define."""
    from cobalt_app import launcher
    from cobalt_cli import commands_ci, commands_sweeps

    experiments, errors, files = launcher.load_experiments(
        config, asked.paths, name_filter=asked.filter, tag=asked.tag
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
        shown = f" --filter {asked.filter!r}" if asked.filter else ""
        raise fail("no experiment matched" + shown)
    experiments = commands_sweeps.pick_variants(experiments, asked.variants)
    commands_ci.prepare(ci_options, config, experiments)
    overrides = {
        "concurrency": asked.concurrency,
        "runs": asked.runs,
        "timeout": asked.timeout,
        "replay": asked.mode,
        "repeat_flaky": asked.repeat_flaky,
        "maxLlmCalls": asked.max_llm_calls,
        "maxToolCalls": asked.max_tool_calls,
        "maxTokens": asked.max_tokens,
        "maxCost": asked.max_cost,
    }
    result.runs = launcher.execute(
        experiments, config, reporter=reporter, no_cache=asked.no_cache, overrides=overrides
    )
    swept = list(dict.fromkeys(r.sweep_id for r in result.runs if r.sweep_id))
    if swept:  # the ranking is the summary of a sweep: printed even with --quiet
        commands_sweeps.print_sweeps(out(), swept)
    return result


def run_project(paths: list[str]) -> Config:
    """`cobalt run`'s project: the one holding the first path given, else the one found from
    here. With no configuration file anywhere, the current folder when it holds experiment
    files (a project without configuration, as before); otherwise there is no project here."""
    from cobalt.config import NoProjectError, load_config
    from cobalt_app import discovery

    try:
        return load_config(near=paths[0] if paths else None, require_project=True)
    except NoProjectError as missing:
        no_project = missing
    config = load_config()
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
    pairwise: Annotated[
        str | None,
        typer.Option(
            "--pairwise",
            metavar="JUDGE",
            help="Also ask this pairwise judge which output is better: B's win rate.",
        ),
    ] = None,
) -> None:
    """Compare two runs: per-evaluator deltas and the items that changed most (by item key)."""
    from rich.markup import escape
    from rich.table import Table

    config = setup()
    from cobalt.significance import check_alpha
    from cobalt_app.compare_strip import verdict_strip
    from cobalt_app.selectors import compare_runs, run_get
    from cobalt_cli.commands_stats import print_significance

    try:
        alpha = check_alpha(alpha)
    except ValueError as exc:
        raise fail(f"--alpha: {exc}") from None

    a, b = run_get(run_a), run_get(run_b)
    diff = compare_runs(a, b, top=top, alpha=alpha)
    out().print(
        f"\n Comparison: [bold]{a.id}[/] ({escape(a.name)}) vs [bold]{b.id}[/] ({escape(b.name)})"
    )
    sentence = verdict_strip(a, [(b, diff)])["runs"][0]["sentence"]
    out().print(f" Verdict: {escape(sentence)}\n")
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
    if pairwise:
        commands_calibrate.pairwise_in_compare(a, b, pairwise, config)
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
    setup(migrate=False, database_from_env=True)
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=1)


# Commands of the other areas live in their own modules and register themselves here.
# (One import per module; keep this block sorted.)
from cobalt_cli import (  # noqa: E402
    commands_api,
    commands_calibrate,
    commands_ci,
    commands_clean,
    commands_dashboard,
    commands_labels,
    commands_mcp,
    commands_recordings,
    commands_stats,
    commands_sweeps,
    commands_team,
    commands_traces,
)

for _module in (
    commands_api,
    commands_calibrate,
    commands_ci,
    commands_clean,
    commands_dashboard,
    commands_labels,
    commands_mcp,
    commands_recordings,
    commands_stats,
    commands_sweeps,
    commands_team,
    commands_traces,
):
    _module.register(commands)


GC_YOUNG = 20_000


def main() -> None:
    # Skip the interpreter's final garbage collection of everything still alive (a third of
    # a second after a large run): the process is exiting anyway.
    atexit.register(gc.freeze)
    # A young collection every GC_YOUNG allocations, not Python's 700: a run makes millions
    # of short-lived rows, outcomes and entries, and its collections traversed the survivors
    # (its dataset, a chunk's rows) each time: 0.33 s of CPU of a 50,000-item `cobalt run`,
    # 0.05 s so (issue 41). Only cyclic garbage waits longer; the older generations' counts
    # stay Python's.
    gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])
    # A closed output (`cobalt run | head`) stops the command, whichever thread printed.
    sys.stdout = interrupts.GuardedOutput(sys.stdout)
    sys.stderr = interrupts.GuardedOutput(sys.stderr)
    try:
        app()
    except BrokenPipeError:
        sys.exit(EXIT_FAILED)


if __name__ == "__main__":
    main()
