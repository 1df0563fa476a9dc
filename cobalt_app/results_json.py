"""Item entries of the results file as lines of JSON text, written straight from their rows
(issue 41): the bytes `json.dumps(entry, ensure_ascii=False)` gives of the entry
`results.row_entry` builds, its stored JSON columns written in as the database holds them."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cobalt_app.trace_store import Trace


def _line_encoder(default: Any) -> Any:
    """`json.dumps(value, ensure_ascii=False, default=default)` as one function: the C
    encoder made once, not once a value (`json.dumps` builds it anew at every call)."""
    make = json.encoder.c_make_encoder
    if make is None:  # a Python without json's C speedups
        return lambda value: json.dumps(value, ensure_ascii=False, default=default)
    encoder = make(
        None, default, json.encoder.encode_basestring, None, ": ", ", ", False, False, True
    )
    return lambda value: "".join(encoder(value, 0))


_encoded = _line_encoder(str)
_text = json.encoder.encode_basestring  # a string as `ensure_ascii=False` writes it


def _value(value: Any) -> str:
    """A column's value as `json.dumps` writes it: strings, finite floats, integers and None
    here (float.__repr__ and int.__repr__ are what its encoder writes), the rest by it."""
    kind = type(value)
    if kind is str:
        return _text(value)
    if kind is float and value - value == 0.0:  # not NaN or an infinity: json names those
        return float.__repr__(value)
    if kind is int:
        return int.__repr__(value)
    return "null" if value is None else _encoded(value)


def _stored(value: Any) -> str:
    """A JSON column: its stored text as it is (decoding it and encoding it again was a third
    of writing a results file), NULL or an already decoded value encoded."""
    return value if type(value) is str else _encoded(value)


def json_text(value: Any) -> str:
    """`value` as `json.dumps(value, ensure_ascii=False, default=str)` writes it."""
    return _encoded(value)


def entry_line(
    row: tuple,
    judged: str,
    evaluations: dict[str, Any] | str,
    trace: Trace | None,
    labels: list[dict[str, Any]],
) -> str:
    """An item's entry (`results.row_entry` of its `ITEM_FIELDS` row, its JSON columns as
    their stored text, with `labels`) as one line of JSON; `judged`: its verdict;
    `evaluations` its evaluation entries, or their text already encoded. One format
    string where building the entry's dicts and encoding them took twice the CPU, a third of
    it the garbage collector's (`tests/test_results_file.py` holds the two to the same
    bytes). Its index, repetition, key and status are never NULL: integers and text."""
    _, index, repetition, key, status, error, item, output, metadata, latency, tokens, cost = row
    if trace is None:
        steps, missing = "[]", "null"
    else:
        steps = trace.steps if type(trace.steps) is str else _encoded(trace.steps)
        missing = _text(trace.missing) if trace.missing else "null"
    return (
        f'{{"index": {int.__repr__(index)}, "runIndex": {int.__repr__(repetition)}, '
        f'"key": {_text(key)}, "status": {_text(status)}, "verdict": {_text(judged)}, '
        f'"error": {_value(error) if error else "null"}, "input": {_stored(item)}, '
        f'"output": {{"output": {_stored(output)}, "metadata": {_stored(metadata)}}}, '
        f'"latencyMs": {_value(latency)}, "tokens": {_value(tokens)}, "cost": {_value(cost)}, '
        f'"evaluations": {_stored(evaluations)}, "trace": {steps}, '
        f'"traceNotCaptured": {missing}, "labels": {_encoded(labels) if labels else "[]"}}}'
    )
