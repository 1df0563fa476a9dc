"""The OTLP receiver `cobalt run` opens while it runs an HTTP target (embedded mode).

`during_run(experiments, config)` listens on 127.0.0.1:`receiver.port` (OTLP/HTTP's standard
4318, where OpenTelemetry SDKs export by default) for as long as the block runs, answering
`POST /v1/traces` with the same function as `cobalt serve`'s view (`otlp.answer`). After the
last item it waits up to `receiver.grace` seconds until every item's trace is complete: its
service's span under each of the item's requests (its root, which ends last) has arrived
(`received.incomplete_items`; at most NO_EXPORT_WAIT while no service has exported anything: a
service that never exports costs that much). The summaries of runs whose items' traces are then
incomplete say so (`serviceSpans`). A port already taken (a `cobalt serve`, a collector) is
left alone, with a notice: spans sent there are stored by whoever listens.
"""

from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from django.db import close_old_connections, connections
from django.utils import timezone

from cobalt.dashboard import recorded_dashboard
from cobalt.experiments import Experiment
from cobalt.run_settings import RunSettings
from cobalt.targets import HttpTarget
from cobalt_app import received
from cobalt_app.models import ReceivedTrace

logger = logging.getLogger("cobalt.otlp")
POLL = 0.05  # seconds between looks for the last spans
# Seconds to wait for a first export: the SDKs' batch processors export every 5 s by default
# (OTEL_BSP_SCHEDULE_DELAY in Python, Node.js, Go, Java), so a shorter wait lost every span of a
# run that took less than that, from a service set up as their guides say.
NO_EXPORT_WAIT = 6.0


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:  # noqa: N802 - the standard library's name
        # Here, not at the top: protobuf and the OTLP messages (~15 ms) are for a receiver
        # that is sent spans, and every `cobalt run` imports this module (issue 41).
        from cobalt_app import otlp

        if self.path.split("?")[0] != otlp.PATH:
            self._send(404, "text/plain", b"the OTLP receiver listens at /v1/traces", {})
            return
        body = self._body()
        if body is None:
            message = f"the request body is over {otlp.MAX_BYTES} bytes".encode()
            self._send(413, "text/plain", message, {})
            return
        close_old_connections()
        try:
            answer = otlp.answer(
                body,
                self.headers.get("Content-Type", ""),
                self.headers.get("Content-Encoding", ""),
            )
        finally:
            connections.close_all()
        if answer.status == 200:
            self.server.received += 1
        self._send(answer.status, answer.content_type, answer.body, answer.headers)

    def _body(self) -> bytes | None:
        """The request's body (chunked, as Node.js sends it, or not); None past MAX_BYTES."""
        from cobalt_app import otlp

        if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            length = int(self.headers.get("Content-Length") or 0)
            return None if length > otlp.MAX_BYTES else self.rfile.read(length)
        parts, size = [], 0
        while True:
            line = self.rfile.readline(100)
            chunk = int(line.split(b";")[0].strip() or b"0", 16)
            if chunk == 0:
                while self.rfile.readline(1000) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            size += chunk
            if size > otlp.MAX_BYTES:
                self.close_connection = True
                return None
            parts.append(self.rfile.read(chunk))
            self.rfile.readline(10)  # the CRLF after the chunk

    def _send(self, status: int, kind: str, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        logger.debug(format, *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    received = 0


def start(port: int, host: str = "127.0.0.1") -> _Server:
    """A receiver listening on (host, port) in a thread of its own (port 0: any free one)."""
    server = _Server((host, port), _Handler)
    threading.Thread(target=server.serve_forever, name="cobalt-otlp", daemon=True).start()
    return server


def has_target(experiments: list[Experiment]) -> bool:
    return any(isinstance(e.runner, HttpTarget) for e in experiments)


def open_for(experiments: list[Experiment], config: Any) -> RunReceiver | None:
    """The receiver for a run of these experiments: None when none calls an HTTP target, the
    port is 0, or it is taken (said in a warning)."""
    settings = RunSettings.from_config(config).receiver
    if not has_target(experiments) or not settings.port:
        return None
    try:
        server = start(settings.port)
    except OSError as exc:
        logger.warning(
            "the OTLP receiver cannot listen on 127.0.0.1:%s (%s): the services' spans go to "
            "whoever listens there (a `cobalt serve` on that port stores them too)",
            settings.port,
            exc.strerror or exc,
        )
        return None
    return RunReceiver(server, settings.grace)


class RunReceiver:
    def __init__(self, server: _Server, grace: float) -> None:
        self.server = server
        self.grace = grace
        self.opened = timezone.now()

    def finish(self, config: Any) -> dict[str, str]:
        """Wait for the last spans (see the module's docstring), then stop listening; store
        again the `serviceSpans` of the runs whose items it linked (`received.service_spans`),
        with what it says of their traces still incomplete. Returns those warnings, by run id
        (`cobalt.span_notes`). Reads the database: call it off the event loop."""
        try:
            waited = wait_for_spans(self.grace, self.opened, self.server)
        finally:
            self.server.shutdown()
            self.server.server_close()
        runs = (
            ReceivedTrace.objects.filter(item__isnull=False, received_at__gte=self.opened)
            .values_list("item__run_id", flat=True)
            .distinct()
        )
        if waited is None:
            return received.store_service_spans(runs)
        host, port = self.server.server_address[:2]
        return received.store_service_spans(
            runs,
            waitedS=waited,
            receiver=f"http://{host}:{port}",
            serve=recorded_dashboard(config),
        )


def wait_for_spans(grace: float, since: Any, server: _Server) -> float | None:
    """Until every item trace linked since `since` is complete (`received.incomplete_items`:
    an item's spans may come in two batches, its tool and model calls before its service's
    root span), or `grace` seconds passed (NO_EXPORT_WAIT while no service has exported
    anything: one that never does); how long it waited when some are incomplete then, else
    None."""
    started = time.monotonic()
    waiting = received.incomplete_items(since)
    while waiting.exists():
        limit = grace if server.received else min(grace, NO_EXPORT_WAIT)
        if time.monotonic() - started >= limit:
            return limit
        time.sleep(POLL)
    return None


def log_notices(notices: dict[str, str]) -> None:
    """`RunReceiver.finish`'s warnings when no reporter tells them (they are in the runs'
    summaries too)."""
    for text in dict.fromkeys(notices.values()):
        logger.warning("%s", text)
