"""The transports of httpx and httpx2 (sync and async), wrapped for `http_intercept`: the
official OpenAI and Anthropic SDKs send through them, as do many agents' tools."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from cobalt_app import http_intercept, runaway
from cobalt_app.http_intercept import Canned, Outbound

LIBRARIES = ("httpx", "httpx2")


def _answered(module: Any, request: Any, canned: Canned) -> Any:
    if canned.timeout:
        raise module.ReadTimeout(http_intercept.TIMEOUT_MESSAGE, request=request)
    stream = module.ByteStream(canned.body)
    return module.Response(canned.status, headers=canned.headers, stream=stream)


def _live_headers(request: Any) -> None:
    # A plain body is what gets stored (readable, comparable): no compression.
    request.headers["Accept-Encoding"] = "identity"


def _capturing_stream(module: Any, inner: Any, done: Callable[[bytes], None]) -> Any:
    class Capturing(module.SyncByteStream):
        def __init__(self) -> None:
            self.chunks: list[bytes] = []
            self.finished = False

        def __iter__(self) -> Iterator[bytes]:
            for chunk in inner:
                self.chunks.append(chunk)
                yield chunk

        def close(self) -> None:
            try:
                inner.close()
            finally:
                if not self.finished:
                    self.finished = True
                    done(b"".join(self.chunks))

    return Capturing()


def _capturing_async_stream(module: Any, inner: Any, done: Callable[[bytes], None]) -> Any:
    class Capturing(module.AsyncByteStream):
        def __init__(self) -> None:
            self.chunks: list[bytes] = []
            self.finished = False

        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for chunk in inner:
                self.chunks.append(chunk)
                yield chunk

        async def aclose(self) -> None:
            try:
                await inner.aclose()
            finally:
                if not self.finished:
                    self.finished = True
                    done(b"".join(self.chunks))

    return Capturing()


def _kept(module: Any, out: Outbound, response: Any, *, asynchronous: bool) -> Any:
    """The live response, its body kept for the recording as the agent reads it."""
    out.finish(response.status_code)
    if out.recording:
        status, headers = response.status_code, response.headers
        wrap = _capturing_async_stream if asynchronous else _capturing_stream
        response.stream = wrap(
            module, response.stream, lambda body: out.keep(status, headers, body)
        )
    return response


def _wrap_sync(module: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    def handle_request(self: Any, request: Any) -> Any:
        out = http_intercept.begin(request.method, str(request.url), request.read)
        if out is None:
            return original(self, request)
        if out.canned is not None:
            if out.canned.delay:
                time.sleep(out.canned.delay)
            try:
                response = _answered(module, request, out.canned)
            except BaseException as exc:
                out.failed(exc)
                raise
            out.finish(response.status_code)
            return response
        if out.recording:
            _live_headers(request)
        with out.sent():
            response = original(self, request)
        return _kept(module, out, response, asynchronous=False)

    handle_request.cobalt_wrapped = True  # type: ignore[attr-defined]
    return handle_request


def _wrap_async(module: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    async def handle_async_request(self: Any, request: Any) -> Any:
        if not runaway.in_item():
            return await original(self, request)
        body = await request.aread()
        out = http_intercept.begin(request.method, str(request.url), lambda: body)
        if out is None:
            return await original(self, request)
        if out.canned is not None:
            if out.canned.delay:
                await asyncio.sleep(out.canned.delay)
            try:
                response = _answered(module, request, out.canned)
            except BaseException as exc:
                out.failed(exc)
                raise
            out.finish(response.status_code)
            return response
        if out.recording:
            _live_headers(request)
        with out.sent():
            response = await original(self, request)
        return _kept(module, out, response, asynchronous=True)

    handle_async_request.cobalt_wrapped = True  # type: ignore[attr-defined]
    return handle_async_request


def wrap(module: Any) -> None:
    sync, asynchronous = module.HTTPTransport, module.AsyncHTTPTransport
    if not getattr(sync.handle_request, "cobalt_wrapped", False):
        sync.handle_request = _wrap_sync(module, sync.handle_request)
    if not getattr(asynchronous.handle_async_request, "cobalt_wrapped", False):
        handle = asynchronous.handle_async_request
        asynchronous.handle_async_request = _wrap_async(module, handle)
