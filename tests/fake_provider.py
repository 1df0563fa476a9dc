"""A real HTTP server that fakes the OpenAI and Anthropic APIs for tests and benchmarks.

The official ``openai`` and ``anthropic`` SDKs can be pointed at it unchanged::

    with FakeProvider(latency=0.0) as fp:
        client = openai.OpenAI(base_url=fp.openai_base_url, api_key="test")
        messages = [{"role": "user", "content": "ECHO: hi"}]
        client.chat.completions.create(model="m", messages=messages)
        anthropic.Anthropic(base_url=fp.anthropic_base_url, api_key="test")

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/embeddings`` and ``POST /v1/messages``.
A model request without an ``Authorization`` or ``x-api-key`` header gets a 401.

Reply text (chat and messages) is chosen from the text of all messages (plus ``system``):

* ``[[turns:[R0, R1, ...]]]`` anywhere (a JSON list) -> ``Rk``, where k is the number of
  ``assistant`` messages in the request (the last one past the end), as JSON unless a string:
  a scripted simulated user, whose own earlier messages are the ``assistant`` ones;
* ``[[model:NAME=TEXT]]`` anywhere, when the request's ``model`` is ``NAME`` -> ``TEXT``
  (a model-specific answer: the small model gets this item wrong);
* ``[[reply:TEXT]]`` anywhere -> exactly ``TEXT`` (up to the next ``]]``);
* last user message starting with ``ECHO:`` -> the rest of that message, stripped;
* ``[[prefer:longer]]`` / ``[[prefer:first]]`` anywhere -> a pairwise judge's
  ``{"winner": "A"|"B", ...}``: the longer of the ``<output_a>``/``<output_b>`` sections (A on
  equal length), or always the first shown (a position-biased judge);
* ``[[pass_if_longer:N]]`` anywhere -> score 1.0 when the last user message is longer than N
  characters, else 0.0 (a verbosity-biased judge);
* ``[[alternate]]`` anywhere -> score 1.0 the first time a prompt is seen, 0.0 the second, and
  so on per distinct prompt (an inconsistent judge; counts clear on ``reset()``);
* ``[[score:0.73]]`` anywhere -> ``{"score": 0.73, "reason": "fake judge: scripted score"}``;
* otherwise -> ``{"score": 1.0, "reason": "fake judge: default"}``.

A chat/messages request that offers ``tools`` is answered with one tool call instead: the
tool named by ``tool_choice`` (else the first tool), with the arguments of a
``[[tool:{"json": "object"}]]`` marker anywhere in the prompt, or else arguments built from the
tool's JSON schema (first ``enum`` value, ``"fake"``, ``1``, ``true``, ``[]``). A request
whose last message carries tool results (a chat ``tool`` message, an Anthropic ``tool_result``
block) ends the tool loop: it is answered with text, the ``[[reply:TEXT]]`` of the prompt or
else ``"tool said: "`` and the text of those results. ``[[tools:N]]`` in the prompt asks for
``N`` tool calls in a row before that answer (one per request). smolagents' protocol: a
request offering a ``final_answer`` tool whose last message is an ``Observation:`` (its tool
results) gets a ``final_answer`` call with ``{"answer": "tool said: <observation>"}``.

A chat/messages request with ``"stream": true`` gets the same reply as server-sent events in
the provider's own shape: OpenAI ``chat.completion.chunk`` deltas (a usage chunk when
``stream_options.include_usage``) then ``data: [DONE]``; Anthropic ``message_start`` …
``content_block_delta`` (``text_delta``) … ``message_stop``. The text is sent a few words per
event; a tool call is streamed too (OpenAI ``tool_calls`` deltas, Anthropic
``input_json_delta``), its arguments a few characters per event.

Embeddings are a deterministic 64-dim (or ``dimensions``) signed hashed bag of lowercase word
tokens, L2-normalised: identical texts have cosine 1.0, texts sharing words score high.

Rules keyed on prompt content come before all of these: ``reply_when(contains, reply)`` makes
every chat/messages request whose prompt text holds all of ``contains`` (a text or a list)
answer ``reply`` (JSON unless a string); the first matching rule, in the order added, wins.
They stand until ``reset()``: the replies an evaluation library's prompts ask for (DeepEval's
``{"truths": [...]}``, Ragas' ``{"statements": [...]}``), keyed on a phrase of each prompt.

Scripts, consumed in arrival order: ``fail_next(n, status, retry_after, message)`` fails the
next ``n`` model requests (``message``: the error body's message, as a real API explains a 400);
``invalid_json_next(n)`` makes the next ``n`` chat/messages replies prose that is not JSON.
``latency`` (seconds) is slept in the handler thread of every model request.
Every non-control request is recorded in ``.requests``, its JSON body included.

Cross-process control (for subprocesses and benchmarks):

* ``GET /_stats`` -> ``{"requests", "by_path", "times", "wall_times", "latency"}``;
* ``GET /_requests`` -> the recorded requests' ``path`` and ``json`` bodies, in arrival order;
* ``POST /_control`` with ``{"reset"?, "latency"?, "fail_next"?: {"n", "status",
  "retry_after", "message"?}, "invalid_json_next"?, "reply_when"?: [{"contains", "reply"}]}``
  (``reset`` is applied first).

Run standalone: ``python -m tests.fake_provider --port 0 --latency 0.1`` prints
``FAKE_PROVIDER_URL=http://127.0.0.1:PORT`` once listening and serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import base64
import collections
import hashlib
import itertools
import json
import math
import re
import signal
import struct
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

EMBEDDING_DIM = 64
INVALID_JSON_REPLY = "I think the answer is quite good, maybe 8 out of 10."
DEFAULT_JUDGE_REPLY = {"score": 1.0, "reason": "fake judge: default"}

CHAT_PATH = "/v1/chat/completions"
EMBEDDINGS_PATH = "/v1/embeddings"
MESSAGES_PATH = "/v1/messages"
MODEL_PATHS = (CHAT_PATH, EMBEDDINGS_PATH, MESSAGES_PATH)

_TURNS_MARKER = "[[turns:"
_REPLY_RE = re.compile(r"\[\[reply:(.*?)\]\]", re.DOTALL)
_MODEL_RE = re.compile(r"\[\[model:([^=\]]+)=(.*?)\]\]", re.DOTALL)
_TOOL_RE = re.compile(r"\[\[tool:(\{.*?\})\]\]", re.DOTALL)
_TOOLS_RE = re.compile(r"\[\[tools:(\d+)\]\]")
_PREFER_RE = re.compile(r"\[\[prefer:(longer|first)\]\]")
_LONGER_RE = re.compile(r"\[\[pass_if_longer:(\d+)\]\]")
_SECTION_RE = re.compile(r"<output_([ab])>\n(.*?)\n</output_\1>", re.DOTALL)
_SCORE_RE = re.compile(r"\[\[score:\s*([-+]?\d*\.?\d+(?:[eE][-+]?\d+)?)\s*\]\]")
_WORD_RE = re.compile(r"[a-z0-9]+")

_ERROR_TYPES = {
    400: ("invalid_request_error", "invalid_request_error"),
    401: ("invalid_api_key", "authentication_error"),
    404: ("not_found_error", "not_found_error"),
    429: ("rate_limit_exceeded", "rate_limit_error"),
    529: ("server_error", "overloaded_error"),
}


# --------------------------------------------------------------------------- pure helpers


def count_tokens(text: str) -> int:
    """Deterministic token estimate: the number of whitespace-separated words."""
    return len(text.split())


def embed_text(text: str, dim: int = EMBEDDING_DIM) -> list[float]:
    """Signed hashed bag-of-words embedding, L2-normalised (all zeros for empty text)."""
    vector = [0.0] * dim
    for token in _WORD_RE.findall(text.lower()):
        digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
        value = int.from_bytes(digest, "little")
        vector[value % dim] += 1.0 if (value >> 32) & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm else vector


def content_text(content: Any) -> str:
    """Flatten OpenAI/Anthropic message content (string or list of parts/blocks) to text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(filter(None, (content_text(part) for part in content)))
    if isinstance(content, dict):
        if isinstance(content.get("text"), str):
            return content["text"]
        return content_text(content.get("content"))
    return str(content)


