"""Statistics commands: `cobalt flaky`, and the significance table of `cobalt compare`."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console

VERDICT_COLOURS = {"regressed": "red", "improved": "green"}


def print_significance(console: Console, diff: dict[str, Any]) -> None:
    """Per evaluator: paired Δ with its interval, p-value, test and verdict (from compare_runs)."""
    from rich.markup import escape
    from rich.table import Table

    results = diff.get("significance") or {}
    if not results:
        return
    alpha = diff.get("alpha", 0.05)
    level = round((1 - alpha) * 100, 2)
    table = Table(box=None, padding=(0, 2), header_style="bold")
    columns = ("Evaluator", "Pairs", "Δ (paired)", f"{level:g}% CI", "p-value", "Test", "Verdict")
    for column in columns:
        table.add_column(column, justify="left" if column in ("Evaluator", "Test") else "right")
    for name, entry in results.items():
        ci = entry.get("ci")
        verdict = entry["verdict"]
        colour = VERDICT_COLOURS.get(verdict, "dim")
        table.add_row(
            escape(name),
            str(entry["n"]),
            "—" if entry["delta"] is None else f"{entry['delta']:+.3f}",
            "—" if not ci else f"[{ci['low']:+.3f}, {ci['high']:+.3f}]",
            p_text(entry["pValue"]),
            entry["test"],
            f"[{colour}]{verdict}[/]",
        )
    console.print(f"\n Paired tests over items matched by key (α = {alpha:g})")
    console.print(table, soft_wrap=False)
    for name, entry in results.items():
        if entry["onlyInA"] or entry["onlyInB"]:
            console.print(
                f" [yellow]{escape(name)}: {entry['onlyInA']} item(s) scored only in A, "
                f"{entry['onlyInB']} only in B — not in the test[/]"
            )


def p_text(p_value: float | None) -> str:
    if p_value is None:
        return "—"
    return "<0.001" if p_value < 0.001 else f"{p_value:.3f}"


def flaky(
    experiment: Annotated[str, typer.Argument(help="Experiment name (as in `cobalt history`).")],
    last: Annotated[int, typer.Option(min=1, help="Latest finished runs to look at.")] = 20,
    limit: Annotated[int, typer.Option(min=1, help="Items to list.")] = 20,
    pass_score: Annotated[
        float | None,
        typer.Option(
            help="A score at or above this passes, for every evaluator (default: each "
            "evaluator's pass mark, its pass_threshold or 0.5).",
            min=0.0,
        ),
    ] = None,
    min_stddev: Annotated[
        float | None,
        typer.Option(help="Also count items whose score stddev reaches this as flaky.", min=0.0),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the flakiest items of an experiment: verdict flips and score variance across its
    stored runs and their repetitions."""
    from rich.markup import escape
    from rich.table import Table

    from cobalt_cli.console import out
    from cobalt_cli.project import setup

    setup()
    from cobalt_app.flaky import check_experiment, flaky_report

    check_experiment(experiment)
    report = flaky_report(experiment, last=last, pass_score=pass_score, min_stddev=min_stddev)
    if as_json:
        typer.echo(json.dumps(report.to_dict(limit=limit), ensure_ascii=False, indent=2))
        return
    runs = len(report.run_ids)
    observed = len(report.items)
    found = report.flaky
    rule = "each evaluator's pass mark" if pass_score is None else f"score ≥ {pass_score:g}"
    out().print(
        f"\n [bold]{escape(experiment)}[/]: {len(found)} flaky of {observed} items "
        f"over the last {runs} run{'s' * (runs != 1)} (pass: {rule})\n"
    )
    if not found:
        out().print(" No item changed its verdict between runs or repetitions.\n")
        return
    table = Table(box=None, padding=(0, 2), header_style="bold")
    for column in ("Key", "Item", "Flip rate", "Flips", "Obs", "Pass rate", "Errors", "Score sd"):
        table.add_column(column, justify="left" if column == "Key" else "right")
    for item in found[:limit]:
        name, variance = item.max_variance
        spread = "—" if name is None else f"{math.sqrt(variance):.2f} ({escape(name)})"
        table.add_row(
            escape(item.key),
            f"#{item.index + 1}",
            f"{item.flip_rate:.2f}",
            str(item.flips),
            str(item.observations),
            "—" if item.pass_rate is None else f"{item.pass_rate:.2f}",
            str(item.errors),
            spread,
        )
    out().print(table, soft_wrap=False)
    if len(found) > limit:
        out().print(f" … and {len(found) - limit} more (--limit)")
    out().print(
        f"\n Repeat only these items: [bold]cobalt run --filter {escape(experiment)} "
        "--repeat-flaky 5[/]\n",
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    """Add this area's commands to the `cobalt` app."""
    app.command(name="flaky")(flaky)
