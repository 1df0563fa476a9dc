"""CLI commands of the dashboard area."""

import typer


def register(app: typer.Typer) -> None:
    """Add this area's commands to the `cobalt` app."""
