"""Failures become tool errors with a useful message; the server never crashes."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from mcp.server.mcpserver.exceptions import ResourceError, ToolError

from cobalt.config import ConfigError

log = logging.getLogger("cobalt.mcp")


def anticipated() -> tuple[type[Exception], ...]:
    """Failures with a message meant for the user (logged without a traceback)."""
    from cobalt.dataset import DatasetError
    from cobalt_app.discovery import FileRefused
    from cobalt_app.generate import GenerateError
    from cobalt_app.preflight import PreflightError
    from cobalt_app.providers import ProviderError
    from cobalt_app.selectors import RunNotFound

    return (
        FileRefused,
        ConfigError,
        RunNotFound,
        GenerateError,
        ProviderError,
        DatasetError,
        PreflightError,
        FileNotFoundError,
    )


def describe(exc: BaseException) -> str:
    """A message for the client: what went wrong and, where known, what to do."""
    from cobalt_app.discovery import FileRefused
    from cobalt_app.selectors import RunNotFound

    if isinstance(exc, FileRefused):
        return f"refused: {exc}"
    if isinstance(exc, ConfigError):
        return f"configuration error: {exc}"
    if isinstance(exc, RunNotFound):
        return str(exc).replace("`cobalt history` lists runs", "cobalt_results lists runs")
    if isinstance(exc, anticipated()):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


@contextlib.contextmanager
def tool_errors(tool: str) -> Iterator[None]:
    """Every failure becomes a tool error with a useful message."""
    try:
        yield
    except ToolError:
        raise
    except Exception as exc:
        if isinstance(exc, anticipated()):
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
