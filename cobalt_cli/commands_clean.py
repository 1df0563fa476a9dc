"""`cobalt clean`: old runs, traces and recordings (`cobalt_app.retention`, by hand or by the
`[retention]` policy), the judge cache and result files; and how a clean is reported (also
by `cobalt recordings clean`)."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cobalt.wording import plural

if TYPE_CHECKING:
    from cobalt.config import Config
    from cobalt_app.retention import Kept, Report, Rule

KEPT_SHOWN = 20


class Kind(StrEnum):
    runs = "runs"
    traces = "traces"
    recordings = "recordings"
    production = "production"  # received production traces (`cobalt traces`)


def clean(
    kind: Annotated[
        Kind | None,
        typer.Argument(help="What to delete (default: what the [retention] policy says)."),
    ] = None,
    older_than: Annotated[
        str | None,
        typer.Option("--older-than", metavar="AGE", help="Only what is older (30d, 12h, 2w)."),
    ] = None,
    keep_last: Annotated[
        int | None,
        typer.Option("--keep-last", min=1, metavar="N", help="Keep each experiment's N newest."),
    ] = None,
    experiment: Annotated[
        str | None, typer.Option("--experiment", "-e", help="Only this experiment's.")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be deleted; delete nothing.")
    ] = False,
    cache: Annotated[bool, typer.Option("--cache", help="Delete judge cache entries.")] = False,
    results: Annotated[
        bool, typer.Option("--results", help="Delete result files and their runs.")
    ] = False,
    days: Annotated[
        float | None, typer.Option(min=0, help="With --cache/--results: older than N days.")
    ] = None,
) -> None:
    """Delete old runs, traces or recordings (or the judge cache, result files)."""
    from cobalt.config import parse_age
    from cobalt_cli.console import fail
    from cobalt_cli.project import setup

    legacy = cache or results
    if days is not None and not legacy:
        raise fail(
            "--days goes with --cache or --results; runs, traces and recordings take "
            "--older-than AGE"
        )
    if legacy and kind is None and (older_than or keep_last or experiment or dry_run):
        raise fail(
            "--older-than, --keep-last, --experiment and --dry-run apply to runs, traces and "
            "recordings: name one (`cobalt clean runs --older-than 30d`)"
        )
    seconds = None if older_than is None else parse_age(older_than, key="--older-than")
    config = setup()
    _clean_legacy(config, cache=cache, results=results, days=days)
    from cobalt_app import retention

    if (kind is None and not legacy) or kind == Kind.production:
        _clean_production(config, seconds, dry_run=dry_run, alone=kind is not None)
        if kind is not None:
            return
    if kind is not None or seconds is not None or keep_last is not None:
        kinds = [kind.value] if kind is not None else list(retention.KINDS)
        rules = [retention.Rule(k, seconds, keep_last) for k in kinds]
    elif legacy:
        return
    else:
        rules = _policy(config)
    print_report(retention.clean(rules, config, experiment=experiment, dry_run=dry_run))


def _clean_production(config: Config, seconds: float | None, *, dry_run: bool, alone: bool) -> None:
    """Production traces received before `--older-than` (else `[receiver] retention_days`)."""
    from datetime import timedelta

    from cobalt.run_settings import RunSettings
    from cobalt_app import production_traces
    from cobalt_cli.console import out

    if seconds is None:
        seconds = RunSettings.from_config(config).receiver.retention_days * 86400.0
    if dry_run:
        count = production_traces.expired(timedelta(seconds=seconds)).count()
        out().print(f"Would delete {count} production traces.")
        return
    count = production_traces.clean(timedelta(seconds=seconds))
    if count or alone:
        out().print(f"Deleted {count} production traces.")


def _clean_legacy(config: Config, *, cache: bool, results: bool, days: float | None) -> None:
    """`--cache`: the judge cache; `--results`: result files and their runs (older than
    `days`)."""
    from cobalt_cli.console import out

    if cache:
        from cobalt_app.cache import cache_clear

        out().print(f" Deleted {cache_clear(older_than_days=days)} cache entries.")
    if not results:
        return
    from cobalt_app import retention
    from cobalt_app.housekeeping import delete_results

    age = None if days is None else days * 86400
    baselines = retention.baselines_among(config, older_than=age)
    files, runs = delete_results(config, older_than_days=days)
    out().print(f" Deleted {files} result files and {runs} runs.")
    if baselines:
        out().print(
            f" [yellow]Among them {plural(len(baselines), 'run')} CI compared with "
            "(`cobalt clean runs` keeps such runs):[/]"
        )
        _print_runs(baselines)


def _policy(config: Config) -> list[Rule]:
    """The `[retention]` policy's rules, said; none is a usage error."""
    from rich.markup import escape

    from cobalt_app import retention
    from cobalt_cli.console import fail, out

    rules = retention.policy(config)  # checked when the configuration was read
    if not rules:
        raise fail(
            "nothing to clean: name what (`cobalt clean runs --older-than 30d`, "
            "`cobalt clean traces --keep-last 5`), set a [retention] policy in cobalt.toml, "
            "or pass --cache / --results"
        )
    where = config.path.name if config.path else "cobalt.toml"
    described = "; ".join(rule.describe() for rule in rules)
    out().print(escape(f" [retention] of {where}: {described}."))
    return rules


