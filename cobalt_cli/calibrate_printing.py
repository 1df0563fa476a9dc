"""How `cobalt calibrate` and `cobalt compare --pairwise` print: agreement, disagreements,
bias probes and a pairwise win rate (kept apart so `cobalt --help` imports no Rich)."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape


def print_agreement(console: Console, report: dict[str, Any]) -> None:
    """The header, the confusion matrix and the calibration line (κ, bounds, certificate)."""
    confusion = report["agreement"]["confusion"]
    pooled = report["runsPooled"]
    console.print(
        f"\n Judge [bold]{escape(report['judge'])}[/] on run [bold]{report['run']}[/]"
        f" ({escape(report['experiment'])}): {report['labels']} current labels on this run;"
        f" agreement over {pooled} run{'s' * (pooled != 1)} with judge version "
        f"{report['judgeKey']}"
    )
    console.print(
        f"   judge pass / reviewer pass {confusion['tp']}, judge fail / reviewer pass "
        f"{confusion['fn']}, judge pass / reviewer fail {confusion['fp']}, both fail "
        f"{confusion['tn']}"
    )
    console.print(f"   {escape(report['calibration']['line'])}")


def print_disagreements(console: Console, report: dict[str, Any]) -> None:
    rows = report["disagreements"]
    console.print(f"\n [bold]Disagreements[/] ({len(rows)})")
    for row in rows:
        score = "—" if row["judgeScore"] is None else f"{row['judgeScore']:.2f}"
        console.print(
            f"\n   item {row['item']} [dim]{escape(str(row['itemKey']))}[/]: judge "
            f"{escape(row['judgeVerdict'])} ({score}), {escape(row['reviewer'])} said "
            f"[bold]{escape(row['label'])}[/]"
        )
        for name in ("input", "output", "judgeReason", "note"):
            value = row[name]
            if value not in (None, ""):
                text = value if isinstance(value, str) else json.dumps(value, default=str)
                console.print(f"     {name}: {escape(text)}", soft_wrap=True)
    if rows:
        console.print(
            f"\n Edit the judge's prompt, then `cobalt rejudge {report['run']} --evaluator "
            f"{escape(report['judge'])} --labelled` and calibrate the new run.\n"
        )


def print_probes(console: Console, report: dict[str, Any]) -> None:
    console.print(
        f"\n Bias probes of [bold]{escape(report['judge'])}[/] ({escape(report['type'])}) on "
        f"{report['items']} labelled items of run [bold]{report['run']}[/]"
    )
    for probe in report["probes"]:
        rate = "—" if probe["flipRate"] is None else f"{probe['flipRate']:.0%}"
        direction = (
            f": {probe['toPass']} toward pass, {probe['toFail']} toward fail"
            if probe["toPass"] is not None
            else ""
        )
        console.print(
            f"   {probe['probe']:<17} {probe['moved']} on {probe['flips']}/{probe['n']} ({rate})"
            + direction
            + (f"; {probe['errors']} not judged" if probe["errors"] else "")
            + f"  [dim]({escape(probe['about'])})[/]"
        )
        for message in probe["errorMessages"]:
            console.print(f"     [red]error:[/] {escape(message)}")
    console.print()


def print_pairwise(console: Console, result: dict[str, Any]) -> None:
    """The pairwise judge's win rate of B over A (ties half), with the errors named."""
    console.print(
        f"\n Pairwise judge [bold]{escape(result['judge'])}[/]: B vs A on {result['n']} items "
        f"(both orders asked)"
    )
    if result["winRate"] is not None:
        console.print(
            f"   B wins {result['wins']}, ties {result['tied']} ({result['orderDisagreements']} "
            f"where the orders disagreed), A wins {result['losses']}"
        )
        console.print(
            f"   win rate of B {result['winRate']:.2f} (95% {result['low']:.2f} to "
            f"{result['high']:.2f}; {result['ties']}, {result['method']})"
        )
    if result["errors"]:
        console.print(f"   [red]{result['errors']} pairs could not be judged:[/]")
        for message in result["errorMessages"]:
            console.print(f"     {escape(message)}")
