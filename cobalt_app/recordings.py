"""Record and replay the agent's model calls, item by item (`cobalt run --record/--replay`).

`item_scope()` goes around the runner call of `engine.execute_item` (both modes), where the
trace capture goes. It sets a context variable naming the item's *tape*; the transports of
`httpx` and `httpx2` (the official OpenAI and Anthropic SDKs send through one of them, sync
and async) are wrapped once per process and do nothing unless that variable names a tape
(but refuse the calls of an item whose timeout passed: `runaway`).
asyncio tasks copy the context and the engine runs sync runners in a copy of it, so with 40
items in flight each request finds its own item's tape: an item is never answered from
another item's recording.

Why not vcrpy or respx: both patch the same httpx entry points but hold one cassette (or one
router) per process while active, and decide nothing per request from the context; giving
every item its own would mean one global cassette dispatching on a context variable anyway,
plus their request matchers and YAML files on top. The wrapper here is that dispatch alone.

What is a model call: a request to a known provider host (`api.openai.com`,
`api.anthropic.com`, Azure OpenAI) or to any host on a model endpoint path
(`/chat/completions`, `/messages`, `/embeddings`, `/responses`, ...: every OpenAI-compatible
base URL), plus the hosts of `[replay] hosts`. Other requests (the agent's tools fetching
pages) pass through untouched.

Matching: method, URL (without credentials) and the canonical JSON of the body (keys sorted,
the `[replay] ignore` fields and DEFAULT_IGNORED removed); headers never. Both sides are
redacted the same way first (`redacted_request`: `cobalt.redaction` with the process's secret
environment values), so what is stored holds no secret and a recording made before a rule
was added still matches. The nth identical
request of an item gets the nth recorded reply. A request under `traces.untraced()` (the
judges, the simulated user of a conversation: the judge cache serves them) is never recorded
nor replayed, like the judges' calls made after the scope ends.

A request with no recorded reply in replay mode raises `NoRecordedResponse`, a
BaseException so that the SDKs' retry loops (which catch Exception and retry it as a
connection error) and the agent's own `except Exception` let it through; the item becomes an
`error` whose message starts with `no recorded response`, even if the agent swallowed it.

Stored (see `recording_store`): per exchange, the request's method, URL and body, and the
response's status, a few harmless headers and body (decoded text), all redacted. Request
headers are never stored, so neither are API keys nor `Authorization`; a replayed reply
reads `***` where the provider's had a secret.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import contextvars
import hashlib
import importlib
import importlib.util
import json
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import wrapt

from cobalt.redaction import is_secret_query
from cobalt_app import runaway
from cobalt_app.storable import redacted

RECORD, REPLAY, NEW_ONLY = "record", "replay", "new-only"
MODES = (RECORD, REPLAY, NEW_ONLY)
LABELS = {RECORD: "recorded", REPLAY: "replayed", NEW_ONLY: "replayed"}
MISSING = "no recorded response"

DEFAULT_IGNORED = ("request_id", "user", "metadata.user_id")
PROVIDER_HOSTS = ("api.openai.com", "api.anthropic.com")
PROVIDER_HOST_SUFFIXES = (".openai.azure.com",)
MODEL_PATHS = (
    "/chat/completions",
    "/completions",
    "/embeddings",
    "/responses",
    "/messages",
    "/messages/count_tokens",
    "/complete",
    "/moderations",
    "/audio/speech",
    "/audio/transcriptions",
    "/audio/translations",
    "/images/generations",
    "/images/edits",
)
KEPT_RESPONSE_HEADERS = ("content-type", "request-id", "x-request-id", "retry-after")
KEPT_RESPONSE_PREFIXES = ("openai-", "anthropic-", "x-ratelimit-")
TRANSIENT = 429  # and 5xx: a provider's passing trouble, not the agent's behaviour
REPLAYED_ATTRIBUTE = "cobalt.replayed"


class NoRecordedResponse(BaseException):  # noqa: N818 - reads as the message it carries
    """Replay found no recorded reply for a request (see the module docstring: why Base)."""


HEADERS = {
    RECORD: "recording the agent's model calls (`--replay` answers them next time)",
    REPLAY: "replaying the agent's model calls from recordings (none reaches the provider)",
    NEW_ONLY: "replaying the agent's recorded model calls, recording new ones",
}


def label(mode: str | None) -> str | None:
    """What a run says of itself: "recorded", "replayed" or None (live)."""
    return LABELS.get(mode or "")


STAND_IN_KEY = "cobalt-replay-no-key"
KEY_VARIABLES = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")


def stand_in_keys(mode: str | None) -> None:
    """A replayed run needs no API key, but the SDKs refuse to build a client without one:
    give them a stand-in where none is set (it never reaches a provider: nothing does)."""
    if mode != REPLAY:
        return
    for variable in KEY_VARIABLES:
        if not os.environ.get(variable):
            os.environ[variable] = STAND_IN_KEY


def header(mode: str | None) -> str | None:
    """The run header's line about its model calls (None for a live run)."""
    return HEADERS.get(mode or "")


