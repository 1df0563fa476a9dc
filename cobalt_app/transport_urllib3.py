"""urllib3's `HTTPConnectionPool.urlopen`, wrapped for `http_intercept`: requests sends
through it (and so LangChain's community tools and many SDKs do), as does urllib3 itself;
every redirect and retry is a call of its own.

A reply Cobalt gives (replayed, stubbed) is a real `urllib3.HTTPResponse` over the body's
bytes, read as the caller asked (`preload_content`, `decode_content`); requests builds its
`Response` from it as from any other.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from typing import Any

from cobalt_app import http_intercept, runaway
from cobalt_app.http_intercept import Canned


def _full_url(pool: Any, url: str) -> str:
    if url.startswith(("http://", "https://")):
        return url  # through a proxy: the absolute URL
    host = pool.host if ":" not in pool.host else f"[{pool.host}]"
    default = {"http": 80, "https": 443}.get(pool.scheme)
    port = f":{pool.port}" if pool.port and pool.port != default else ""
    return f"{pool.scheme}://{host}{port}{url}"


def _body_of(body: Any) -> Callable[[], bytes | None]:
    def read() -> bytes | None:
        if isinstance(body, bytes | bytearray):
            return bytes(body)
        if isinstance(body, str):
            return body.encode("utf-8")
        return None  # a file or a generator: not read (matched without its body)

    return read


def _response(
    method: str, url: str, status: int, headers: Any, body: bytes, kwargs: dict[str, Any]
) -> Any:
    import urllib3

    return urllib3.HTTPResponse(
        body=io.BytesIO(body),
        headers=dict(headers) if not isinstance(headers, list) else headers,
        status=status,
        reason=_reason(status),
        preload_content=kwargs.get("preload_content", True),
        decode_content=kwargs.get("decode_content", True),
        request_method=method,
        request_url=url,
        version=11,
        version_string="HTTP/1.1",
    )


def _reason(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def _answered(pool: Any, method: str, url: str, canned: Canned, kwargs: dict[str, Any]) -> Any:
    import urllib3

    if canned.delay:
        time.sleep(canned.delay)
    if canned.timeout:
        raise urllib3.exceptions.ReadTimeoutError(pool, url, http_intercept.TIMEOUT_MESSAGE)
    from urllib3._collections import HTTPHeaderDict

    headers = HTTPHeaderDict()
    for name, value in canned.headers:
        headers.add(name, value)
    return _response(method, url, canned.status, headers, canned.body, kwargs)


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    def urlopen(
        self: Any,
        method: str,
        url: str,
        body: Any = None,
        headers: Any = None,
        *rest: Any,
        **kw: Any,
    ) -> Any:
        if not runaway.in_item():
            return original(self, method, url, body, headers, *rest, **kw)
        full = _full_url(self, url)
        out = http_intercept.begin(method, full, _body_of(body))
        if out is None:
            return original(self, method, url, body, headers, *rest, **kw)
        if out.canned is not None:
            try:
                response = _answered(self, out.method, full, out.canned, kw)
            except BaseException as exc:
                out.failed(exc)
                raise
            out.finish(response.status)
            return response
        if out.recording:
            headers = {**(headers or {}), "Accept-Encoding": "identity"}
        with out.sent():
            if not out.recording:
                response = original(self, method, url, body, headers, *rest, **kw)
            else:
                response = _recorded(original, self, out, (method, url, body, headers, *rest), kw)
        out.finish(response.status)
        return response

    urlopen.cobalt_wrapped = True  # type: ignore[attr-defined]
    return urlopen


def _recorded(
    original: Callable[..., Any],
    pool: Any,
    out: http_intercept.Outbound,
    args: tuple[Any, ...],
    kw: dict[str, Any],
) -> Any:
    """The live reply, read whole for the recording, then given to the caller as it asked."""
    sent = {**kw, "preload_content": False, "decode_content": False}
    live = original(pool, *args, **sent)
    try:
        raw = live.read(decode_content=False)
    finally:
        live.release_conn()
    out.keep(live.status, live.headers, raw)
    given = _response(out.method, out.url, live.status, live.headers, raw, kw)
    given.retries = live.retries
    return given


def wrap(module: Any) -> None:
    pool = module.HTTPConnectionPool
    if not getattr(pool.urlopen, "cobalt_wrapped", False):
        pool.urlopen = _wrap(pool.urlopen)
