"""The one family of user-facing errors.

A `CobaltError` is a mistake the user can fix (a malformed file, an unknown run, a setting out
of range) or a request refused for a reason they can act on. Its message names the file, field
or run and says what to do. Each door catches the family once and turns it into its own
answer: the CLI prints the message and exits with `exit_code`, the API answers `http_status`,
MCP returns a tool error, a worker marks the run or item failed with the message. Anything
else is a bug: a traceback and exit 1, never a usage message.
"""

from __future__ import annotations


class CobaltError(Exception):
    """A user's error: shown as its message, without a traceback."""

    exit_code: int = 2  # the CLI's usage-error status
    http_status: int = 400
    field: str | None = None  # the request field it is about (the API's 400 names it)


class NotFoundError(CobaltError):
    """What was named (a run, an experiment, a label, a baseline) does not exist."""

    http_status = 404


class ConflictError(CobaltError):
    """The request clashes with the current state (a run already going, already finished)."""

    http_status = 409


class ConfigError(CobaltError, ValueError):
    """The configuration file or an override is invalid; the message says where and what to do."""
