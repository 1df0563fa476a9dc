"""Start a command on its project: its configuration found, Django set up."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cobalt_cli.console import fail

if TYPE_CHECKING:
    from cobalt.config import Config


def setup(*, migrate: bool = True, config: Config | None = None) -> Config:
    """Start Django for the project (migrating the embedded database): `config`'s, or by
    default the one found from the current folder, which must exist (exit 2 otherwise: a
    `ConfigError`, which the CLI reports as any user's error)."""
    from cobalt.config import load_config

    if config is None:
        config = load_config(require_project=True)
    from cobalt_project import bootstrap

    try:
        bootstrap.setup(config, migrate=migrate)
    except Exception as exc:  # the database's own failures, of every driver: said, not traced
        raise fail(f"could not open the database: {exc}") from None
    return config
