"""The standard library's `http.client.HTTPConnection` (so `urllib.request.urlopen`, and
the tools written on it), wrapped for `http_intercept`: `request()` asks before anything is
sent, `getresponse()` gives the answer. urllib3 sends through the same class: a request it
already intercepted (`http_intercept.sending`) passes straight through.

A reply Cobalt gives is a real `http.client.HTTPResponse`, parsed from the reply's bytes.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from cobalt_app import http_intercept, runaway
from cobalt_app.http_intercept import Outbound


class _Bytes:
    """The socket an `HTTPResponse` reads a reply from that is all there."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def makefile(self, *args: Any, **kwargs: Any) -> io.BytesIO:
        return io.BytesIO(self.data)


def _response(method: str, status: int, headers: Any, body: bytes) -> Any:
    import http.client

    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    lines = [f"HTTP/1.1 {status} {reason}"]
    for name, value in headers:
        if name.lower() not in ("content-length", "transfer-encoding"):
            lines.append(f"{name}: {value}")
    lines.append(f"Content-Length: {len(body)}")
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    response = http.client.HTTPResponse(_Bytes(raw), method=method)  # type: ignore[arg-type]
    response.begin()
    return response


def _url(connection: Any, url: str) -> str:
    if url.startswith(("http://", "https://")):
        return url
    scheme = "https" if connection.default_port == 443 else "http"
    host = connection.host if ":" not in connection.host else f"[{connection.host}]"
    port = f":{connection.port}" if connection.port != connection.default_port else ""
    return f"{scheme}://{host}{port}{url}"


def _body(body: Any) -> Callable[[], bytes | None]:
    def read() -> bytes | None:
        if isinstance(body, bytes | bytearray):
            return bytes(body)
        if isinstance(body, str):
            return body.encode("utf-8")
        return None

    return read


def _wrap_request(original: Callable[..., Any]) -> Callable[..., Any]:
    def request(self: Any, method: str, url: str, body: Any = None, headers: Any = None, **kw: Any):
        self._cobalt_out = None
        if http_intercept.sending.get() or not runaway.in_item():
            return original(self, method, url, body, headers or {}, **kw)
        out = http_intercept.begin(method, _url(self, url), _body(body))
        if out is None:
            return original(self, method, url, body, headers or {}, **kw)
        self._cobalt_out = out
        if out.canned is not None:
            return None  # nothing is sent: `getresponse` gives the answer
        if out.recording:
            headers = {**(headers or {}), "Accept-Encoding": "identity"}
        with out.sent():
            return original(self, method, url, body, headers or {}, **kw)

    request.cobalt_wrapped = True  # type: ignore[attr-defined]
    return request


def _wrap_getresponse(original: Callable[..., Any]) -> Callable[..., Any]:
    def getresponse(self: Any) -> Any:
        out: Outbound | None = getattr(self, "_cobalt_out", None)
        self._cobalt_out = None
        if out is None:
            return original(self)
        if out.canned is not None:
            return _answered(out)
        with out.sent():
            response = original(self)
            if out.recording:
                body = response.read()
                out.keep(response.status, response.headers, body)
                response = _response(out.method, response.status, response.getheaders(), body)
        out.finish(response.status)
        return response

    getresponse.cobalt_wrapped = True  # type: ignore[attr-defined]
    return getresponse


def _answered(out: Outbound) -> Any:
    import time

    canned = out.canned
    assert canned is not None
    try:
        if canned.delay:
            time.sleep(canned.delay)
        if canned.timeout:
            raise TimeoutError(http_intercept.TIMEOUT_MESSAGE)
        response = _response(out.method, canned.status, canned.headers, canned.body)
    except BaseException as exc:
        out.failed(exc)
        raise
    out.finish(response.status)
    return response


def wrap(module: Any) -> None:
    connection = module.HTTPConnection
    if not getattr(connection.request, "cobalt_wrapped", False):
        connection.request = _wrap_request(connection.request)
        connection.getresponse = _wrap_getresponse(connection.getresponse)