# ------------------------------------------------------------------ settings of one run


@dataclass
class ReplaySettings:
    """The mode of one run and how it matches; the recordings it loaded, per experiment."""

    mode: str
    ignore: tuple[str, ...] = DEFAULT_IGNORED
    hosts: tuple[str, ...] = ()
    run_id: str = ""
    _loaded: dict[str, asyncio.Future] = field(default_factory=dict, repr=False)

    @classmethod
    def from_config(cls, config: Any, mode: str, run_id: str = "") -> ReplaySettings:
        if mode not in MODES:
            raise ValueError(f"replay mode {mode!r}: use one of {', '.join(MODES)}")
        table = config.get("replay") or {}
        return cls(
            mode=mode,
            ignore=DEFAULT_IGNORED + tuple(table.get("ignore") or ()),
            hosts=tuple(h.lower() for h in table.get("hosts") or ()),
            run_id=run_id,
        )

    async def recorded(self, db: Any, experiment: str, item_key: str, run_index: int) -> list:
        """The item's recorded exchanges; all of the experiment's are read once per run (the
        items that start meanwhile wait for that one read)."""
        from cobalt_app import recording_store

        loading = self._loaded.get(experiment)
        if loading is None or loading.get_loop() is not asyncio.get_running_loop():
            loading = asyncio.ensure_future(db(recording_store.load_experiment, experiment))
            self._loaded[experiment] = loading
        return (await asyncio.shield(loading)).get((item_key, run_index), [])


_by_run: collections.OrderedDict[str, ReplaySettings] = collections.OrderedDict()
_by_run_lock = threading.Lock()
RUNS_KEPT = 16  # a team worker executes items of a few runs at a time


def settings_for(config: Any, run_config: dict[str, Any], run_id: str) -> ReplaySettings | None:
    """The replay settings of a run (`run.config["replay"]`), None for a live run; the same
    object for every item of the run in this process, so recordings are read once."""
    mode = (run_config or {}).get("replay")
    if not mode:
        return None
    with _by_run_lock:
        settings = _by_run.get(run_id)
        if settings is None or settings.mode != mode:
            settings = ReplaySettings.from_config(config, mode, run_id)
            _by_run[run_id] = settings
            while len(_by_run) > RUNS_KEPT:
                _by_run.popitem(last=False)
        return settings


# ------------------------------------------------------------------ requests


def clean_url(url: str) -> str:
    """The URL without user info and without secret-named query parameters, query sorted,
    the rest redacted (a secret environment value in its path)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    query = sorted((k, v) for k, v in parse_qsl(parts.query) if not is_secret_query(k))
    return redacted(urlunsplit((parts.scheme, host, parts.path, urlencode(query), "")))


def redacted_request(method: str, url: str, body: Any) -> tuple[str, str, Any]:
    """A request as stored and matched: URL cleaned, body redacted (see the docstring)."""
    return method.upper(), clean_url(url), redacted(body)


def is_model_call(url: str, extra_hosts: tuple[str, ...] = ()) -> bool:
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if host in PROVIDER_HOSTS or host in extra_hosts or host.endswith(PROVIDER_HOST_SUFFIXES):
        return True
    path = parts.path.rstrip("/")
    return path.endswith(MODEL_PATHS)


def parse_body(raw: bytes) -> Any:
    """The JSON body, or {"text": ...} / {"base64": ...} for one that is not JSON."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        pass
    try:
        return {"text": raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(raw).decode("ascii")}


