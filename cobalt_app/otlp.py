"""The OTLP receiver: spans a service exports (OTLP/HTTP, protobuf or JSON, gzip) are stored.

`decode(body, content_type, encoding)` reads an export request with the OpenTelemetry protobuf
definitions (`opentelemetry-proto`); `spans_of` reads each span as a step
(`trace_spans.step_of`, so secrets are removed and attributes read as for an item's own spans)
with its ids; `received.ingest` stores them (see there for how they join items).

Spans are stored by one writer thread a process (`Writer`), many requests' in one transaction.
Load: `Gate` bounds the bytes being decoded and stored at once (a request past it is shed with
429 and Retry-After); a body past MAX_BYTES, compressed or not, is 413; a malformed one 400.
"""

from __future__ import annotations

import base64
import json
import threading
import zlib
from concurrent.futures import Future
from typing import Any, NamedTuple

from django.db import connection
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.trace import StatusCode

from cobalt.errors import CobaltError
from cobalt_app import received, results, trace_recordings, trace_spans
from cobalt_app.received import Received, ingest
from cobalt_app.storable import clean_text, process_secrets

PATH = "/v1/traces"
MAX_BYTES = 8 * 1024 * 1024  # a decoded export request; OTLP exporters send ~4 MB at most
IN_FLIGHT_BYTES = 32 * 1024 * 1024  # decoded bytes being ingested at once, over all requests
RETRY_AFTER = 1  # seconds
MESSAGES_LIMIT = 200_000  # characters of a model call's messages kept (see `_keep_messages`)


class ReceiverError(CobaltError):
    """A payload refused: 400 (malformed), 413 (too large), 429 (shed)."""


class TooLarge(ReceiverError):
    http_status = 413


class Shed(ReceiverError):
    http_status = 429


class Gate:
    """At most IN_FLIGHT_BYTES being ingested at once; past it a request is shed (429)."""

    def __init__(self, limit: int = IN_FLIGHT_BYTES) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def enter(self, size: int) -> None:
        with self._lock:
            if self.used and self.used + size > self.limit:
                raise Shed(f"the receiver is busy; retry after {RETRY_AFTER} s")
            self.used += size

    def leave(self, size: int) -> None:
        with self._lock:
            self.used -= size


GATE = Gate()


def receive(body: bytes, content_type: str, encoding: str, gate: Gate = GATE) -> dict[str, Any]:
    """Decode and store one export request; the OTLP response's fields (partial success)."""
    size = len(body)
    gate.enter(size)
    try:
        request = decode(body, content_type, encoding)
        spans, rejected = spans_of(request)
        WRITER.store(spans)
    finally:
        gate.leave(size)
    if rejected:
        message = f"{rejected} spans with a malformed trace or span id"
        return {"partialSuccess": {"rejectedSpans": rejected, "errorMessage": message}}
    return {}


def store(spans: list[Received]) -> None:
    """Ingest spans; the summaries of finished runs whose items' usage they added to (whole:
    `results.refresh_totals`), or whose items' traces they completed (`serviceSpans`)."""
    changed = ingest(spans)
    if changed.totals:
        results.refresh_totals(changed.totals)
    if changed.spans - changed.totals:
        received.store_service_spans(changed.spans - changed.totals)


