"""Start a command on its project: its configuration found, Django set up."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from cobalt_cli.console import fail

if TYPE_CHECKING:
    from cobalt.config import Config


def setup(
    *, migrate: bool = True, config: Config | None = None, database_from_env: bool = False
) -> Config:
    """Start Django for the project (migrating the embedded database): `config`'s, or by
    default the one found from the current folder, which must exist (exit 2 otherwise: a
    `ConfigError`, which the CLI reports as any user's error). A command that acts on the
    database (`database_from_env`: migrate, worker, serve) needs no project folder when
    COBALT_DATABASE_URL names it: a deployment folder holds no cobalt.toml."""
    from cobalt.config import load_config
    from cobalt.redaction import redact

    if config is None:
        named = database_from_env and bool(os.environ.get("COBALT_DATABASE_URL"))
        config = load_config(require_project=not named)
    from django.core.exceptions import ImproperlyConfigured
    from django.db import DatabaseError, connection

    from cobalt_project import bootstrap

    try:
        bootstrap.setup(config, migrate=migrate)
        connection.ensure_connection()  # a server that does not answer: said here, once
    # The database's failures (a driver's, a malformed URL, a folder it cannot write): said,
    # not traced. Anything else is a bug, and shows as one.
    except (DatabaseError, ImproperlyConfigured, ValueError, OSError) as exc:
        raise fail(f"could not open the database: {redact(str(exc))}") from None
    return config
