"""Record and replay every HTTP request of the agent, item by item (`cobalt run --record/--replay`).

`item_scope()` goes around the runner call of `engine.execute_item` (both modes), where the
trace capture goes. It sets a context variable naming the item's *tape*; the HTTP clients'
transports (`cobalt_app.http_intercept`: httpx and httpx2, which the OpenAI and Anthropic SDKs
send through; aiohttp, under LiteLLM and the OpenAI SDK's aiohttp option; urllib3, under
requests and many SDKs) are wrapped once per process and ask the tape what to do with each
request; in replay a guard on the sockets (`cobalt_app.socket_guard`) refuses every other
connection the item opens. asyncio tasks copy the context and the engine runs sync runners in
a copy of it, so with 40 items in flight each request finds its own item's tape: an item is
never answered from another item's recording.

Why not vcrpy or respx: both patch the same entry points but hold one cassette (or one
router) per process while active, and decide nothing per request from the context; giving
every item its own would mean one global cassette dispatching on a context variable anyway,
plus their request matchers and YAML files on top. The wrapper here is that dispatch alone.

What is recorded: every request the item's agent sends (its model calls and its tools' HTTP
calls alike), but those to the hosts of `[replay] allow_hosts`, which go out live in replay
too (a local vector database). In replay, nothing else goes out: a request is answered from
the recording or refused.

Matching: method, URL (without credentials) and the canonical JSON of the body (keys sorted,
the `[replay] ignore` fields and DEFAULT_IGNORED removed); headers never. Both sides are
redacted the same way first (`redacted_request`: `cobalt.redaction` with the process's secret
environment values), so what is stored holds no secret and a recording made before a rule
was added still matches. The nth identical
request of an item gets the nth recorded reply. A model call of a production trace the item
was made from is matched by its conversation instead (`trace_recordings`). A request under
`traces.untraced()` (the judges, the simulated user of a conversation: the judge cache serves
them) is never recorded nor replayed, like the judges' calls made after the scope ends.

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
import json
import os
import socket
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from cobalt.redaction import is_secret_query
from cobalt.run_settings import RunSettings
from cobalt_app import trace_recordings
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
    RECORD: "recording the agent's model calls and HTTP requests (`--replay` answers them)",
    REPLAY: "replaying the agent's model calls and HTTP requests from recordings "
    "(nothing goes out)",
    NEW_ONLY: "replaying the agent's recorded model calls, recording new ones (its HTTP "
    "requests too)",
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
    allow_hosts: tuple[str, ...] = ()  # reached live in replay (`[replay] allow_hosts`)
    run_id: str = ""
    _loaded: dict[str, asyncio.Future] = field(default_factory=dict, repr=False)
    _addresses: frozenset[str] | None = field(default=None, repr=False)

    @classmethod
    def from_config(cls, config: Any, mode: str, run_id: str = "") -> ReplaySettings:
        if mode not in MODES:
            raise ValueError(f"replay mode {mode!r}: use one of {', '.join(MODES)}")
        table = RunSettings.from_config(config).recording
        return cls(
            mode=mode,
            ignore=DEFAULT_IGNORED + table.ignore,
            hosts=tuple(h.lower() for h in table.hosts),
            allow_hosts=tuple(h.lower() for h in table.allow_hosts),
            run_id=run_id,
        )

    def allows(self, host: str) -> bool:
        """Whether replay lets a request to `host` (a name or an address) go out live."""
        return bool(self.allow_hosts) and host.lower().strip("[]") in self.allowed_addresses()

    def allowed_addresses(self) -> frozenset[str]:
        """The allowed hosts and the addresses they resolve to (a socket sees addresses)."""
        found = self._addresses
        if found is None:
            names = set(self.allow_hosts)
            for host in self.allow_hosts:
                with contextlib.suppress(OSError, UnicodeError):
                    names.update(info[4][0] for info in socket.getaddrinfo(host, None))
            found = self._addresses = frozenset(names)
        return found

    async def recorded(self, db: Any, experiment: str, item_key: str, run_index: int) -> list:
        """The item's recorded exchanges; all of the experiment's are read once per run (the
        items that start meanwhile wait for that one read)."""
        from cobalt_app import recording_store

        loading = self._loaded.get(experiment)
        if loading is None or loading.get_loop() is not asyncio.get_running_loop():
            loading = asyncio.ensure_future(db(recording_store.load_experiment, experiment))
            self._loaded[experiment] = loading
        found = await asyncio.shield(loading)
        return found.get((item_key, run_index)) or found.get((item_key, recording_store.ANY), [])


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


def matched_body(body: Any, ignore: tuple[str, ...]) -> Any:
    """The body as it is matched: without the ignored fields."""
    for dotted in ignore:
        body = _without(body, dotted)
    return body


def match_key(method: str, url: str, body: Any, ignore: tuple[str, ...]) -> str:
    """SHA-256 of method, URL and the body's canonical JSON without the ignored fields."""
    body = matched_body(body, ignore)
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
        self.requests: list[tuple[str, str | None, Any]] = []  # as matched: for a miss's message
        self.from_traces: list[dict[str, Any]] = []  # a production trace's (`trace_recordings`)
        for exchange in recorded:
            if "fromTrace" in exchange:
                self.from_traces.append(exchange["fromTrace"])
                said = exchange["fromTrace"]["conversation"]
                messages = [{"role": role, "content": text} for role, text in said]
                self.requests.append(("POST", None, {"messages": messages}))
            if "request" not in exchange:
                continue  # a tool call (`tool_tapes`), a production trace's model call
            request = exchange["request"]
            method, url, body = redacted_request(request["method"], request["url"], request["body"])
            key = match_key(method, url, body, settings.ignore)
            self.by_key.setdefault(key, []).append(exchange)
            self.requests.append((method, url, matched_body(body, settings.ignore)))
        self.served: collections.Counter[str] = collections.Counter()
        self.made: list[dict[str, Any]] = []
        self.missed: str | None = None
        self.replayed = 0
        self.lock = threading.Lock()

    def call(self, method: str, url: str, raw: bytes | None) -> Call:
        """The request as stored and matched (see the module docstring)."""
        method, url, body = redacted_request(method, url, parse_body(raw or b""))
        return Call(method, url, body, match_key(method, url, body, self.settings.ignore))

    def refuse(self, message: str) -> NoRecordedResponse:
        """The error of a request replay may not send: kept as the item's error, whatever
        the agent does with the exception."""
        with self.lock:
            self.missed = self.missed or message
        return NoRecordedResponse(message)

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
            traced = self._from_trace(call)
            if traced is not None:
                self.replayed += 1
                return traced
            if self.mode == NEW_ONLY:
                return None
            message = self.missing(call)
            self.missed = self.missed or message
        raise NoRecordedResponse(message)

    def _from_trace(self, call: Call) -> dict[str, Any] | None:
        """The reply of a production trace's model call with this request's conversation (the
        nth such request gets the nth such call's); the caller holds the lock."""
        asked = self.from_traces and trace_recordings.request_conversation(call.url, call.body)
        if not asked:
            return None
        model, conversation = asked
        fits = [
            r
            for r in self.from_traces
            if trace_recordings.same_conversation(conversation, r["conversation"])
            and trace_recordings.same_model(model, r["model"])
        ]
        if not fits:
            return None
        key = "trace:" + call.key
        nth = self.served[key]
        self.served[key] += 1
        found = fits[min(nth, len(fits) - 1)]
        response = trace_recordings.reply(call.url, call.body, found)
        return {"request": call.stored(), "response": response}

    def missing(self, call: Call) -> str:
        """ "no recorded response for …": the closest recorded request and what differs."""
        from cobalt_app.replay_diff import closest

        found = closest(
            call.method, call.url, matched_body(call.body, self.settings.ignore), self.requests
        )
        message = f"{MISSING} for {describe(call.method, call.url, call.body)}: "
        if found is None:
            message += "this item has no recording"
        else:
            index, difference = found
            message += (
                f"the closest of the item's {len(self.requests)} recorded request(s) "
                f"(#{index + 1}) differs {difference}"
            )
        return message + (
            "; record it again with `cobalt run --record` (or `--record-new`), or let its host "
            "through with `[replay] allow_hosts`"
        )

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


def current_tape() -> Tape | None:
    """The tape of the item whose code is running here (None: no record/replay)."""
    return _tape.get()


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
