"""The CLI's Rich consoles (kept apart from the reporter: every command imports this).

Rich is imported when a command first prints: it costs ~45 ms, which `cobalt --help`,
`cobalt --version` and argument errors need not pay."""

from __future__ import annotations

import functools
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

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
