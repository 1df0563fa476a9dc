"""Recordings of the agent's model calls: `cobalt recordings list|clean`, and which mode
`cobalt run --record/--replay/--record-new` (or `[ci] replay = true`) asks for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from cobalt.errors import CobaltError

if TYPE_CHECKING:
    from cobalt.config import Config

recordings_app = typer.Typer(
    name="recordings",
    help="The recorded model calls `cobalt run --replay` serves: list or delete them.",
    no_args_is_help=True,
)


class ReplayOptionError(CobaltError):
    """Flags that contradict each other."""


def replay_mode(
    config: Config, *, record: bool, replay: bool, record_new: bool, ci: bool
) -> str | None:
    """The run's mode: "record", "replay", "new-only" or None (live). `[ci] replay = true`
    makes `--ci` replay unless a flag says otherwise."""
    from cobalt_app.recordings import NEW_ONLY, RECORD, REPLAY

    flags = ((RECORD, record), (REPLAY, replay), (NEW_ONLY, record_new))
    chosen = [mode for mode, on in flags if on]
    if len(chosen) > 1:
        raise ReplayOptionError("--record, --replay and --record-new exclude each other: pick one")
    if chosen:
        return chosen[0]
    if ci and config.get("ci.replay", False):
        return REPLAY
    return None


def list_recordings(
    experiment: Annotated[
        str | None, typer.Option("--experiment", "-e", help="List this experiment's items.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="Items to list with --experiment.")] = 50,
) -> None:
    """Experiments with recordings (items, requests, when); with --experiment, its items."""
    from rich.markup import escape
    from rich.table import Table

    from cobalt_cli.console import out
    from cobalt_cli.project import setup

    setup()
    from cobalt_app import recording_store

    table = Table(box=None, padding=(0, 2), header_style="bold")
    if experiment is None:
        rows = recording_store.experiments_summary()
        for column in ("Experiment", "Items", "Requests", "Last recorded"):
            table.add_column(column)
        for row in rows:
            table.add_row(
                escape(row["experiment"] or "(production traces: any experiment)"),
                str(row["items"]),
                str(row["requests"] or 0),
                row["latest"].strftime("%Y-%m-%d %H:%M:%S"),
            )
        empty = "No recordings yet. `cobalt run --record` records the agent's model calls."
    else:
        rows = recording_store.items_of(experiment, limit=limit)
        for column in ("Item key", "Repetition", "Requests", "Recorded", "By run"):
            table.add_column(column)
        for row in rows:
            table.add_row(
                escape(row["item_key"]),
                str(row["run_index"] + 1),
                str(row["request_count"]),
                row["recorded_at"].strftime("%Y-%m-%d %H:%M:%S"),
                row["recorded_by"] or "—",
            )
        empty = f"No recordings of {experiment!r} (`cobalt recordings list` shows which exist)."
    if not rows:
        out().print(escape(empty))
        return
    out().print(table, soft_wrap=False)


def clean_recordings(
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than", metavar="AGE", help="Only those recorded before AGE ago (30d, 12h)."
        ),
    ] = None,
    experiment: Annotated[
        str | None, typer.Option("--experiment", "-e", help="Only this experiment's.")
    ] = None,
) -> None:
    """Delete recordings (all of them unless narrowed): `cobalt clean recordings`."""
    from cobalt_cli.commands_clean import Kind, clean

    clean(Kind.recordings, older_than=older_than, experiment=experiment)


def register(app: typer.Typer) -> None:
    """Add this area's commands to the `cobalt` app."""
    recordings_app.command(name="list")(list_recordings)
    recordings_app.command(name="clean")(clean_recordings)
    app.add_typer(recordings_app)
