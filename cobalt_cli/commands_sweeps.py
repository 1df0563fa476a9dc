"""Sweeps in the terminal: `cobalt run --variants key=value` picks variants, the ranking is
printed after a sweep's runs, and `cobalt sweeps [ID]` lists sweeps or shows (and exports)
one."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from cobalt.experiments import Experiment

VERDICT_COLOURS = {"best": "green", "worse than the best": "red"}
SHORT = {"worse than the best": "worse", "not significantly different from the best": "n.s."}


def pick_variants(experiments: list[Experiment], specs: list[str] | None) -> list[Experiment]:
    """`--variants model=a`: keep the variant experiments matching; others are untouched.
    A selection no variant matches is an error naming the variants there are."""
    from cobalt import variants
    from cobalt_cli.console import fail

    if not specs:
        return experiments
    try:
        wanted = variants.parse_selection(specs)
    except ValueError as exc:
        raise fail(str(exc)) from None
    declared = [e.variant for e in experiments if e.variant is not None]
    if not declared:
        raise fail("--variants picks variants, and no experiment matched declares `variants`")
    chosen = {v.label for v in variants.select(declared, wanted)}
    if not chosen:
        labels = ", ".join(dict.fromkeys(v.label for v in declared))
        raise fail(f"--variants {' '.join(specs)} matches no variant; there are: {labels}")
    return [e for e in experiments if e.variant is None or e.variant.label in chosen]


def print_sweeps(console: Console, sweep_ids: list[str]) -> None:
    from cobalt_app import sweeps

    for sweep_id in sweep_ids:
        print_sweep(console, sweeps.summary(sweeps.sweep_get(sweep_id)))


def _n(value: Any, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def print_sweep(console: Console, result: dict[str, Any]) -> None:
    """The ranking: totals per variant, the Holm-corrected test against the best, Pareto."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, padding=(0, 1), header_style="bold")
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("Variant", overflow="fold", min_width=16)  # wraps before numbers are cut
    for column in ("Mean", "Pass (95% CI)", "p50/p95 ms", "Tokens", "Cost $", "Err"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("vs best (Holm p)", no_wrap=True)
    table.add_column("Pareto", justify="center", no_wrap=True)
    for row in result["variants"]:
        test = row.get("vsBest") or {}
        verdict = test.get("verdict", "best" if row["isBest"] else "")
        colour = VERDICT_COLOURS.get(verdict, "dim")
        verdict = SHORT.get(verdict, verdict)
        if test.get("pHolm") is not None:
            verdict += f" p={test['pHolm']:.2g}"
        interval = row.get("passRateCI")
        rate = _n(row["passRate"], 2)
        if interval:
            rate += f" [{interval[0]:.2f},{interval[1]:.2f}]"
        table.add_row(
            str(row["rank"]),
            escape(row["label"]) + (" (default)" if row["isDefault"] else ""),
            _n(row["meanScore"]),
            rate,
            f"{_n(row['latencyP50'], 0)}/{_n(row['latencyP95'], 0)}",
            str(row["tokens"]),
            _n(row["cost"], 4),
            str(row["errors"]),
            f"[{colour}]{escape(verdict)}[/]",
            "★" if row["pareto"] else "",
        )
    console.print(f"\n[bold]Sweep {escape(result['name'])}[/] ({result['id']})")
    console.print(table, soft_wrap=False)
    for row in result["variants"]:
        if row["meanScore"] is None and row.get("firstError"):
            console.print(f" [red]{escape(row['label'])}: {escape(row['firstError'])}[/]")
    console.print(f" {escape(result['verdict'])}")
    if not result.get("complete", True):
        console.print(
            f" [yellow]Unfinished; resume with [bold]cobalt run --resume {result['id']}[/][/]"
        )


def sweeps_command(
    sweep_id: Annotated[str | None, typer.Argument(help="A sweep id: show it.")] = None,
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="table, json, csv or md (Markdown).")
    ] = "table",
    limit: Annotated[int, typer.Option(min=1, help="Sweeps listed.")] = 20,
) -> None:
    """List sweeps (an experiment run once per variant), or show one's ranking and verdict."""
    from rich.markup import escape

    from cobalt_cli.console import fail, out
    from cobalt_cli.project import setup

    setup()
    from cobalt_app import sweep_exports, sweeps

    if sweep_id is None:
        for sweep in sweeps.sweep_list(limit):
            best = (sweep.summary or {}).get("best") or "—"
            out().print(
                f"{sweep.id}  {escape(sweep.name)}  {len(sweep.variants)} variants  "
                f"best: {escape(best)}  {sweep.created_at:%Y-%m-%d %H:%M}"
            )
        return
    result = sweeps.summary(sweeps.sweep_get(sweep_id))
    if fmt == "table":
        print_sweep(out(), result)
        return
    if fmt not in sweep_exports.FORMATS:
        raise fail(f"--format {fmt!r}: use table, {', '.join(sweep_exports.FORMATS)}")
    sys.stdout.write(sweep_exports.render(result, fmt))


def register(app: typer.Typer) -> None:
    """Add this area's commands to the `cobalt` app."""
    app.command(name="sweeps")(sweeps_command)