class Writer:
    """The one thread of a process that stores what its requests decoded: the spans of every
    request waiting are stored in one transaction (up to GROUP_SPANS), on one connection kept
    open, and each request is answered once its spans are committed.

    Why: a request of `cobalt serve` (CONN_MAX_AGE 0 on SQLite) opened a connection and
    closed it (checkpointing the WAL when it was the last), and each request's transaction
    waited for the write lock in SQLite's busy-handler sleeps: a request of 100 spans cost
    10.6-12.5 ms of CPU (median), 6.1-7.1 ms through the writer with the cheaper steps of
    the same change (in-process, as the server calls it; on a machine others loaded). A group
    that fails is stored again request by request: one bad request never fails its
    neighbours. A caller inside a transaction (a test's) stores in it, inline."""

    GROUP_SPANS = 5000

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._pending: list[tuple[list[Received], Future]] = []
        self._thread: threading.Thread | None = None

    def store(self, spans: list[Received]) -> None:
        if not spans:
            return
        if connection.in_atomic_block:
            store(spans)
            return
        done: Future = Future()
        with self._ready:
            self._pending.append((spans, done))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="cobalt-otlp-writer", daemon=True
                )
                self._thread.start()
            self._ready.notify()
        done.result()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._pending:
                    self._ready.wait()
                group, size = [], 0
                while self._pending and (
                    not group or size + len(self._pending[0][0]) <= self.GROUP_SPANS
                ):
                    group.append(self._pending.pop(0))
                    size += len(group[-1][0])
            self._write(group)

    def _write(self, group: list[tuple[list[Received], Future]]) -> None:
        try:
            store([span for spans, _ in group for span in spans])
        except Exception as exc:  # noqa: BLE001 - given to the request(s) it came from
            connection.close()  # a broken connection is made again for the next
            if len(group) > 1:
                for one in group:
                    self._write([one])
                return
            group[0][1].set_exception(exc)
            return
        for _, done in group:
            done.set_result(None)


WRITER = Writer()


def decode(body: bytes, content_type: str, encoding: str) -> ExportTraceServiceRequest:
    """An export request from its bytes: protobuf or JSON (by content type), gzip or not."""
    if len(body) > MAX_BYTES:
        raise TooLarge(f"the request body is over {MAX_BYTES} bytes; export smaller batches")
    encoding = (encoding or "identity").strip().lower()
    if encoding == "gzip":
        body = _gunzip(body)
    elif encoding not in ("identity", ""):
        raise ReceiverError(f"Content-Encoding {encoding!r} is not supported: send gzip or none")
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind == "application/x-protobuf":
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except DecodeError as exc:
            raise ReceiverError(f"the body is not an OTLP protobuf export request: {exc}") from None
        return request
    if kind == "application/json":
        return _from_json(body)
    raise ReceiverError(
        f"Content-Type {content_type!r} is not OTLP: send application/x-protobuf or "
        "application/json"
    )


def _gunzip(body: bytes) -> bytes:
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body, MAX_BYTES + 1)
    except zlib.error as exc:
        raise ReceiverError(f"the body is not valid gzip: {exc}") from None
    if len(data) > MAX_BYTES or inflater.unconsumed_tail:
        raise TooLarge(f"the decompressed body is over {MAX_BYTES} bytes; export smaller batches")
    if not inflater.eof:
        raise ReceiverError("the gzip body is cut short")
    return data