def print_report(report: Report) -> None:
    """What went (or would go), what stayed and why, and the space given back."""
    from rich.markup import escape

    from cobalt_cli.console import out

    verb = "Would delete" if report.dry_run else "Deleted"
    for kind, counts in report.deleted.items():
        out().print(_deleted_line(verb, kind, counts))
    if report.kept:
        out().print(f" Kept {len(report.kept)} of the matching runs:")
        _print_runs(report.kept)
    if report.labels_unlinked:
        out().print(
            f" {'Would keep' if report.dry_run else 'Kept'} "
            f"{plural(report.labels_unlinked, 'label')} given on these runs: a label belongs "
            "to its output and comes back with it; only its link to the run is cleared."
        )
    if report.blobs:
        out().print(f" Deleted {plural(report.blobs, 'shared blob')} nothing refers to any more.")
    for note in report.notes:
        out().print(f" [yellow]Note: {escape(note)}.[/]")
    if report.space is not None:
        out().print(_space_line(report.space))
    if report.dry_run:
        out().print(" Dry run: nothing was deleted.")


def _deleted_line(verb: str, kind: str, counts: dict[str, int]) -> str:
    total = counts[kind]
    if not total:
        return f" {verb} no {kind}."
    if kind == "runs":
        parts = [plural(counts[f"{w}s"], w) for w in ("item", "evaluation", "trace", "result file")]
        return f" {verb} {plural(total, 'run')}: {', '.join(parts)}."
    if kind == "traces":
        return f" {verb} {plural(total, 'trace')} of {plural(counts['runs'], 'run')}."
    return f" {verb} {plural(total, 'recording')}."


def _space_line(space: Any) -> str:
    """The space the database gave back (or will, or reuses)."""
    from rich.markup import escape

    sizes = f"{_size(space.before)} → {_size(space.after)}"
    if not space.given_back:
        return (
            f" [yellow]Space not given back now: {escape(space.how)}; the next clean "
            "gives it back.[/]"
        )
    if space.database == "PostgreSQL":
        return (
            f" PostgreSQL tables {sizes} ({space.how}): the freed space is reused by new "
            "rows; the files keep their size."
        )
    return (
        f" Gave back {_size(space.returned)}: {escape(space.database)} {sizes} "
        f"({escape(space.how)})."
    )


def _print_runs(runs: list[Kept]) -> None:
    from rich.markup import escape

    from cobalt_cli.console import out

    for run in runs[:KEPT_SHOWN]:
        out().print(f"   {run.run_id}  {escape(run.experiment)}: {escape(run.why)}")
    if len(runs) > KEPT_SHOWN:
        out().print(f"   … and {len(runs) - KEPT_SHOWN} more")


def _size(size: float) -> str:
    units = ("bytes", "kB", "MB", "GB")
    power = 0
    while size >= 1000 and power < len(units) - 1:
        size /= 1000
        power += 1
    return f"{size:.0f} bytes" if power == 0 else f"{size:.1f} {units[power]}"


def register(app: typer.Typer) -> None:
    """Add this area's commands to the `cobalt` app."""
    app.command(name="clean")(clean)
