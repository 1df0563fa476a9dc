"""One call of an HTTP target (see `cobalt.targets`): the request with the item's
`traceparent`, retries as for model calls, and the output read from the answer.

The call is a client span in the item's trace (`cobalt.kind = agent`) whose trace and span ids
are attributes (`cobalt.trace_id`, `cobalt.span_id`): the engine links the item to that trace,
and spans the service exports with it join the item's timeline under this one.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import time
from typing import Any

import httpx
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from cobalt.redaction import redact_text
from cobalt.target_spec import (
    _MISSING,
    EXCERPT,
    MAX_RETRY_AFTER,
    RETRIED_STATUSES,
    TargetError,
    TargetSpec,
    expand_headers,
    fill,
    lookup,
    parse_path,
)
from cobalt.tracing import as_text

_tracer = trace.get_tracer("cobalt")
_propagator = TraceContextTextMapPropagator()


def _client(target: TargetSpec) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=200)
    return httpx.AsyncClient(timeout=target.timeout, limits=limits, follow_redirects=True)


async def call(target: TargetSpec, item: dict[str, Any]) -> dict[str, Any]:
    """The service's answer to one item as `{"output", "metadata"}`."""
    body = fill(target.body, item) if target.method != "GET" else None
    params = fill(target.params, item, where="params")
    headers, secrets = expand_headers(target.headers)
    attributes = {
        "cobalt.kind": "agent",
        "cobalt.name": target.label,
        "cobalt.target": target.shown_url,
        "http.request.method": target.method,
    }
    if body is not None:
        attributes["cobalt.input"] = as_text(body)
    with _tracer.start_as_current_span(
        target.label,
        kind=SpanKind.CLIENT,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        context = span.get_span_context()
        if context.is_valid:
            span.set_attribute("cobalt.trace_id", format(context.trace_id, "032x"))
            span.set_attribute("cobalt.span_id", format(context.span_id, "016x"))
        _propagator.inject(headers)
        try:
            status, answer = await _send(target, headers, body, params)
            output, usage = read_output(target, answer, status)
        except Exception as exc:
            span.set_status(Status(StatusCode.ERROR, redact_text(str(exc), secrets)))
            if isinstance(exc, TargetError):
                raise TargetError(redact_text(str(exc), secrets)) from None
            raise
        span.set_attribute("http.response.status_code", status)
        span.set_attribute("cobalt.output", as_text(output))
    metadata: dict[str, Any] = {"status": status}
    if usage:
        metadata["usage"] = usage
    return {"output": output, "metadata": metadata}


async def _send(
    target: TargetSpec, headers: dict[str, str], body: Any, params: dict[str, Any]
) -> tuple[int, str | list[str]]:
    """The final status and body (the events' data when streaming), after retries."""
    client: httpx.AsyncClient = target.client_for(lambda: _client(target))
    attempt = 0
    while True:
        try:
            request = client.build_request(
                target.method,
                target.url,
                headers=headers,
                json=body,
                params=params or None,
                timeout=target.timeout,
            )
            response = await client.send(request, stream=True)
            try:
                if response.status_code in RETRIED_STATUSES and attempt < target.retries:
                    await response.aread()
                    delay = _retry_after(response) or _backoff(attempt)
                else:
                    if target.stream and response.status_code < 400:
                        return response.status_code, await _events(response)
                    return response.status_code, (await response.aread()).decode(
                        response.encoding or "utf-8", errors="replace"
                    )
            finally:
                await response.aclose()
        except (httpx.TransportError, httpx.TimeoutException) as exc:
            if attempt >= target.retries:
                raise TargetError(
                    f"{target.label}: {_transport_error(exc, target)} "
                    f"(after {attempt + 1} attempt{'s' if attempt else ''})."
                ) from None
            delay = _backoff(attempt)
        attempt += 1
        await asyncio.sleep(delay)


def _transport_error(exc: Exception, target: TargetSpec) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {target.timeout:g} s ({type(exc).__name__})"
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect to {target.shown_url}: is the service running? ({exc})"
    return f"{type(exc).__name__}: {exc}"


def _backoff(attempt: int) -> float:
    return min(0.5 * 2**attempt, 8.0) * (0.75 + random.random() / 2)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value)
        if parsed is None:
            return None
        seconds = parsed.timestamp() - time.time()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


async def _events(response: httpx.Response) -> list[str]:
    """The `data` of each server-sent event, read to the end (or `[DONE]`)."""
    found: list[str] = []
    data: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif line == "" and data:
            event = "\n".join(data)
            data = []
            if event.strip() == "[DONE]":
                break
            found.append(event)
    if data and "\n".join(data).strip() != "[DONE]":
        found.append("\n".join(data))
    return found


def read_output(
    target: TargetSpec, answer: str | list[str], status: int
) -> tuple[Any, dict[str, int] | None]:
    """The output the target declares, and the tokens of an OpenAI-style `usage`."""
    if status >= 400:
        text = answer if isinstance(answer, str) else "\n".join(answer)
        raise TargetError(f"{target.label}: the service answered HTTP {status}: {_excerpt(text)}")
    if isinstance(answer, list):
        return _streamed(target, answer)
    if target.output == "body":
        return answer, None
    try:
        value = json.loads(answer)
    except ValueError:
        if target.output is None:
            return answer, None
        raise TargetError(
            f"{target.label}: the answer is not JSON, so `output = {target.output!r}` cannot "
            f'be read from it (use output="body" for its text): {_excerpt(answer)}'
        ) from None
    usage = _usage(value) if target.usage else None
    if target.output is None:
        return value, usage
    found = lookup(value, parse_path(target.output))
    if found is _MISSING:
        raise TargetError(
            f"{target.label}: the JSON path {target.output!r} matched nothing in the answer: "
            f"{_excerpt(answer)}"
        )
    return found, usage


def _streamed(target: TargetSpec, events: list[str]) -> tuple[Any, dict[str, int] | None]:
    if target.output in (None, "body"):
        return "".join(events), None
    parts = parse_path(target.output)
    pieces: list[str] = []
    usage = None
    matched = False
    for event in events:
        try:
            value = json.loads(event)
        except ValueError:
            continue
        if target.usage and isinstance(value, dict) and value.get("usage"):
            usage = _usage(value)
        found = lookup(value, parts)
        if found is _MISSING or found is None:
            continue
        matched = True
        pieces.append(found if isinstance(found, str) else json.dumps(found))
    if not matched:
        shown = _excerpt("\n".join(events))
        raise TargetError(
            f"{target.label}: the JSON path {target.output!r} matched no event of the stream "
            f"({len(events)} events): {shown}"
        )
    return "".join(pieces), usage


def _usage(value: Any) -> dict[str, int] | None:
    usage = value.get("usage") if isinstance(value, dict) else None
    if not isinstance(usage, dict):
        return None
    counts = {k: v for k, v in usage.items() if k.endswith("_tokens") and isinstance(v, int)}
    return counts or None


def _excerpt(text: str) -> str:
    text = redact_text(text.strip())
    if not text:
        return "(an empty body)"
    return text[:EXCERPT] + ("…" if len(text) > EXCERPT else "")