def _from_json(body: bytes) -> ExportTraceServiceRequest:
    """OTLP/JSON: ids are hex (not protobuf JSON's base64), enums may be numbers."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ReceiverError(f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ReceiverError("an OTLP/JSON export request is an object with `resourceSpans`")
    try:
        for resource_spans in data.get("resourceSpans") or []:
            for scope_spans in resource_spans.get("scopeSpans") or []:
                for span in scope_spans.get("spans") or []:
                    _hex_ids(span)
                    for link in span.get("links") or []:
                        _hex_ids(link)
        return json_format.ParseDict(data, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except (json_format.ParseError, AttributeError, TypeError, ValueError) as exc:
        raise ReceiverError(f"the body is not an OTLP/JSON export request: {exc}") from None


def _hex_ids(span: dict[str, Any]) -> None:
    for key in ("traceId", "spanId", "parentSpanId"):
        value = span.get(key)
        if value:
            span[key] = base64.b64encode(bytes.fromhex(value)).decode()


def value_of(value: Any) -> Any:
    """An OTLP `AnyValue` as a Python value."""
    kind = value.WhichOneof("value")
    if kind == "string_value":  # most attributes: one test, not four
        return value.string_value
    if kind is None:
        return None
    if kind == "array_value":
        return [value_of(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value_of(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


class _Status(NamedTuple):
    status_code: StatusCode
    description: str


class _Event(NamedTuple):
    name: str
    attributes: dict[str, Any]


STATUS_CODES = {code.value: code for code in StatusCode}


class _Span(NamedTuple):
    """What `trace_spans.step_of` reads of a span, from an OTLP one."""

    name: str
    start_time: int
    end_time: int
    status: _Status
    events: list[_Event]


def spans_of(request: ExportTraceServiceRequest) -> tuple[list[Received], int]:
    """The request's spans as steps, and how many were rejected (a malformed id)."""
    secrets = process_secrets()
    found: list[Received] = []
    rejected = 0
    for resource_spans in request.resource_spans:
        resource = {kv.key: value_of(kv.value) for kv in resource_spans.resource.attributes}
        service = str(resource.get("service.name") or "")[:200]
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                if len(span.trace_id) != 16 or len(span.span_id) != 8 or not any(span.trace_id):
                    rejected += 1
                    continue
                attributes = {kv.key: value_of(kv.value) for kv in span.attributes}
                adapted = _Span(
                    span.name,
                    span.start_time_unix_nano,
                    span.end_time_unix_nano or span.start_time_unix_nano,
                    _Status(
                        STATUS_CODES.get(span.status.code, StatusCode.UNSET), span.status.message
                    ),
                    [
                        _Event(e.name, {kv.key: value_of(kv.value) for kv in e.attributes})
                        for e in span.events
                    ],
                )
                step = trace_spans.step_of(
                    adapted, attributes, 0, trace_spans.DEFAULT_MAX_CHARS, secrets
                )
                if service:
                    step["service"] = clean_text(service)
                if step["kind"] == "llm":
                    _keep_messages(step, attributes, secrets)
                found.append(
                    Received(
                        span.trace_id.hex(),
                        span.span_id.hex(),
                        span.parent_span_id.hex() if len(span.parent_span_id) == 8 else "",
                        adapted.start_time,
                        adapted.end_time,
                        service,
                        step,
                        attributes,
                    )
                )
    return found, rejected


def _keep_messages(step: dict[str, Any], attributes: dict[str, Any], secrets: Any) -> None:
    """A model call's messages whole (redacted), not cut as its step's input and output are:
    a production trace's model calls become its dataset item's recording
    (`trace_recordings`). The GenAI conventions' attributes, else OpenInference's."""
    given = attributes.get("gen_ai.input.messages"), attributes.get("gen_ai.output.messages")
    if not all(given) and not any(key.startswith("llm.") for key in attributes):
        return  # neither convention's messages (OpenInference's keys are all `llm.`)
    said = {
        "input": given[0]
        or trace_recordings.openinference_messages(attributes, "llm.input_messages"),
        "output": given[1]
        or trace_recordings.openinference_messages(attributes, "llm.output_messages"),
    }
    if said["input"] and said["output"]:
        step["messages"] = {
            k: trace_spans.shown(v, MESSAGES_LIMIT, secrets) for k, v in said.items()
        }


class Answer(NamedTuple):
    status: int
    content_type: str
    body: bytes
    headers: dict[str, str]


def answer(body: bytes, content_type: str, encoding: str, gate: Gate = GATE) -> Answer:
    """The HTTP answer to an export request (for `cobalt serve`'s view and the receiver that
    `cobalt run` starts): 200 with an OTLP export response, or 400/413/429 with the reason."""
    as_json = (content_type or "").split(";")[0].strip().lower() == "application/json"
    try:
        fields = receive(body, content_type, encoding, gate)
    except ReceiverError as exc:
        headers = {"Retry-After": str(RETRY_AFTER)} if isinstance(exc, Shed) else {}
        payload = json.dumps({"code": exc.http_status, "message": str(exc)}).encode()
        return Answer(exc.http_status, "application/json", payload, headers)
    response = ExportTraceServiceResponse()
    if fields:
        response.partial_success.rejected_spans = fields["partialSuccess"]["rejectedSpans"]
        response.partial_success.error_message = fields["partialSuccess"]["errorMessage"]
    if as_json:
        return Answer(200, "application/json", json.dumps(fields).encode(), {})
    return Answer(200, "application/x-protobuf", response.SerializeToString(), {})
