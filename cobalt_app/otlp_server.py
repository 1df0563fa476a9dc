"""The OTLP receiver `cobalt run` opens while it runs an HTTP target (embedded mode).

`during_run(experiments, config)` listens on 127.0.0.1:`receiver.port` (OTLP/HTTP's standard
4318, where OpenTelemetry SDKs export by default) for as long as the block runs, answering
`POST /v1/traces` with the same function as `cobalt serve`'s view (`otlp.answer`). After the
last item it waits up to `receiver.grace` seconds for the spans of items whose service has not
exported yet (at most NO_EXPORT_WAIT while none has exported anything: a service that never
exports costs that much), then while they still export (a batch within SETTLE seconds:
an item's spans may come in two batches), and the summaries of the runs whose items still
have none say so (`not_arrived`). A port already taken (a `cobalt serve`, a collector) is
left alone, with a notice: spans sent there are stored by whoever listens.
"""

from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from django.db import close_old_connections, connections
from django.db.models import Count
from django.utils import timezone

from cobalt.dashboard import recorded_dashboard
from cobalt.experiments import Experiment
from cobalt.run_settings import RunSettings
from cobalt.targets import HttpTarget
from cobalt.wording import plural
from cobalt_app.models import ReceivedTrace

logger = logging.getLogger("cobalt.otlp")
POLL = 0.05  # seconds between looks for the last spans
# Seconds to wait for a first export: the SDKs' batch processors export every 5 s by default
# (OTEL_BSP_SCHEDULE_DELAY in Python, Node.js, Go, Java), so a shorter wait lost every span of a
# run that took less than that, from a service set up as their guides say.
NO_EXPORT_WAIT = 6.0
SETTLE = 0.5  # seconds without a batch after which a service's spans are taken as all here


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
        """Wait for the last spans (see the module's docstring), then stop listening. Returns
        what the summary of each run (by id) whose items still have no spans then should say
        (`not_arrived`). Reads the database: call it off the event loop."""
        try:
            waited = wait_for_spans(self.grace, self.opened, self.server)
        finally:
            self.server.shutdown()
            self.server.server_close()
        if waited is None:
            return {}
        return not_arrived(self, waited, recorded_dashboard(config))


def wait_for_spans(grace: float, since: Any, server: _Server) -> float | None:
    """Until every item trace linked since `since` has spans, or `grace` seconds passed
    (NO_EXPORT_WAIT while no service has exported anything: one that never does); how long
    it waited when some have none then, else None."""
    started = time.monotonic()
    waiting = ReceivedTrace.objects.filter(item__isnull=False, span_count=0, received_at__gte=since)
    while waiting.exists():
        limit = grace if server.received else min(grace, NO_EXPORT_WAIT)
        if time.monotonic() - started >= limit:
            return limit
        time.sleep(POLL)
    _settle(server, started + grace)
    return None


def _settle(server: _Server, deadline: float) -> None:
    """While the services still export (a batch within SETTLE seconds), until `deadline`: an
    item's spans may come in two batches (its tool and model calls ended before the export, its
    agent span just after), and the receiver closes when the run ends."""
    if not server.received:
        return
    seen, quiet_since = server.received, time.monotonic()
    while time.monotonic() - quiet_since < SETTLE and time.monotonic() < deadline:
        time.sleep(POLL)
        if server.received != seen:
            seen, quiet_since = server.received, time.monotonic()


def not_arrived(receiver: RunReceiver, waited: float, dashboard: str | None) -> dict[str, str]:
    """For each run whose items' traces have no span yet, a warning naming the addresses its
    service may export to: this run's receiver and the project's `cobalt serve` (`dashboard`,
    where it recorded it listens), whose spans join the items too."""
    host, port = receiver.server.server_address[:2]
    here = f"http://{host}:{port}"
    serve = f"this project's `cobalt serve` ({dashboard}/v1/traces)" if dashboard else ""
    traces = ReceivedTrace.objects.filter(item__isnull=False, received_at__gte=receiver.opened)
    missing = traces.filter(span_count=0).values_list("item__run_id").annotate(Count("id"))
    if receiver.server.received or traces.filter(span_count__gt=0).exists():
        later = (
            f"Spans sent later join the items if they go to {serve}; this run's receiver "
            f"({here}/v1/traces) has closed"
            if serve
            else f"Spans sent later to {here}/v1/traces join the items only if a `cobalt serve` "
            "of this project listens there"
        )
        return {
            run_id: f"{plural(count, 'item')} had no span from their service {waited:g} s "
            "after the last item ([receiver] grace): tokens and cost count none of their "
            f"service's model calls. {later}"
            for run_id, count in missing
        }
    text = (
        f"no service exported spans within {waited:g} s of the last item to this run's "
        f"receiver ({here}/v1/traces){' or ' + serve if serve else ''}: the items' timelines "
        "show none of their services' own spans, and tokens and cost none of their model "
        f"calls. Point the service's OTEL_EXPORTER_OTLP_ENDPOINT at {here}"
        f"{f' (or {dashboard})' if dashboard else ''} and have it continue each request's "
        "`traceparent`"
    )
    return {run_id: text for run_id, _ in missing}


def log_notices(notices: dict[str, str]) -> None:
    """`not_arrived`'s warnings when no summary tells them."""
    for text in dict.fromkeys(notices.values()):
        logger.warning("%s", text)
