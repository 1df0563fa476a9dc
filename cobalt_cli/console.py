"""The CLI's Rich consoles, exit codes and its one catch of the user's errors (kept apart from
the reporter and from `main`: every command imports this).

Rich is imported when a command first prints: it costs ~45 ms, which `cobalt --help`,
`cobalt --version` and argument errors need not pay."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

PIPE_WIDTH = 120  # output to a file or a CI log: a wide log line, not a page


def output_width(stream: Any) -> int | None:
    """Width for a Rich console on `stream`: the terminal's (or $COLUMNS) when it is one."""
    if stream.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return None  # Rich reads the terminal size, then $COLUMNS
    return PIPE_WIDTH


def cli_console(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr). On a terminal, text wraps at its width; in a file or a
    CI log a message stays on one line (soft wrap) so a path, a run id or an error can be
    searched for, and only tables are laid out to the width."""
    from rich.console import Console

    width = output_width(sys.stderr if stderr else sys.stdout)
    return Console(stderr=stderr, highlight=False, width=width, soft_wrap=width is not None)


@functools.cache
def out() -> Console:
    """The commands' console on stdout."""
    return cli_console()


@functools.cache
def err() -> Console:
    """The commands' console on stderr: errors, warnings, hints."""
    return cli_console(stderr=True)


def fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    """Print `error: message` on stderr; the exit to raise (`raise fail(...)`)."""
    from rich.markup import escape

    err().print(f"[red]error:[/] {escape(message)}")
    return typer.Exit(code)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """The CLI's one catch of the user's errors: a `CobaltError` is its message on stderr and
    its exit code (2 unless the class says otherwise). Anything else is a bug and goes on as
    a traceback (exit 1)."""
    from cobalt.errors import CobaltError

    try:
        yield
    except CobaltError as exc:
        raise fail(str(exc), exc.exit_code) from None