def prompt_text(body: dict[str, Any]) -> str:
    """All prompt text of a chat/messages request: ``system`` plus every message."""
    parts = [content_text(body.get("system"))]
    parts += [content_text(m.get("content")) for m in body.get("messages") or []]
    return "\n".join(p for p in parts if p)


def last_user_text(body: dict[str, Any]) -> str:
    """Text of the last message whose role is ``user`` (empty if none)."""
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


def choose_reply(body: dict[str, Any]) -> str:
    """Pick the scripted reply text for a chat/messages request (see module docstring)."""
    text = prompt_text(body)
    if (script := _turn_script(text)) is not None:
        turn = sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")
        reply = script[min(turn, len(script) - 1)]
        return reply if isinstance(reply, str) else json.dumps(reply)
    for name, reply in _MODEL_RE.findall(text):
        if body.get("model") == name:
            return reply
    if match := _REPLY_RE.search(text):
        return match.group(1)
    last = last_user_text(body).lstrip()
    if last.startswith("ECHO:"):
        return last[len("ECHO:") :].strip()
    if match := _PREFER_RE.search(text):
        return json.dumps({"winner": _preferred(match.group(1), last), "reason": "fake pairwise"})
    if match := _LONGER_RE.search(text):
        score = 1.0 if len(last) > int(match.group(1)) else 0.0
        return json.dumps({"score": score, "reason": "fake judge: longer passes"})
    if match := _SCORE_RE.search(text):
        return json.dumps({"score": float(match.group(1)), "reason": "fake judge: scripted score"})
    return json.dumps(DEFAULT_JUDGE_REPLY)


