"""aiohttp's `ClientSession._request`, wrapped for `http_intercept`: every request of a
session goes through it (`get`, `post`, `request`, ...), as do LiteLLM's async calls and the
OpenAI SDK's aiohttp option (httpx transports over an aiohttp session).

A reply Cobalt gives (replayed, stubbed) is a real `aiohttp.ClientResponse` whose body is
already there: `read()`, `json()`, `text()` and `content.iter_chunked()` work as usual. A
recorded reply is read whole first, then given the same way (its connection released).
"""

from __future__ import annotations

import asyncio
import json as jsonlib
from collections.abc import Callable
from http import HTTPStatus
from typing import Any
from urllib.parse import urlencode

from cobalt_app import http_intercept, runaway
from cobalt_app.http_intercept import Canned


class _Sent:
    """What a `ClientResponse` reads of the request's writer once it was sent."""

    output_size = 0


class _NoConnection:
    """The protocol of a reply whose body is all there: nothing to pause or resume."""

    _reading_paused = False
    connected = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self, **_: Any) -> None:
        pass


def _response(session: Any, method: str, url: Any, status: int, headers: Any, body: bytes) -> Any:
    import aiohttp
    from aiohttp.helpers import TimerNoop
    from aiohttp.http import HttpVersion11
    from aiohttp.streams import StreamReader
    from multidict import CIMultiDict, CIMultiDictProxy

    loop = asyncio.get_running_loop()
    given = CIMultiDict((str(k), str(v)) for k, v in _pairs(headers))
    if "content-length" not in given:
        given["Content-Length"] = str(len(body))
    info = aiohttp.RequestInfo(url, method, CIMultiDictProxy(CIMultiDict()), url)
    response = aiohttp.ClientResponse(
        method,
        url,
        writer=None,
        continue100=None,
        timer=TimerNoop(),
        request_info=info,
        traces=[],
        loop=loop,
        session=session,
        stream_writer=_Sent(),  # type: ignore[arg-type]
    )
    response.version = HttpVersion11
    response.status = status
    try:
        response.reason = HTTPStatus(status).phrase
    except ValueError:
        response.reason = ""
    response._headers = CIMultiDictProxy(given)
    response._raw_headers = tuple((k.encode(), v.encode()) for k, v in given.items())
    content = StreamReader(_NoConnection(), 2**16, loop=loop)  # type: ignore[arg-type]
    if body:
        content.feed_data(body)
    content.feed_eof()
    response.content = content
    return response


def _pairs(headers: Any) -> list[tuple[str, str]]:
    if headers is None:
        return []
    if isinstance(headers, list | tuple):
        return list(headers)
    return list(headers.items())


def _body_of(session: Any, kwargs: dict[str, Any]) -> Callable[[], bytes | None]:
    def read() -> bytes | None:
        data, given = kwargs.get("data"), kwargs.get("json")
        if given is not None:
            serialize = getattr(session, "_json_serialize", jsonlib.dumps)
            return serialize(given).encode("utf-8")
        if isinstance(data, bytes | bytearray):
            return bytes(data)
        if isinstance(data, str):
            return data.encode("utf-8")
        if isinstance(data, dict):
            return urlencode(data).encode("utf-8")
        return None  # a stream or a form: not read (matched without its body)

    return read


async def _raise_for_status(session: Any, response: Any, kwargs: dict[str, Any]) -> None:
    check = kwargs.get("raise_for_status")
    if check is None:
        check = getattr(session, "_raise_for_status", False)
    if check is True:
        response.raise_for_status()
    elif callable(check):
        await check(response)


def _identity(kwargs: dict[str, Any]) -> None:
    # A plain body is what gets stored (readable, comparable): no compression.
    headers = {str(k): str(v) for k, v in _pairs(kwargs.get("headers"))}
    headers = {k: v for k, v in headers.items() if k.lower() != "accept-encoding"}
    kwargs["headers"] = {**headers, "Accept-Encoding": "identity"}


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    async def _request(self: Any, method: str, str_or_url: Any, **kwargs: Any) -> Any:
        if not runaway.in_item():
            return await original(self, method, str_or_url, **kwargs)
        url = self._build_url(str_or_url)
        if kwargs.get("params"):
            url = url.extend_query(kwargs["params"])
        out = http_intercept.begin(method, str(url), _body_of(self, kwargs))
        if out is None:
            return await original(self, method, str_or_url, **kwargs)
        if out.canned is not None:
            return await _answered(self, method.upper(), url, out, kwargs)
        if out.recording:
            _identity(kwargs)
        with out.sent():
            response = await original(self, method, str_or_url, **kwargs)
            if out.recording:
                body = await response.read()
                out.keep(response.status, response.headers, body)
                response.release()
                given = _response(
                    self, method.upper(), url, response.status, response.headers, body
                )
                given._history = response.history
                response = given
        out.finish(response.status)
        return response

    _request.cobalt_wrapped = True  # type: ignore[attr-defined]
    return _request


async def _answered(
    session: Any, method: str, url: Any, out: http_intercept.Outbound, kwargs: dict[str, Any]
) -> Any:
    import aiohttp

    canned: Canned = out.canned  # type: ignore[assignment]
    try:
        if canned.delay:
            await asyncio.sleep(canned.delay)
        if canned.timeout:
            raise aiohttp.SocketTimeoutError(http_intercept.TIMEOUT_MESSAGE)
        response = _response(session, method, url, canned.status, canned.headers, canned.body)
        await _raise_for_status(session, response, kwargs)
    except BaseException as exc:
        out.failed(exc)
        raise
    out.finish(response.status)
    return response


def wrap(module: Any) -> None:
    session = module.ClientSession
    if not getattr(session._request, "cobalt_wrapped", False):
        session._request = _wrap(session._request)
