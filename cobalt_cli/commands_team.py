"""CLI commands of the team area."""

import typer


def register(app: typer.Typer) -> None:
    """Add this area's commands to the `cobalt` app."""