def _without(body: Any, dotted: str) -> Any:
    if not isinstance(body, dict):
        return body
    head, _, rest = dotted.partition(".")
    if head not in body:
        return body
    trimmed = dict(body)
    if rest:
        trimmed[head] = _without(body[head], rest)
    else:
        del trimmed[head]
    return trimmed


def match_key(method: str, url: str, body: Any, ignore: tuple[str, ...]) -> str:
    """SHA-256 of method, URL and the body's canonical JSON without the ignored fields."""
    for dotted in ignore:
        body = _without(body, dotted)
    canonical = json.dumps(
        [method.upper(), url, body], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(_text(part) for part in content)
    if isinstance(content, dict):
        return _text(content.get("text") or content.get("content") or "")
    return ""


def describe(method: str, url: str, body: Any) -> str:
    """`POST https://api.openai.com/v1/chat/completions (model gpt-4o-mini, last message
    "What is the capital…")`."""
    details = []
    if isinstance(body, dict):
        if body.get("model"):
            details.append(f"model {body['model']}")
        messages = body.get("messages") if isinstance(body.get("messages"), list) else None
        last = messages[-1].get("content") if messages and isinstance(messages[-1], dict) else None
        if last is None and "input" in body:
            given = body["input"]
            last = given[-1] if isinstance(given, list) and given else given
        words = " ".join(_text(last).split())
        if words:
            first = " ".join(words.split()[:8])
            if len(first) > 80:
                first = first[:79]
            more = "…" if len(first) < len(words) else ""
            details.append(f'last message "{first}{more}"')
    return f"{method.upper()} {url}" + (f" ({', '.join(details)})" if details else "")


@dataclass
class Call:
    """One intercepted model request."""

    method: str
    url: str
    body: Any
    key: str

    def stored(self) -> dict[str, Any]:
        return {"method": self.method, "url": self.url, "body": self.body}


# ------------------------------------------------------------------ one item's tape


class Tape:
    """The exchanges of one item: those recorded earlier (replay), those made now (record)."""

    def __init__(self, settings: ReplaySettings, recorded: list[dict[str, Any]]) -> None:
        self.settings = settings
        self.mode = settings.mode
        self.earlier = recorded
        self.by_key: dict[str, list[dict[str, Any]]] = {}
        for exchange in recorded:
            request = exchange["request"]
            method, url, body = redacted_request(request["method"], request["url"], request["body"])
            key = match_key(method, url, body, settings.ignore)
            self.by_key.setdefault(key, []).append(exchange)
        self.served: collections.Counter[str] = collections.Counter()
        self.made: list[dict[str, Any]] = []
        self.missed: str | None = None
        self.replayed = 0
        self.lock = threading.Lock()

    def call(self, method: str, url: str, raw: bytes) -> Call | None:
        """The request as a model call to record or replay, or None to let it through."""
        from opentelemetry.instrumentation.utils import is_instrumentation_enabled

        if not is_model_call(url, self.settings.hosts) or not is_instrumentation_enabled():
            return None  # not a provider, or a judge's/simulated user's call (untraced)
        method, url, body = redacted_request(method, url, parse_body(raw))
        return Call(method, url, body, match_key(method, url, body, self.settings.ignore))

    def answer(self, call: Call) -> dict[str, Any] | None:
        """The recorded reply to serve, None to go live (record, or new-only on a miss);
        raises NoRecordedResponse in replay mode when there is none."""
        if self.mode == RECORD:
            return None
        with self.lock:
            candidates = self.by_key.get(call.key)
            if candidates:
                nth = self.served[call.key]
                self.served[call.key] += 1
                self.replayed += 1
                return candidates[min(nth, len(candidates) - 1)]
            if self.mode == NEW_ONLY:
                return None
            message = f"{MISSING} for {describe(call.method, call.url, call.body)}: " + (
                f"it differs from the {len(self.earlier)} recorded request(s) of this item"
                if self.earlier
                else "this item has no recording"
            )
            message += "; record it with `cobalt run --record` (or `--record-new`)"
            self.missed = self.missed or message
        raise NoRecordedResponse(message)

    def keep(self, call: Call, status: int, headers: Any, body: bytes) -> None:
        exchange = {"request": call.stored(), "response": stored_response(status, headers, body)}
        with self.lock:
            self.made.append(exchange)


def stored_response(status: int, headers: Any, body: bytes) -> dict[str, Any]:
    kept = {
        name.lower(): redacted(value)
        for name, value in headers.items()
        if name.lower() in KEPT_RESPONSE_HEADERS or name.lower().startswith(KEPT_RESPONSE_PREFIXES)
    }
    response: dict[str, Any] = {"status": status, "headers": kept}
    encoding = str(headers.get("content-encoding") or "identity").lower()
    if encoding == "identity":  # as asked for: readable text, unless it is not text
        with contextlib.suppress(UnicodeDecodeError):
            response["body"] = redacted(body.decode("utf-8"))  # a JSON text stays JSON
            return response
    else:  # a server that compressed anyway: the bytes as sent, decoded again on replay
        kept["content-encoding"] = encoding
    response["bodyBase64"] = base64.b64encode(body).decode("ascii")
    return response


def response_body(response: dict[str, Any]) -> bytes:
    if "bodyBase64" in response:
        return base64.b64decode(response["bodyBase64"])
    return str(response.get("body") or "").encode("utf-8")


_tape: contextvars.ContextVar[Tape | None] = contextvars.ContextVar("cobalt_tape", default=None)


# ------------------------------------------------------------------ the transport wrapper


def _replayed(module: Any, exchange: dict[str, Any]) -> Any:
    response = exchange["response"]
    body = response_body(response)
    headers = [*response["headers"].items(), ("content-length", str(len(body)))]
    with contextlib.suppress(Exception):  # the model call's span, when traces are captured
        from opentelemetry import trace as otel_trace

        otel_trace.get_current_span().set_attribute(REPLAYED_ATTRIBUTE, True)
    return module.Response(response["status"], headers=headers, stream=module.ByteStream(body))


def _worth_keeping(status: int) -> bool:
    return status != TRANSIENT and status < 500


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


def _described(request: Any) -> Callable[[], str]:
    return lambda: f"{request.method} {clean_url(str(request.url))}"


def _wrap_sync(module: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    def handle_request(self: Any, request: Any) -> Any:
        runaway.refuse(_described(request))
        tape = _tape.get()
        if tape is None:
            return original(self, request)
        call = tape.call(request.method, str(request.url), request.read())
        if call is None:
            return original(self, request)
        exchange = tape.answer(call)
        if exchange is not None:
            return _replayed(module, exchange)
        _live_headers(request)
        response = original(self, request)
        if _worth_keeping(response.status_code):
            status, headers = response.status_code, response.headers
            response.stream = _capturing_stream(
                module, response.stream, lambda body: tape.keep(call, status, headers, body)
            )
        return response

    handle_request.cobalt_wrapped = True  # type: ignore[attr-defined]
    return handle_request


def _wrap_async(module: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    async def handle_async_request(self: Any, request: Any) -> Any:
        runaway.refuse(_described(request))
        tape = _tape.get()
        if tape is None:
            return await original(self, request)
        call = tape.call(request.method, str(request.url), await request.aread())
        if call is None:
            return await original(self, request)
        exchange = tape.answer(call)
        if exchange is not None:
            return _replayed(module, exchange)
        _live_headers(request)
        response = await original(self, request)
        if _worth_keeping(response.status_code):
            status, headers = response.status_code, response.headers
            response.stream = _capturing_async_stream(
                module, response.stream, lambda body: tape.keep(call, status, headers, body)
            )
        return response

    handle_async_request.cobalt_wrapped = True  # type: ignore[attr-defined]
    return handle_async_request


HTTP_LIBRARIES = ("httpx", "httpx2")
# httpx transports of their own that send without httpx's (module, class): LiteLLM's async
# calls go through aiohttp by default.
OTHER_TRANSPORTS = {
    "litellm.llms.custom_httpx.aiohttp_transport": "LiteLLMAiohttpTransport",
}
_install_lock = threading.RLock()  # the import hook wraps too, maybe inside `install`


def install(*, lazily: bool = False) -> None:
    """Wrap the transports of httpx and httpx2 (those installed), once per process: for
    record/replay, and in every run to refuse the calls of a timed-out item (`runaway`).
    `lazily`: a library not imported yet is wrapped when it is (importing both costs a run
    that uses neither a good part of a second)."""
    with _install_lock:
        for name in HTTP_LIBRARIES:
            if lazily and name not in sys.modules:
                if name not in _hooked and importlib.util.find_spec(name) is not None:
                    _hooked.add(name)
                    wrapt.register_post_import_hook(_wrap_module, name)
                continue
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            _wrap_module(module)
        for name in OTHER_TRANSPORTS:
            if name in sys.modules:
                _wrap_other(sys.modules[name])
            elif name not in _hooked:
                _hooked.add(name)  # their package imports them; no lookup needed now
                wrapt.register_post_import_hook(_wrap_other, name)


def _wrap_other(module: Any) -> None:
    """Wrap a transport of OTHER_TRANSPORTS (an `httpx.AsyncBaseTransport`: its requests and
    responses are httpx's)."""
    import httpx

    with _install_lock:
        transport = getattr(module, OTHER_TRANSPORTS[module.__name__], None)
        handle = getattr(transport, "handle_async_request", None)
        if handle is not None and not getattr(handle, "cobalt_wrapped", False):
            transport.handle_async_request = _wrap_async(httpx, handle)


def _wrap_module(module: Any) -> None:
    with _install_lock:
        sync, asynchronous = module.HTTPTransport, module.AsyncHTTPTransport
        if not getattr(sync.handle_request, "cobalt_wrapped", False):
            sync.handle_request = _wrap_sync(module, sync.handle_request)
        if not getattr(asynchronous.handle_async_request, "cobalt_wrapped", False):
            handle = asynchronous.handle_async_request
            asynchronous.handle_async_request = _wrap_async(module, handle)


_hooked: set[str] = set()


# ------------------------------------------------------------------ around one item


def item_scope(
    env: Any, experiment: str, snapshot: Any, outcome: Any
) -> contextlib.AbstractAsyncContextManager[None]:
    """Record or replay the model calls made inside the block for this item (`env.replay`:
    the run's settings, None for a live run); afterwards a replay miss makes the item an
    error and what was recorded is stored. A live run's items pay for nothing."""
    settings: ReplaySettings | None = getattr(env, "replay", None)
    if settings is None:
        return contextlib.nullcontext()
    return _taped(settings, env, experiment, snapshot, outcome)


@contextlib.asynccontextmanager
async def _taped(
    settings: ReplaySettings, env: Any, experiment: str, snapshot: Any, outcome: Any
) -> AsyncIterator[None]:
    from cobalt_app import recording_store

    install()
    key, run_index = snapshot.item_key, snapshot.run_index
    earlier = []
    if settings.mode != RECORD:
        earlier = await settings.recorded(env.db, experiment, key, run_index)
    tape = Tape(settings, earlier)
    token = _tape.set(tape)
    try:
        yield
    finally:
        _tape.reset(token)
    if tape.missed:
        outcome.status = "error"
        outcome.error = tape.missed
    with tape.lock:
        made = list(tape.made)
    if settings.mode == RECORD or made:
        await env.db(
            recording_store.save,
            experiment=experiment,
            item_key=key,
            run_index=run_index,
            exchanges=made if settings.mode == RECORD else [*earlier, *made],
            run_id=settings.run_id,
        )
