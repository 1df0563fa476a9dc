"""Stopping a run the way Ctrl-C does: on SIGTERM, SIGHUP (a CI cancel, `timeout`) and when
the output is closed (`cobalt run | head`).

Each becomes `aio.Interrupted` in the main thread, which cancels the run on the event loop:
its unfinished items are marked `cancelled`, the finished ones kept, the run is `cancelled`
and can be resumed. The exit code names the signal (128 + its number: 130 for SIGINT, 129
for SIGHUP, 143 for SIGTERM); a closed output exits 1, as Python's documentation advises.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, TextIO

SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)
CLOSED_OUTPUT = getattr(signal, "SIGPIPE", 13)
REASONS = {"SIGINT": "Interrupted", "SIGTERM": "Terminated", "SIGHUP": "Hung up"}

_output_closed = threading.Event()


def raise_on_signals() -> Callable[[], None]:
    """From now on SIGINT, SIGTERM and SIGHUP raise `Interrupted` in the main thread; returns
    a function that puts the previous handlers back. An ignored signal (`nohup`) stays so."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {
        signum: signal.signal(signum, _interrupt)
        for signum in SIGNALS
        if signal.getsignal(signum) is not signal.SIG_IGN
    }

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    return restore


def _interrupt(signum: int, frame: FrameType | None) -> None:
    from cobalt_app.aio import Interrupted  # asyncio: imported when a run needs it

    raise Interrupted(CLOSED_OUTPUT if _output_closed.is_set() else signum)


def exit_code(exc: BaseException) -> int:
    """128 + the signal's number; 1 when the output was closed."""
    signum = _signum(exc)
    return 1 if signum == CLOSED_OUTPUT else 128 + signum


def reason(exc: BaseException) -> str:
    signum = _signum(exc)
    if signum == CLOSED_OUTPUT:
        return "Output closed"
    name = signal.Signals(signum).name
    return f"{REASONS.get(name, 'Stopped')} ({name})"


def hint(exc: BaseException) -> str:
    """What happened to the run, and how to go on with it."""
    run_id = getattr(exc, "run_id", None)
    if run_id is None:
        return f"{reason(exc)}. No run was started."
    return (
        f"{reason(exc)}. Run {run_id} is cancelled; its finished items are saved. "
        f"Continue with `cobalt run --resume {run_id}`."
    )


def _signum(exc: BaseException) -> int:
    """The signal behind an interrupt, also when it was re-raised as another exception."""
    from cobalt_app.aio import Interrupted

    for candidate in (exc, exc.__context__):
        if isinstance(candidate, Interrupted):
            return candidate.signum
    return signal.SIGINT


class GuardedOutput:
    """stdout/stderr of the CLI: once the reader is gone, writes go to /dev/null. A write of
    the main thread raises BrokenPipeError (the command stops, exit 1); one of another thread
    (the reporter prints from the event-loop thread) interrupts the main thread instead, so
    the run is cancelled rather than its thread killed."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._closed()
            return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._closed()

    def _closed(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)
        if threading.current_thread() is threading.main_thread():
            raise BrokenPipeError("the output was closed")
        if _output_closed.is_set():
            return
        _output_closed.set()
        if signal.getsignal(signal.SIGINT) is _interrupt:  # a run is going: stop it
            # A real signal, to the main thread: it wakes it from waiting on the run (which
            # `_thread.interrupt_main` would not); raised there as `Interrupted(CLOSED_OUTPUT)`.
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
