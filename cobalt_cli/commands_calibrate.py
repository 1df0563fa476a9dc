"""`cobalt calibrate JUDGE [--run RUN] [--probes]`: how far a judge agrees with the reviewers,
where it does not, and how far its verdicts move under bias probes; and the pairwise part of
`cobalt compare A B --pairwise JUDGE` (its win rate).

The printing lives in `cobalt_cli.calibrate_printing` (Rich is imported only when a command
prints); the reads in `cobalt_app.judge_loop`, `cobalt_app.probes` and
`cobalt_app.pairwise_compare`; these commands parse, call them and print.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from cobalt_cli.console import EXIT_FAILED, out
from cobalt_cli.project import setup


def calibrate(
    judge: Annotated[str, typer.Argument(metavar="JUDGE", help="The judge (evaluator) name.")],
    run_id: Annotated[
        str | None,
        typer.Option("--run", help="The run (or a unique prefix); default: the latest with it."),
    ] = None,
    probes: Annotated[
        bool,
        typer.Option(
            "--probes", help="Re-judge the labelled items perturbed: verbosity, position, twice."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """A judge against the reviewers: agreement, and every disagreement with the input, the
    output, the judge's reason and the reviewer's note. Edit the prompt, `cobalt rejudge RUN
    --evaluator JUDGE --labelled`, calibrate again."""
    config = setup()
    from cobalt_app import judge_loop
    from cobalt_app import probes as probing
    from cobalt_cli.calibrate_printing import print_agreement, print_disagreements, print_probes

    if probes:
        report = probing.run_probes(config, judge, run_id)
        if as_json:
            print(json.dumps(report, indent=2))
        else:
            print_probes(out(), report)
        return
    report = judge_loop.judge_report(judge, run_id)
    if as_json:
        print(json.dumps(report, indent=2, default=str))
        return
    print_agreement(out(), report)
    print_disagreements(out(), report)


def pairwise_in_compare(a: Any, b: Any, judge: str, config: Any) -> None:
    """`cobalt compare --pairwise`: print the win rate; exit 1 when no pair could be judged."""
    from cobalt_app.pairwise_compare import pairwise_compare
    from cobalt_cli.calibrate_printing import print_pairwise

    result = pairwise_compare(a, b, judge, config, find_in_file=True)
    print_pairwise(out(), result)
    if result["n"] == 0:
        raise typer.Exit(EXIT_FAILED)


def register(app: typer.Typer) -> None:
    """Add this area's commands to the `cobalt` app."""
    app.command(name="calibrate")(calibrate)
