"""Failures become tool errors with a useful message; the server never crashes."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from cobalt.config import ConfigError
from cobalt.errors import CobaltError
from cobalt_cli.mcp.sdk import ResourceError, ToolError

log = logging.getLogger("cobalt.mcp")


def describe(exc: BaseException) -> str:
    """A message for the client: a user's error (`CobaltError`) as its message, where known
    with what to do; anything else (a bug) with its type."""
    from cobalt_app.discovery import FileRefused
    from cobalt_app.selectors import RunNotFound

    if isinstance(exc, FileRefused):
        return f"refused: {exc}"
    if isinstance(exc, ConfigError):
        return f"configuration error: {exc}"
    if isinstance(exc, RunNotFound):
        return str(exc).replace("`cobalt history` lists runs", "cobalt_results lists runs")
    if isinstance(exc, CobaltError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


@contextlib.contextmanager
def tool_errors(tool: str) -> Iterator[None]:
    """MCP's one catch: every failure becomes a tool error with a useful message (the server
    never crashes); a user's error (`CobaltError`) is logged without a traceback, a bug with."""
    try:
        yield
    except ToolError:
        raise
    except Exception as exc:
        if isinstance(exc, CobaltError):
            log.info("%s refused: %s", tool, exc)
        else:
            log.exception("%s failed", tool)
        raise ToolError(describe(exc)) from exc


@contextlib.contextmanager
def resource_errors(uri: str) -> Iterator[None]:
    try:
        yield
    except ResourceError:
        raise
    except Exception as exc:
        log.exception("reading %s failed", uri)
        raise ResourceError(f"{uri}: {describe(exc)}") from exc


@contextlib.contextmanager
def database() -> Iterator[None]:
    """ORM work on a worker thread: drop stale connections before and after (PostgreSQL)."""
    from django.db import close_old_connections

    close_old_connections()
    try:
        yield
    finally:
        close_old_connections()
