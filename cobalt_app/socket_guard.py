"""In `--replay`, no connection of an item's agent goes out but those Cobalt let through.

The HTTP clients Cobalt wraps (`http_intercept`) answer from the recording or refuse; this
guard is for everything else: a database driver, a gRPC channel, a client Cobalt does not
know, a raw socket. `socket.socket.connect`/`connect_ex` (which asyncio's event loop calls
too) and `socket.create_connection` (before its name lookup, so the error names the host
and not a DNS failure offline) refuse a TCP/UDP connection made by the code of an item in
replay mode (the context variable of its tape), unless:

- a wrapped transport is sending a request it decided may go out (`http_intercept.sending`),
- the host is one of `[replay] allow_hosts` (by name, or by an address a name resolves to),
- the connection is Cobalt's own: made outside an item's context (the database thread,
  the broker, the judges), or under `traces.untraced()`.

Refused: `NoRecordedResponse` inside the agent (a BaseException: retry loops and `except
Exception` let it through) and the item is an error naming host and port, even if the agent
swallowed it. Unix sockets pass (they never leave the machine).

Installed once per process when the first replayed item starts; a connection then costs one
context lookup more.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from cobalt_app import http_intercept, recordings, runaway

INET = (socket.AF_INET, socket.AF_INET6)
_lock = threading.Lock()
_installed = False


def _check(host: Any, port: Any) -> None:
    tape = recordings.current_tape()
    if tape is None or tape.mode != recordings.REPLAY or http_intercept.sending.get():
        return
    if not runaway.in_item() or not is_instrumentation_enabled():
        return
    name = str(host)
    if tape.settings.allows(name):
        return
    shown = f"[{name}]:{port}" if ":" in name else f"{name}:{port}"
    raise tape.refuse(
        f"{recordings.MISSING}: replay refused a live connection to {shown} (not an HTTP "
        "request Cobalt records: httpx, aiohttp, requests/urllib3, urllib.request); let it "
        "through with "
        "`[replay] allow_hosts`, or run it live"
    )


def _wrap_connect(original: Any) -> Any:
    def connect(self: socket.socket, address: Any) -> Any:
        if self.family in INET and isinstance(address, tuple):
            _check(address[0], address[1])
        return original(self, address)

    connect.cobalt_wrapped = True  # type: ignore[attr-defined]
    return connect


def _wrap_create_connection(original: Any) -> Any:
    def create_connection(address: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(address, tuple):
            _check(address[0], address[1])
        return original(address, *args, **kwargs)

    create_connection.cobalt_wrapped = True  # type: ignore[attr-defined]
    return create_connection


def install() -> None:
    """Guard the process's sockets (once): a no-op for every connection outside a replay."""
    global _installed
    if _installed:
        return
    with _lock:
        if _installed:
            return
        socket.socket.connect = _wrap_connect(socket.socket.connect)  # type: ignore[method-assign]
        socket.socket.connect_ex = _wrap_connect(socket.socket.connect_ex)  # type: ignore[method-assign]
        socket.create_connection = _wrap_create_connection(socket.create_connection)
        _installed = True
