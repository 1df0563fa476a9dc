"""People's labels of a run's evaluations: `cobalt labels list|export|import|add-to-dataset`.

The file formats live in `cobalt_app.label_files`, the dataset files in
`cobalt_app.label_datasets`; these commands parse, call them and print.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from cobalt_app.models import Run

labels_app = typer.Typer(
    name="labels",
    help="People's labels of a run's evaluations: list, export, import, add items to a dataset.",
    no_args_is_help=True,
)

EXPORT_FORMATS = ("csv", "jsonl")


def _run(run_id: str) -> Run:
    from cobalt_app.selectors import run_get

    return run_get(run_id)


def list_labels(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="Run id (or a unique prefix).")],
    disagreements: Annotated[
        bool,
        typer.Option("--disagreements", help="Only labels that disagree with the judge."),
    ] = False,
    evaluator: Annotated[str | None, typer.Option(help="Only this evaluator's labels.")] = None,
) -> None:
    """The run's labels in item order: who said what, and where the judge disagrees."""
    from rich.markup import escape
    from rich.table import Table

    from cobalt_cli.console import out
    from cobalt_cli.project import setup

    setup()
    from cobalt_app import labels

    run = _run(run_id)
    rows = labels.label_list(run, evaluator=evaluator, disagrees=disagreements)
    summary = labels.label_summary(run)
    if not rows:
        what = "disagreements" if disagreements else "labels"
        narrowed = f" of {evaluator!r}" if evaluator else ""
        out().print(f" No {what}{escape(narrowed)} on run {run.id} ({escape(run.name)}).")
        return
    table = Table(box=None, padding=(0, 2), header_style="bold")
    for column in ("Item", "Key", "Evaluator", "Reviewer", "Label", "Judge", "", "Note"):
        table.add_column(
            column, no_wrap=column != "Note", min_width=4 if column == "Note" else None
        )
    for row in rows:
        label = row.label
        judged = "—" if row.judge_score is None else f"{row.judge_score:.2f}"
        flags = "stale" if row.stale else ("[red]disagrees[/]" if row.disagrees else "")
        given = label.verdict + ("" if label.score is None else f" ({label.score:.2f})")
        repetition = f" run {row.run_index + 1}" if row.run_index else ""
        table.add_row(
            f"#{row.item_index + 1}{repetition}",
            escape(label.item_key),
            escape(label.evaluator),
            escape(label.reviewer),
            given,
            f"{judged} {row.judge_verdict}",
            flags,
            escape(_short(label.note)),
        )
    out().print(table, soft_wrap=False)
    reviewers = ", ".join(summary["reviewers"]) or "nobody"
    out().print(
        f"\n {summary['labels']} labels on {summary['itemsLabelled']} items by "
        f"{escape(reviewers)}; {summary['disagreements']} disagree with the judge"
        + (f"; {summary['stale']} stale (the output changed)" if summary["stale"] else "")
        + ".",
        soft_wrap=True,
    )


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def export_labels(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="Run id (or a unique prefix).")],
    fmt: Annotated[
        str | None,
        typer.Option(
            "--format",
            "-f",
            metavar="csv|jsonl",
            help="Default: by the --output extension, else csv.",
        ),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="File to write (default: stdout).")
    ] = None,
    evaluator: Annotated[str | None, typer.Option(help="Only this evaluator's labels.")] = None,
) -> None:
    """Write the run's current labels as CSV or JSON Lines (what `labels import` reads)."""
    import sys

    from rich.markup import escape

    from cobalt_cli.console import fail, out
    from cobalt_cli.project import setup

    if fmt is None:
        suffix = output.suffix.lower() if output else ""
        fmt = {".jsonl": "jsonl", ".ndjson": "jsonl"}.get(suffix, "csv")
    if fmt not in EXPORT_FORMATS:
        raise fail(f"--format: {fmt!r} is not one of {', '.join(EXPORT_FORMATS)}")
    setup()
    from cobalt_app import label_files

    run = _run(run_id)
    text = label_files.export_labels(run, fmt, evaluator=evaluator)
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    target = output.expanduser()
    if not target.parent.resolve().is_dir():
        raise fail(f"--output {output}: folder {target.parent} does not exist")
    with target.open("w", encoding="utf-8", newline="") as fh:
        fh.write(text)
    shown = escape(str(target))
    out().print(f" Exported the labels of run {run.id} to {shown} ({fmt}).", soft_wrap=True)


def import_labels(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="A .csv or .jsonl label file.")],
    reviewer: Annotated[
        str | None,
        typer.Option(help="Reviewer of rows that name none (default: your user name)."),
    ] = None,
) -> None:
    """Save the labels of a CSV or JSON Lines file; a bad line is named and the others kept."""
    import getpass

    from rich.markup import escape

    from cobalt_cli.console import EXIT_FAILED, err, out
    from cobalt_cli.project import setup

    setup()
    from cobalt_app import label_files

    report = label_files.import_file(file, reviewer=reviewer or getpass.getuser())
    failed = len(report.errors)
    for problem in report.errors:
        where = f"{escape(str(file))}, line {problem.line}"
        err().print(f"[red]✗[/] {where}: {escape(problem.reason)}", soft_wrap=True)
    out().print(
        f" Imported {escape(str(file))}: {report.created} new, {report.updated} changed, "
        f"{report.unchanged} unchanged"
        + (f"; [red]{failed} line{'s' * (failed != 1)} failed[/]" if failed else "")
        + ".",
        soft_wrap=True,
    )
    if report.errors:
        raise typer.Exit(EXIT_FAILED)


def add_to_dataset(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="Run id (or a unique prefix).")],
    item: Annotated[
        str, typer.Argument(metavar="ITEM", help="The item's key, or #N for its number.")
    ],
    file: Annotated[
        str, typer.Option("--file", help="A .jsonl dataset file in the project (created if new).")
    ],
    evaluator: Annotated[
        str | None, typer.Option(help="Use the expected output corrected on this evaluator.")
    ] = None,
    reviewer: Annotated[
        str | None, typer.Option(help="Use this reviewer's label (default: anyone's).")
    ] = None,
    repetition: Annotated[
        int,
        typer.Option(min=0, help="Which repetition of the item, 0-based (as in the export)."),
    ] = 0,
) -> None:
    """Append an item of a run, with its reviewed expected output, to a JSON Lines dataset."""
    from rich.markup import escape

    from cobalt_cli.console import out
    from cobalt_cli.project import setup

    setup()
    from cobalt_app import label_datasets

    run = _run(run_id)
    found = _item(run, item, repetition)
    added = label_datasets.add_to_dataset(  # already there: a `LabelConflict`, exit 1
        run=run, item_id=found, path=file, reviewer=reviewer, evaluator=evaluator
    )
    out().print(
        f" Added item {escape(repr(added['id']))} of run {run.id} to "
        f"{escape(added['file'])} (line {added['line']}).",
        soft_wrap=True,
    )


def _item(run: Run, given: str, repetition: int) -> int:
    """The id of the item named by key, or by `#N` (its number)."""
    from cobalt_app import labels

    if given.startswith("#") and given[1:].isdigit():
        return labels.find_item(run, index=int(given[1:]) - 1, repetition=repetition).id
    return labels.find_item(run, key=given, repetition=repetition).id


def register(app: typer.Typer) -> None:
    """Add this area's commands to the `cobalt` app."""
    labels_app.command(name="list")(list_labels)
    labels_app.command(name="export")(export_labels)
    labels_app.command(name="import")(import_labels)
    labels_app.command(name="add-to-dataset")(add_to_dataset)
    app.add_typer(labels_app)
