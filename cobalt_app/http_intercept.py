"""What happens to each HTTP request an item's agent sends, whatever its client.

The transports of httpx/httpx2 (`transport_httpx`), aiohttp (`transport_aiohttp`) and urllib3,
under requests (`transport_urllib3`), are wrapped once per process; each asks `begin()` about
a request before sending it. The answer (`Outbound`) is one of:

- None: nothing to do (no item runs here, a judge's untraced call): send it, as if Cobalt
  were not there; this is what every request outside a run costs, a few context lookups;
- a canned answer (`Outbound.canned`): the transport returns it without sending anything:
  a route stub or an injected fault (`cobalt_app.intercepts`, the item's declarations), or
  the recorded reply in `--replay` (`recordings.Tape`);
- send it live, and keep the reply for the recording in `--record` (`Outbound.call`).

In `--replay` a request with no recorded reply is refused (`NoRecordedResponse` inside the
agent, and the item is an error naming it, host and port included), unless its host is one
of `[replay] allow_hosts`; `socket_guard` refuses every other connection.

Each request of an item becomes a step of kind "http" in its trace (`trace_spans`): method,
URL (redacted), status, duration and its mark: `live`, `recorded`, `replayed`, `stubbed`,
`injected` (a fault) or `refused`; the request's body is its input. A model call made
inside an instrumented SDK's span is that span's step already: it gets no step of its own
(the span says "replayed", "stubbed" or "injected").
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace as otel_trace
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.trace import SpanKind, Status, StatusCode

from cobalt.intercept import INJECTED, REPLAYED, STUBBED
from cobalt.intercept import MARK_ATTRIBUTE as INTERCEPTED_ATTRIBUTE
from cobalt_app import intercepts, recordings, runaway, trace_spans, traces

LIVE, RECORDED, REFUSED = "live", "recorded", "refused"
MARKS = (LIVE, RECORDED, REPLAYED, STUBBED, INJECTED, REFUSED)
ANSWERED = (REPLAYED, STUBBED, INJECTED)  # also `cobalt.intercepted` (the run's badges)
MARK_ATTRIBUTE = "cobalt.http.mark"
TIMEOUT_MESSAGE = "timed out (a fault injected by Cobalt)"

_tracer = otel_trace.get_tracer("cobalt.http")

# Set while a transport sends a request it decided may go out: the socket guard lets its
# connection through (an allowed host is matched by name here, by address there).
sending: contextvars.ContextVar[bool] = contextvars.ContextVar("cobalt_http_sending", default=False)


@dataclass
class Canned:
    """An answer given without sending the request: a reply, or the client's timeout error."""

    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    delay: float = 0.0  # seconds before it is given
    timeout: bool = False  # raise the client's own timeout error instead
    mark: str = REPLAYED


def canned_of(exchange: dict[str, Any]) -> Canned:
    """A recorded exchange's reply."""
    response = exchange["response"]
    body = recordings.response_body(response)
    headers = [*response["headers"].items(), ("content-length", str(len(body)))]
    return Canned(status=response["status"], headers=headers, body=body)


@dataclass(frozen=True)
class Request:
    """The request a route stub's `fn` receives, the same whatever the client."""

    method: str
    url: str
    content: bytes | None

    @property
    def text(self) -> str:
        return (self.content or b"").decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content or b"null")


def _stub_for(method: str, url: str, body: Callable[[], bytes | None]) -> Canned | None:
    """The item's route stub or fault for this request (`cobalt_app.intercepts`: the item's
    `fixtures`, the experiment's and the project's declarations), as a canned answer."""
    stub = intercepts.match_route(method, url)
    if stub is None:
        return None
    answer = intercepts.route_answer(stub, Request(method, url, body()))
    return Canned(
        status=answer.status,
        headers=list(answer.headers.items()),
        body=answer.content,
        delay=answer.delay,
        timeout=answer.timeout,
        mark=stub.mark,
    )


