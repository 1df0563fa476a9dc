"""Record and replay the agent's tool calls, item by item, on the item's recording tape.

A tool call (`@cobalt.tool`) of an item run with `--record` is kept on the item's tape
(`recordings.Tape.made`, stored with its model calls by `recording_store`) as
`{"tool": name, "arguments": {...}, "result": ...}` (or `"error": "Type: message"` when the
tool raised), redacted like every recording. In `--replay` the call is answered from it
without running the tool: matched by the tool's name and the canonical JSON of its arguments,
the nth identical call getting the nth recorded result; a call with none raises
`NoRecordedResponse` ("no recorded result for tool search(q='…')") and the item is an error,
as for a model call. A result replays as its JSON form (an object recorded as a dict comes
back as that dict).
"""

from __future__ import annotations

import collections
import hashlib
import json
from typing import Any

from cobalt.intercept import REPLAYED, ToolPlan
from cobalt_app import recordings
from cobalt_app.storable import redacted

MISSING_TOOL = "no recorded result for tool"


def idle() -> bool:
    """No tape in this context: the run neither records nor replays."""
    return recordings.current_tape() is None


def for_item() -> ToolTape | None:
    tape = recordings.current_tape()
    return None if tape is None else ToolTape(tape)


def plain(value: Any) -> Any:
    """A value as JSON holds it (what is stored, and what replays)."""
    return json.loads(json.dumps(value, ensure_ascii=False, default=str))


def tool_key(name: str, arguments: Any) -> str:
    canonical = json.dumps([name, arguments], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def describe(name: str, arguments: dict[str, Any]) -> str:
    """`search(q='refund policy')`, cut short."""
    shown = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
    if len(shown) > 120:
        shown = shown[:119] + "…"
    return f"{name}({shown})"


class ToolFailed(RuntimeError):
    """A tool whose recorded call raised, replayed: `Type: message` of the original."""


class ToolTape:
    """The tool calls of one item's tape: recorded earlier (replay), made now (record)."""

    def __init__(self, tape: recordings.Tape) -> None:
        self.tape = tape
        self.by_key: dict[str, list[dict[str, Any]]] = {}
        self.recorded = 0
        for exchange in tape.earlier:
            if "tool" in exchange:
                self.recorded += 1
                key = tool_key(exchange["tool"], redacted(exchange.get("arguments")))
                self.by_key.setdefault(key, []).append(exchange)
        self.served: collections.Counter[str] = collections.Counter()

    def plan(self, name: str, arguments: dict[str, Any]) -> ToolPlan | None:
        stored_arguments = redacted(plain(arguments))
        key = tool_key(name, stored_arguments)
        if self.tape.mode != recordings.RECORD:
            with self.tape.lock:
                candidates = self.by_key.get(key)
                if candidates:
                    nth = self.served[key]
                    self.served[key] += 1
                    exchange = candidates[min(nth, len(candidates) - 1)]
                    return ToolPlan(mark=REPLAYED, answer=lambda: _replayed(exchange))
                if self.tape.mode == recordings.REPLAY:
                    message = self._missed(name, arguments)
                    self.tape.missed = self.tape.missed or message
                    raise recordings.NoRecordedResponse(message)

        def keep(result: Any, error: BaseException | None) -> None:
            exchange: dict[str, Any] = {"tool": name, "arguments": stored_arguments}
            if error is None:
                exchange["result"] = redacted(plain(result))
            else:
                exchange["error"] = redacted(f"{type(error).__name__}: {error}")
            with self.tape.lock:
                self.tape.made.append(exchange)

        return ToolPlan(done=keep)

    def _missed(self, name: str, arguments: dict[str, Any]) -> str:
        calls = self.recorded
        why = (
            f"it differs from the {calls} recorded tool call(s) of this item"
            if calls
            else "this item's recording has no tool call"
        )
        return (
            f"{MISSING_TOOL} {describe(name, arguments)}: {why}; record it with "
            "`cobalt run --record` (or `--record-new`)"
        )


def _replayed(exchange: dict[str, Any]) -> Any:
    if "error" in exchange:
        raise ToolFailed(f"{exchange['error']} (replayed from the recording)")
    return exchange.get("result")