def _preferred(rule: str, text: str) -> str:
    if rule == "first":
        return "A"
    sections = dict(_SECTION_RE.findall(text))
    return "B" if len(sections.get("b", "")) > len(sections.get("a", "")) else "A"


def _turn_script(text: str) -> list[Any] | None:
    """The list of a ``[[turns:[...]]]`` marker (JSON), or None."""
    start = text.find(_TURNS_MARKER)
    if start < 0:
        return None
    try:
        script, _ = json.JSONDecoder().raw_decode(text, start + len(_TURNS_MARKER))
    except ValueError:
        return None
    return script if isinstance(script, list) and script else None


def schema_default(schema: Any) -> Any:
    """A minimal value that satisfies a simple JSON schema (the default tool-call arguments)."""
    if not isinstance(schema, dict):
        return None
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties") or {}
        return {name: schema_default(properties[name]) for name in properties}
    defaults = {"string": "fake", "integer": 1, "number": 1, "boolean": True, "array": []}
    return defaults.get(kind) if isinstance(kind, str) else None


def choose_tool_call(body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(tool name, arguments) for a request that offers ``tools`` (see module docstring)."""
    tools = body.get("tools") or []
    choice = body.get("tool_choice")
    name = None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") or choice.get("name")
    chosen = None
    for tool in tools:
        spec = tool.get("function") or tool  # OpenAI nests under "function", Anthropic not
        if name is None or spec.get("name") == name:
            chosen = spec
            break
    chosen = chosen or {}
    schema = chosen.get("parameters") or chosen.get("input_schema") or {}
    if match := _TOOL_RE.search(prompt_text(body)):
        try:
            arguments = json.loads(match.group(1))
        except ValueError:
            arguments = {"error": "the [[tool:...]] marker is not a JSON object"}
    else:
        arguments = schema_default(schema) or {}
    return str(chosen.get("name") or name or "tool"), arguments


def tool_results(body: dict[str, Any]) -> list[str]:
    """Texts of the tool results in the last message(s) of a request (empty if none)."""
    messages = body.get("messages") or []
    results: list[str] = []
    for message in reversed(messages):
        if message.get("role") == "tool":  # chat completions: one message per result
            results.insert(0, content_text(message.get("content")))
            continue
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, list):
            blocks = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
            results[:0] = [content_text(b.get("content")) for b in blocks]
        break
    return results


def tool_rounds_done(body: dict[str, Any]) -> int:
    """How many tool-result turns the conversation already holds."""
    rounds = 0
    for message in body.get("messages") or []:
        content = message.get("content")
        blocks = content if isinstance(content, list) else []
        if message.get("role") == "tool" or any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks
        ):
            rounds += 1
    return rounds


def wants_tool_call(body: dict[str, Any]) -> bool:
    """Whether a request that offers tools gets a tool call (else the loop's final answer)."""
    if not tool_results(body):
        return True
    match = _TOOLS_RE.search(prompt_text(body))
    return bool(match) and tool_rounds_done(body) < int(match.group(1))


def after_tools_reply(body: dict[str, Any]) -> str:
    """The text answer to a request whose last message carries tool results."""
    if match := _REPLY_RE.search(prompt_text(body)):
        return match.group(1)
    return "tool said: " + " | ".join(tool_results(body))


def error_body(path: str, status: int, message: str) -> dict[str, Any]:
    """An Anthropic-style error body for ``/v1/messages``, OpenAI-style otherwise."""
    openai_code, anthropic_type = _ERROR_TYPES.get(status, ("server_error", "api_error"))
    if path == MESSAGES_PATH:
        return {"type": "error", "error": {"type": anthropic_type, "message": message}}
    openai_type = "server_error" if status >= 500 else anthropic_type
    return {"error": {"message": message, "type": openai_type, "param": None, "code": openai_code}}


# --------------------------------------------------------------------------- state


@dataclass(frozen=True)
class ScriptedFailure:
    """One scripted error response."""

    status: int
    retry_after: float | None
    message: str | None = None


@dataclass
class Reply:
    """An HTTP response to send: a JSON body, or server-sent ``events`` (streaming)."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] | None = None
    events: list[str] | None = None


class FakeProvider:
    """Fake OpenAI/Anthropic HTTP server running in a daemon thread (see module docstring)."""

    def __init__(self, latency: float = 0.0, port: int = 0, host: str = "127.0.0.1") -> None:
        self.latency = latency
        self._host = host
        self._port = port
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._requests: list[dict[str, Any]] = []
        self._failures: collections.deque[ScriptedFailure] = collections.deque()
        self._invalid_json = 0
        self._rules: list[tuple[tuple[str, ...], str]] = []
        self._seen: collections.Counter[str] = collections.Counter()  # `[[alternate]]`
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle

    def start(self) -> FakeProvider:
        """Bind (OS-chosen port by default) and serve in a daemon thread."""
        if self._server is not None:
            return self
        self._server = _Server((self._host, self._port), _Handler)
        self._server.provider = self
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},  # fast shutdown()
            name="fake-provider",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeProvider is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url

    # ---- scripting

    def fail_next(
        self,
        n: int,
        status: int = 429,
        retry_after: float | None = 1,
        message: str | None = None,
    ) -> None:
        """Answer the next ``n`` model requests with ``status`` (and Retry-After if given);
        ``message`` is the error body's message (a scripted one by default)."""
        with self._lock:
            self._failures.extend([ScriptedFailure(status, retry_after, message)] * n)

    def invalid_json_next(self, n: int) -> None:
        """Make the next ``n`` chat/messages replies non-JSON prose."""
        with self._lock:
            self._invalid_json += n

    def reply_when(self, contains: str | list[str], reply: Any) -> None:
        """Answer every prompt holding all of ``contains`` with ``reply`` (JSON unless a
        string), before any other rule of the module docstring; earlier rules win."""
        needles = (contains,) if isinstance(contains, str) else tuple(contains)
        text = reply if isinstance(reply, str) else json.dumps(reply)
        with self._lock:
            self._rules.append((needles, text))

    def reset(self) -> None:
        """Clear recorded requests, pending scripts and rules (``latency`` is kept)."""
        with self._lock:
            self._requests.clear()
            self._failures.clear()
            self._invalid_json = 0
            self._rules.clear()
            self._seen.clear()

    # ---- records

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Snapshot of recorded requests: dicts with path, headers, json, time, wall_time."""
        with self._lock:
            return list(self._requests)

    def request_count(self, path_prefix: str | None = None) -> int:
        """Number of recorded requests, optionally only those whose path starts with a prefix."""
        with self._lock:
            return sum(
                1
                for r in self._requests
                if path_prefix is None or r["path"].startswith(path_prefix)
            )

    def stats(self) -> dict[str, Any]:
        """The ``GET /_stats`` payload."""
        records = self.requests
        return {
            "requests": len(records),
            "by_path": dict(collections.Counter(r["path"] for r in records)),
            "times": [r["time"] for r in records],
            "wall_times": [r["wall_time"] for r in records],
            "latency": self.latency,
        }

    def control(self, command: dict[str, Any]) -> dict[str, Any]:
        """Apply a ``POST /_control`` command; returns the pending script state."""
        if command.get("reset"):
            self.reset()
        if command.get("latency") is not None:
            self.latency = float(command["latency"])
        if fail := command.get("fail_next"):
            retry_after = fail.get("retry_after", 1)
            self.fail_next(
                int(fail.get("n", 1)),
                status=int(fail.get("status", 429)),
                retry_after=None if retry_after is None else float(retry_after),
                message=fail.get("message"),
            )
        if command.get("invalid_json_next"):
            self.invalid_json_next(int(command["invalid_json_next"]))
        for rule in command.get("reply_when") or []:
            self.reply_when(rule["contains"], rule["reply"])
        with self._lock:
            pending = {"fail_next": len(self._failures), "invalid_json_next": self._invalid_json}
        return {"ok": True, "latency": self.latency, **pending}

    # ---- request handling (called from handler threads)

    def _record(self, path: str, headers: dict[str, str], body: Any) -> None:
        record = {
            "path": path,
            "headers": headers,
            "json": body,
            "time": time.monotonic(),
            "wall_time": time.time(),
        }
        with self._lock:
            self._requests.append(record)

    def _pop_failure(self) -> ScriptedFailure | None:
        with self._lock:
            return self._failures.popleft() if self._failures else None

    def _pop_invalid_json(self) -> bool:
        with self._lock:
            if self._invalid_json <= 0:
                return False
            self._invalid_json -= 1
            return True

    def _rule_reply(self, body: dict[str, Any]) -> str | None:
        text = prompt_text(body)
        with self._lock:
            rules = list(self._rules)
        return next((reply for needles, reply in rules if all(n in text for n in needles)), None)

    def _alternate_reply(self, body: dict[str, Any]) -> str | None:
        text = prompt_text(body)
        if "[[alternate]]" not in text:
            return None
        with self._lock:
            self._seen[text] += 1
            visit = self._seen[text]
        score = 1.0 if visit % 2 else 0.0
        return json.dumps({"score": score, "reason": f"fake judge: visit {visit}"})

    def _next_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):08d}"

    def handle_model_request(self, path: str, headers: dict[str, str], body: Any) -> Reply:
        """Answer one request to a model endpoint (after it has been recorded)."""
        if self.latency > 0:
            time.sleep(self.latency)
        if not (headers.get("authorization") or headers.get("x-api-key")):
            return Reply(401, error_body(path, 401, "Missing API key (Authorization/x-api-key)."))
        if failure := self._pop_failure():
            return self._failure_reply(path, failure)
        if not isinstance(body, dict):
            return Reply(400, error_body(path, 400, "Request body must be a JSON object."))
        if body.get("stream") and path == EMBEDDINGS_PATH:
            return Reply(400, error_body(path, 400, "Embeddings are not streamed."))
        if path == EMBEDDINGS_PATH:
            return Reply(200, self._embeddings(body))
        if body.get("tools") and (wants_tool_call(body) or final_answer_call(body)):
            return self._tool_reply(path, body)
        if tool_results(body):
            text = after_tools_reply(body)
        elif self._pop_invalid_json():
            text = INVALID_JSON_REPLY
        else:
            text = self._rule_reply(body) or self._alternate_reply(body) or choose_reply(body)
        if path == CHAT_PATH:
            reply = Reply(200, self._chat_completion(body, text))
            return self._chat_stream(body, reply.body) if body.get("stream") else reply
        reply = Reply(200, self._anthropic_message(body, text))
        return self._anthropic_stream(reply.body) if body.get("stream") else reply

    def _tool_reply(self, path: str, body: dict[str, Any]) -> Reply:
        """A tool call (streamed when asked), smolagents' `final_answer` first."""
        name, arguments = final_answer_call(body) or choose_tool_call(body)
        if path == CHAT_PATH:
            reply = Reply(200, self._chat_tool_call(body, name, arguments))
            return chat_tool_stream(body, reply.body) if body.get("stream") else reply
        reply = Reply(200, self._anthropic_tool_use(body, name, arguments))
        return anthropic_tool_stream(reply.body) if body.get("stream") else reply

    @staticmethod
    def _chat_stream(body: dict[str, Any], completion: dict[str, Any]) -> Reply:
        """A chat completion as ``chat.completion.chunk`` events, then ``[DONE]``."""
        base = {k: completion[k] for k in ("id", "created", "model")}
        base["object"] = "chat.completion.chunk"

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return json.dumps({**base, "choices": [choice]})

        text = completion["choices"][0]["message"]["content"]
        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": piece}) for piece in _pieces(text)]
        events.append(chunk({}, "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append(json.dumps({**base, "choices": [], "usage": completion["usage"]}))
        events.append("[DONE]")
        return Reply(200, {}, events=[f"data: {event}\n\n" for event in events])

    @staticmethod
    def _anthropic_stream(message: dict[str, Any]) -> Reply:
        """A message as Anthropic's streaming events."""
        text = message["content"][0]["text"]
        usage = message["usage"]
        start = {**message, "content": [], "stop_reason": None}
        start["usage"] = {"input_tokens": usage["input_tokens"], "output_tokens": 0}
        events: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": start}),
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
            ),
        ]
        for piece in _pieces(text):
            delta = {"type": "text_delta", "text": piece}
            events.append(
                ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
            )
        events += [
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": usage["output_tokens"]},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        return Reply(
            200,
            {},
            events=[f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events],
        )

    @staticmethod
    def _failure_reply(path: str, failure: ScriptedFailure) -> Reply:
        headers = {}
        if failure.retry_after is not None:
            headers["Retry-After"] = f"{failure.retry_after:g}"
            headers["retry-after-ms"] = str(round(failure.retry_after * 1000))
        message = failure.message or f"Fake provider scripted failure (HTTP {failure.status})."
        return Reply(failure.status, error_body(path, failure.status, message), headers)

    def _chat_completion(self, body: dict[str, Any], text: str) -> dict[str, Any]:
        prompt_tokens, completion_tokens = count_tokens(prompt_text(body)), count_tokens(text)
        return {
            "id": self._next_id("chatcmpl-fake"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or "fake-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def _chat_tool_call(
        self, body: dict[str, Any], name: str, arguments: dict[str, Any]
    ) -> dict[str, Any]:
        reply = self._chat_completion(body, "")
        encoded = json.dumps(arguments)
        reply["choices"][0]["message"] = {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "tool_calls": [
                {
                    "id": self._next_id("call_fake"),
                    "type": "function",
                    "function": {"name": name, "arguments": encoded},
                }
            ],
        }
        reply["choices"][0]["finish_reason"] = "tool_calls"
        reply["usage"]["completion_tokens"] = count_tokens(encoded)
        reply["usage"]["total_tokens"] = reply["usage"]["prompt_tokens"] + count_tokens(encoded)
        return reply

    def _anthropic_tool_use(
        self, body: dict[str, Any], name: str, arguments: dict[str, Any]
    ) -> dict[str, Any]:
        reply = self._anthropic_message(body, "")
        tool_id = self._next_id("toolu_fake")
        reply["content"] = [{"type": "tool_use", "id": tool_id, "name": name, "input": arguments}]
        reply["stop_reason"] = "tool_use"
        reply["usage"]["output_tokens"] = count_tokens(json.dumps(arguments))
        return reply

    def _anthropic_message(self, body: dict[str, Any], text: str) -> dict[str, Any]:
        return {
            "id": self._next_id("msg_fake"),
            "type": "message",
            "role": "assistant",
            "model": body.get("model") or "fake-model",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": count_tokens(prompt_text(body)),
                "output_tokens": count_tokens(text),
            },
        }

    @staticmethod
    def _embeddings(body: dict[str, Any]) -> dict[str, Any]:
        raw = body.get("input")
        texts = [raw] if isinstance(raw, str) else [str(t) for t in raw or []]
        dim = int(body.get("dimensions") or EMBEDDING_DIM)
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for index, text in enumerate(texts):
            vector = embed_text(text, dim)
            encoded: Any = _to_base64(vector) if as_base64 else vector
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        tokens = sum(count_tokens(t) for t in texts)
        return {
            "object": "list",
            "data": data,
            "model": body.get("model") or "fake-embedding",
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }


# --------------------------------------------------------------------------- smolagents' protocol


def observation(body: dict[str, Any]) -> str | None:
    """The text of a last ``Observation:`` message (smolagents sends tool results as user
    messages), or None."""
    messages = body.get("messages") or []
    if not messages or messages[-1].get("role") not in ("user", "tool", "tool-response"):
        return None
    text = content_text(messages[-1].get("content")).strip()
    return text[len("Observation:") :].strip() if text.startswith("Observation:") else None


def final_answer_call(body: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """smolagents ends its loop by calling its ``final_answer`` tool: a request that offers it
    and ends with an observation gets that call, ``{"answer": "tool said: <observation>"}``
    (or the prompt's ``[[reply:TEXT]]``)."""
    names = {(t.get("function") or t).get("name") for t in body.get("tools") or []}
    seen = observation(body)
    if "final_answer" not in names or seen is None:
        return None
    match = _REPLY_RE.search(prompt_text(body))
    return "final_answer", {"answer": match.group(1) if match else f"tool said: {seen}"}


# --------------------------------------------------------------------------- streamed tool calls


def chat_tool_stream(body: dict[str, Any], completion: dict[str, Any]) -> Reply:
    """A chat completion's tool call as ``chat.completion.chunk`` events: the call's id and
    name first, its arguments in pieces, ``finish_reason: tool_calls``, the usage chunk when
    ``stream_options.include_usage``, then ``[DONE]`` (what LlamaIndex's and LangChain's
    streaming agents read)."""
    base = {k: completion[k] for k in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return json.dumps({**base, "choices": [choice]})

    (call,) = completion["choices"][0]["message"]["tool_calls"]
    head = {**call, "index": 0, "function": {"name": call["function"]["name"], "arguments": ""}}
    events = [chunk({"role": "assistant", "content": None, "tool_calls": [head]})]
    for piece in _json_pieces(call["function"]["arguments"]):
        events.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}))
    events.append(chunk({}, "tool_calls"))
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append(json.dumps({**base, "choices": [], "usage": completion["usage"]}))
    events.append("[DONE]")
    return Reply(200, {}, events=[f"data: {event}\n\n" for event in events])


def anthropic_tool_stream(message: dict[str, Any]) -> Reply:
    """A message's ``tool_use`` block as Anthropic's streaming events (``input_json_delta``)."""
    (block,) = message["content"]
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None}
    start["usage"] = {"input_tokens": usage["input_tokens"], "output_tokens": 0}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {**block, "input": {}}},
        ),
    ]
    for piece in _json_pieces(json.dumps(block["input"])):
        delta = {"type": "input_json_delta", "partial_json": piece}
        events.append(
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
        )
    events += [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": usage["output_tokens"]},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return Reply(
        200, {}, events=[f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events]
    )