class Outbound:
    """One request of an item, from `begin()` until the transport has its reply."""

    __slots__ = ("method", "url", "canned", "call", "tape", "span", "model_span", "mark")

    def __init__(self, method: str, url: str) -> None:
        self.method = method
        self.url = url
        self.canned: Canned | None = None
        self.call: recordings.Call | None = None  # to record, with the reply
        self.tape: recordings.Tape | None = None
        self.span: Any = None
        self.model_span: Any = None
        self.mark = LIVE

    @property
    def recording(self) -> bool:
        """The reply is to be kept: the transport reads it whole and calls `keep()`."""
        return self.call is not None

    def keep(self, status: int, headers: Any, body: bytes) -> None:
        if self.call is not None and self.tape is not None and _worth_keeping(status):
            self.tape.keep(self.call, status, headers, body)

    def finish(self, status: int) -> None:
        """The reply came (status known): the step ends."""
        span = self._marked()
        if span is not None:
            span.set_attribute("http.response.status_code", status)
            if status >= 400:
                span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
            span.end()

    def failed(self, error: BaseException | str) -> None:
        """No reply: the client raised (or Cobalt refused the request, or a timeout fault)."""
        span = self._marked()
        if span is not None:
            text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
            span.set_status(Status(StatusCode.ERROR, text))
            span.end()

    def _marked(self) -> Any:
        """The step's span (None: no step of its own), marked; it is ended only once."""
        answered = self.mark in ANSWERED
        if self.model_span is not None and self.mark == REPLAYED:
            self.model_span.set_attribute(recordings.REPLAYED_ATTRIBUTE, True)
        elif self.model_span is not None and answered:  # a model call stubbed or broken
            self.model_span.set_attribute(INTERCEPTED_ATTRIBUTE, self.mark)
        span, self.span = self.span, None
        if span is not None:
            span.set_attribute(MARK_ATTRIBUTE, self.mark)
            if answered:
                span.set_attribute(INTERCEPTED_ATTRIBUTE, self.mark)
        return span

    @contextlib.contextmanager
    def sent(self) -> Iterator[None]:
        """Around the live send: its connection passes the socket guard; an error ends the
        step."""
        token = sending.set(True)
        try:
            yield
        except BaseException as exc:
            self.failed(exc)
            raise
        finally:
            sending.reset(token)


def _worth_keeping(status: int) -> bool:
    return status != recordings.TRANSIENT and status < 500


def begin(method: str, url: str, body: Callable[[], bytes | None]) -> Outbound | None:
    """What to do with a request the agent is about to send (see the module docstring).
    `body` reads the request's body (only called when it is needed); raises what the agent
    should see when the request may not go out."""
    if not runaway.in_item():  # not an item's agent: Cobalt's own, or no run at all
        return None
    runaway.refuse(lambda: f"{method} {recordings.clean_url(url)}")
    if not is_instrumentation_enabled():  # the simulated user's call (the cache serves it)
        return None
    tape = recordings.current_tape()
    collecting = traces.collecting()
    out = Outbound(method.upper(), url)
    if collecting:
        _start_step(out, body)
    stub = _stub_for(out.method, url, body)
    if stub is not None:
        out.canned, out.mark = stub, stub.mark
        return out
    if tape is None:
        return out if out.span is not None else None
    host = (urlsplit(url).hostname or "").lower()
    if tape.settings.allows(host):
        return out  # live, in every mode: not recorded
    call = tape.call(out.method, url, body())
    try:
        exchange = tape.answer(call)
    except recordings.NoRecordedResponse as refused:
        out.mark = REFUSED
        out.failed(str(refused))
        raise
    if exchange is not None:
        out.canned, out.mark = canned_of(exchange), REPLAYED
    else:
        out.call, out.tape, out.mark = call, tape, RECORDED
    return out


INPUT_BYTES = 8192  # of a request's body kept as its step's input (then cut to max_chars)


def _start_step(out: Outbound, body: Callable[[], bytes | None]) -> None:
    current = otel_trace.get_current_span()
    attributes = getattr(current, "attributes", None)
    described = attributes and (
        trace_spans.kind_of(attributes) == "llm" or "cobalt.trace_id" in attributes
    )
    if current.is_recording() and described:
        # Its step already: an instrumented SDK's model call, an HTTP target's request.
        out.model_span = current
        return
    cleaned = recordings.clean_url(out.url)
    parts = urlsplit(cleaned)
    out.span = _tracer.start_span(
        f"{out.method} {parts.netloc}{parts.path}",
        kind=SpanKind.CLIENT,
        attributes={
            "cobalt.kind": "http",
            "http.request.method": out.method,
            "url.full": cleaned,
            "cobalt.input": (body() or b"")[:INPUT_BYTES].decode("utf-8", "replace"),
        },
        start_time=time.time_ns(),
    )
