"""Make an item's outcome storable before it reaches a batch write.

Every outcome passes `prepare()` once, where it is made (`engine.execute_item`, a re-judge)
and again, as a no-op, at the write (`services.record_item_outcomes`), in both modes. It
serialises the output and metadata to JSON once, strictly, and keeps the text for the write.
What JSON or the database cannot hold never reaches a batch, where it would roll back the
other outcomes of that batch:

* NaN or infinity, a set, a dict key that is not a string or a number (a tuple), a circular
  reference, a lone surrogate or a NUL character in a string, nesting deeper than
  `MAX_DEPTH`: the item becomes an **error** that names the field and the problem (e.g.
  `metadata.confidence is NaN`). What can be kept is kept: the value is stored with the
  offending parts replaced (NaN → null, a set → a list, a surrogate → `\\udXXX` text, ...).
  Its evaluations are dropped: an errored item is not scored.
* a token count or cost that is not a finite number ≥ 0 (a reported `cost` of NaN): counted
  as 0, the item an error naming the field.
* text fields (the error, its traceback, an evaluator's reason) with lone surrogates or NUL
  characters are stored with those characters escaped: they are messages, not data; errors
  and tracebacks also pass `redacted` (an SDK error quoting a key or a URL with its
  password, an exception message holding a secret environment variable's value).
* secrets are hidden (`redacted`: `cobalt.redaction` with the process's secret environment
  values) in the output and metadata as stored, the run's configuration, evaluations'
  reasons and errors, and the trace steps (`trace_spans`); the dataset item is the user's
  data and is stored as given.

* an item's trace (its steps) is stored as JSON too, salvaged the same way; it never makes
  the item an error.

Other objects JSON has no type for (a datetime, a Decimal, a model instance) are stored as
their `str()`, as before.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from typing import Any

from cobalt.redaction import environment_secrets, may_hold, redact

MAX_DEPTH = 200  # json.dumps would hit Python's recursion limit a little deeper
MAX_TOKENS = 2**31 - 1  # the largest count the database column holds
NOT_STORED = "could not be stored as it is, so this item is recorded as an error"


class Unstorable(ValueError):
    """A value JSON cannot hold; `path` names where (`metadata.confidence`)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path} {problem}")
        self.path = path
        self.problem = problem


def _default(value: Any) -> Any:
    if isinstance(value, set | frozenset):
        raise TypeError("a set")
    return str(value)


def dumps(value: Any) -> str:
    """Strict JSON text of a value, or `Unstorable` naming the first problem (as `value`)."""
    return dumps_at(value, "value")


def from_json(value: Any) -> Any:
    """A JSON column read back with a plain cursor: text on SQLite and PostgreSQL alike
    (Django loads `jsonb` as text); SQL NULL stays None."""
    return json.loads(value) if isinstance(value, str) else value


def dumps_at(value: Any, path: str) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, default=_default)
        if not text.isascii():
            text.encode("utf-8")  # a lone surrogate cannot be stored
    except (ValueError, TypeError, RecursionError, UnicodeEncodeError):
        problem = next(_problems(value, path, 0, set()), None)
        if problem is None:  # json's own limits, e.g. an integer with too many digits
            raise Unstorable(path, "is not a value JSON can hold") from None
        raise problem from None
    if "\\u0000" in text:  # a NUL character, or only text that looks like its escape
        problem = next(_problems(value, path, 0, set()), None)
        if problem is not None:
            raise problem
    return text


def _problems(value: Any, path: str, depth: int, seen: set[int]) -> Iterator[Unstorable]:
    """Every value JSON or the database cannot hold, depth first (only the first is used)."""
    if depth > MAX_DEPTH:
        yield Unstorable(path, f"is nested more than {MAX_DEPTH} levels deep")
        return
    if isinstance(value, float) and not math.isfinite(value):
        yield Unstorable(path, f"is {value!r} (JSON has no NaN or infinity: use None)")
    elif isinstance(value, str):
        text_problem = _text_problem(value)
        if text_problem:
            yield Unstorable(path, text_problem)
    elif isinstance(value, set | frozenset):
        yield Unstorable(path, "is a set (JSON has no sets: return a list)")
    elif isinstance(value, dict | list | tuple):
        if id(value) in seen:
            yield Unstorable(path, "refers to itself (a circular reference)")
            return
        seen.add(id(value))
        if isinstance(value, dict):
            yield from _dict_problems(value, path, depth, seen)
        else:
            for index, item in enumerate(value):
                yield from _problems(item, f"{path}[{index}]", depth + 1, seen)
        seen.discard(id(value))