def _json_pieces(text: str, size: int = 8) -> list[str]:
    """A JSON text in pieces of `size` characters (joined, they give it back exactly)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _pieces(text: str, words: int = 3) -> list[str]:
    """The text in pieces of a few words (joined, they give the text back exactly)."""
    parts = re.split(r"(?<=\s)(?=\S)", text)
    return ["".join(parts[i : i + words]) for i in range(0, len(parts), words)] or [""]


def _to_base64(vector: list[float]) -> str:
    """Encode floats as little-endian float32 base64, as the OpenAI API does."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


# --------------------------------------------------------------------------- HTTP plumbing


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128
    allow_reuse_address = True
    provider: FakeProvider


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "CobaltFakeProvider/1.0"
    disable_nagle_algorithm = True
    timeout = 300  # idle keep-alive connections are closed after this many seconds
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Silence per-request logging."""

    @property
    def path_only(self) -> str:
        return self.path.split("?", 1)[0]

    def do_GET(self) -> None:
        if self.path_only == "/_stats":
            self._send(Reply(200, self.server.provider.stats()))
        elif self.path_only == "/_requests":
            records = self.server.provider.requests
            self._send(
                Reply(200, {"requests": [{"path": r["path"], "json": r["json"]} for r in records]})
            )
        else:
            self._not_found()

    def do_POST(self) -> None:
        path = self.path_only
        try:
            body = self._read_json()
        except ValueError:
            self._send(Reply(400, error_body(path, 400, "Request body is not valid JSON.")))
            return
        provider = self.server.provider
        if path == "/_control":
            self._send(Reply(200, provider.control(body if isinstance(body, dict) else {})))
            return
        headers = {key.lower(): value for key, value in self.headers.items()}
        provider._record(path, headers, body)
        if path in MODEL_PATHS:
            self._send(provider.handle_model_request(path, headers, body))
        else:
            self._not_found()

    def _read_json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw.strip() else None

    def _not_found(self) -> None:
        path = self.path_only
        self._send(Reply(404, error_body(path, 404, f"Unknown path {path}")))

    def _send(self, reply: Reply) -> None:
        if reply.events is not None:
            self._send_events(reply)
            return
        payload = json.dumps(reply.body).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in (reply.headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def _send_events(self, reply: Reply) -> None:
        """Server-sent events, each written and flushed on its own (chunked)."""
        self.send_response(reply.status)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        for event in reply.events or []:
            data = event.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> None:
    """Run the fake provider in the foreground until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = let the OS choose")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per model request")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    provider = FakeProvider(latency=args.latency, port=args.port, host=args.host).start()
    print(f"FAKE_PROVIDER_URL={provider.url}", flush=True)
    try:
        while not stop.wait(timeout=0.5):
            pass
    finally:
        provider.stop()


if __name__ == "__main__":
    main()