def _dict_problems(
    value: dict[Any, Any], path: str, depth: int, seen: set[int]
) -> Iterator[Unstorable]:
    """A dict's keys JSON cannot hold (not a string, number, bool or None; or bad text), and
    its values' problems."""
    for key, item in value.items():
        if not isinstance(key, str | int | float | bool) and key is not None:
            yield Unstorable(
                f"{path}[{key!r}]",
                f"has a {type(key).__name__} as its key (JSON keys are strings)",
            )
            continue
        if isinstance(key, str) and _text_problem(key):
            yield Unstorable(f"{path}[{key!r}]", f"has a key that {_text_problem(key)}")
            continue
        yield from _problems(item, _child(path, key), depth + 1, seen)


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character (\\x00), which the database cannot store"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"contains a lone surrogate ({text[exc.start]!r}), which is not valid Unicode"
    return None


def _child(path: str, key: Any) -> str:
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}"
    return f"{path}[{key!r}]"


def salvage(value: Any, depth: int = 0, seen: frozenset[int] = frozenset()) -> Any:
    """The value with whatever JSON cannot hold replaced, so the rest is kept."""
    if depth > MAX_DEPTH:
        return "<nested too deep>"
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict | list | tuple | set | frozenset):
        if id(value) in seen:
            return "<circular reference>"
        inner = seen | {id(value)}
        if isinstance(value, dict):
            return {
                _salvage_key(key): salvage(item, depth + 1, inner) for key, item in value.items()
            }
        return [salvage(item, depth + 1, inner) for item in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return clean_text(str(value))


def _salvage_key(key: Any) -> str:
    if isinstance(key, str):
        return clean_text(key)
    if isinstance(key, int | float | bool) or key is None:
        return json.dumps(key)
    return clean_text(repr(key))


def clean_text(text: str) -> str:
    """Text any database stores: lone surrogates and NUL characters escaped."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def process_secrets() -> tuple[str, ...]:
    """The values of this process's secret-looking environment variables, read again only
    when the environment changed (asked for every stored item)."""
    environ = getattr(os.environ, "_data", None)  # CPython's own: compared in C, quickly
    if not isinstance(environ, dict) or environ != _environment[0]:
        snapshot = dict(environ) if isinstance(environ, dict) else None
        _environment[:] = [snapshot, environment_secrets(os.environ)]
    return _environment[1]


_environment: list[Any] = [None, ()]  # the environment last read, its secret values


def redacted(value: Any, key: str = "", *, secrets: tuple[str, ...] = ()) -> Any:
    """`value` as Cobalt stores, logs or sends it: `cobalt.redaction.redact` with the
    process's secret environment values (and `secrets`, e.g. the key a call used)."""
    return redact(value, key, secrets=(*secrets, *process_secrets()))


def clean_message(text: Any) -> str:
    """An error message or traceback as stored: credentials (a URL's password, a key quoted
    by an SDK's error, a secret environment value) hidden, then `clean_text`."""
    return clean_text(redacted(str(text))) if text else ""


def count(value: Any, path: str, *, whole: bool) -> tuple[Any, str | None]:
    """A token count (`whole`) or a cost as stored, or 0 and the problem naming `path`."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return 0, f"{path} is {value!r} (a number ≥ 0 is expected)"
    if not math.isfinite(value) or value < 0 or (whole and value > MAX_TOKENS):
        return 0, f"{path} is {value!r} (a number from 0 to {MAX_TOKENS} is expected)"
    return (int(value) if whole else float(value)), None


def prepare(outcome: Any) -> Any:
    """Make an `ItemOutcome` storable in place (idempotent) and return it."""
    if outcome.stored is not None:
        return outcome
    problems: list[str] = []
    stored_output = _field(outcome.output, "output", problems)
    metadata = outcome.metadata
    stored_metadata = _field(metadata, "metadata", problems) if metadata else "{}"
    outcome.tokens, tokens_problem = count(outcome.tokens, "the token count", whole=True)
    outcome.cost, cost_problem = count(outcome.cost, "the cost (metadata.cost)", whole=False)
    problems += [p for p in (tokens_problem, cost_problem) if p]
    outcome.error = clean_message(outcome.error)
    outcome.traceback = clean_message(outcome.traceback)
    for evaluation in outcome.evaluations:
        clean_evaluation(evaluation)
    if problems:
        message = f"the agent's result {NOT_STORED}: " + "; ".join(problems) + "."
        outcome.status = "error"
        outcome.error = message if not outcome.error else f"{outcome.error}\n{message}"
        outcome.evaluations = []
    outcome.stored = (stored_output, stored_metadata)
    trace = getattr(outcome, "trace", None)
    if trace:  # built by `trace_spans`, texts already cleaned: salvaged only if need be
        try:
            outcome.stored_trace = json.dumps(trace, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError):
            outcome.stored_trace = json.dumps(salvage(trace), ensure_ascii=False, allow_nan=False)
    return outcome


def clean_evaluation(evaluation: Any) -> None:
    """An evaluation's texts made storable (its score was checked by `evaluate()`)."""
    evaluation.reason = clean_message(evaluation.reason)
    if getattr(evaluation, "judge_call", None) is not None:
        evaluation.judge_call = judge_call(evaluation.judge_call)
    if getattr(evaluation, "chain_of_thought", ""):
        evaluation.chain_of_thought = clean_message(evaluation.chain_of_thought)
    evaluation.error = clean_message(evaluation.error)
    evaluation.tokens = count(evaluation.tokens, "tokens", whole=True)[0]
    evaluation.cost = count(evaluation.cost, "cost", whole=False)[0]


def _field(value: Any, path: str, problems: list[str]) -> str:
    try:
        text = dumps_at(value, path)
    except Unstorable as exc:
        problems.append(str(exc))
        text = json.dumps(salvage(value), ensure_ascii=False, allow_nan=False)
    return redacted_json(text)


def redacted_json(text: str) -> str:
    """A JSON text with its secrets hidden; parsed only when it may hold one."""
    if not may_hold(text, process_secrets()):
        return text
    return json.dumps(redacted(json.loads(text)), ensure_ascii=False, allow_nan=False)


# What a judge call keeps of each text ("Show judge call"); the rest is counted, not kept.
JUDGE_CALL_CHARS = {"system": 2_000, "prompt": 8_000, "reply": 4_000}
JUDGE_CALL_TURNS = 4


def judge_call(call: Any) -> dict[str, Any] | None:
    """A judge's call (`{"provider", "model", "system", "calls": [{"prompt", "reply"}]}`, with
    `via` and `count` when several calls made one judgement: who made them (`DeepEval's
    GEval`) and how many in all) as it is cached and stored: secrets hidden (`redacted`),
    then each text cut to `JUDGE_CALL_CHARS` with how long it was, the first
    `JUDGE_CALL_TURNS` calls kept.
    Idempotent; None for anything else."""
    if not isinstance(call, dict) or not isinstance(call.get("calls"), list):
        return None
    kept = {
        "provider": clean_message(call.get("provider")),
        "model": clean_message(call.get("model")),
        **_capped(call, "system"),
        "calls": [
            {**_capped(turn, "prompt"), **_capped(turn, "reply")}
            for turn in call["calls"][:JUDGE_CALL_TURNS]
            if isinstance(turn, dict)
        ],
    }
    if call.get("via"):
        kept["via"] = clean_message(call["via"])[:200]
    count = call.get("count")
    if isinstance(count, int) and not isinstance(count, bool) and count > len(kept["calls"]):
        kept["count"] = count
    return kept


def _capped(entry: dict[str, Any], name: str) -> dict[str, Any]:
    """`{name: text}` redacted and cut, with `{name}Chars` (its whole length) when cut."""
    text = entry.get(name)
    text = "" if text is None else str(text)
    limit = JUDGE_CALL_CHARS[name]
    whole = entry.get(f"{name}Chars") or len(text)
    kept = clean_message(text[: limit * 2])[:limit]  # redacted before it is cut
    return {name: kept, f"{name}Chars": whole} if whole > limit else {name: kept}
