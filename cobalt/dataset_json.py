"""JSON and JSON Lines datasets: the items of a file, and each item's line, with errors that
name the line, column and field (NaN and Infinity included: Python's json reads them, a stored
item cannot hold them)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from cobalt.dataset import DatasetError, Item, StrPath, field_name, find_value, type_name
from cobalt.dataset_files import read_text


def load_json(path: StrPath) -> tuple[list[Item], Callable[[], list[int] | None]]:
    """The items of a JSON array of objects, or of an object's `"items"` array; and a function
    finding each item's line (called only for an error message)."""
    text = read_text(path)
    data = _decoded(
        text, path, first_line=1, advice="Fix the JSON syntax at that position.", items_key="items"
    )
    if isinstance(data, dict) and isinstance(data.get("items"), list):
        raw_items = data["items"]
        where = 'the "items" array'
    elif isinstance(data, list):
        raw_items = data
        where = "the top-level array"
    else:
        if isinstance(data, dict):
            found = (
                f'an object whose "items" is {type_name(data["items"])}'
                if "items" in data
                else 'an object without an "items" array'
            )
        else:
            found = type_name(data)
        raise DatasetError(
            f'expected an array of objects or an object with an "items" array, found '
            f'{found}. Use [{{...}}, {{...}}] or {{"items": [{{...}}, {{...}}]}}.',
            path=path,
        )
    for index, item in enumerate(raw_items):
        if not isinstance(item, dict):
            raise DatasetError(
                f"item at index {index} of {where} is {type_name(item)}, expected an "
                f'object. Make every item an object like {{"input": "..."}}.',
                path=path,
            )
    count = len(raw_items)
    return raw_items, lambda: _json_item_lines(text, count)


def load_jsonl(path: StrPath) -> tuple[list[Item], list[int]]:
    """The items of a JSON Lines file (one object per line, blank lines skipped) and their
    lines."""
    text = read_text(path)
    items: list[Item] = []
    lines: list[int] = []
    # Split on "\n" only: U+2028 and friends are legal inside JSON strings.
    for line_number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        value = _decoded(line, path, first_line=line_number, advice="Fix that line or remove it.")
        if not isinstance(value, dict):
            raise DatasetError(
                f"expected a JSON object, found {type_name(value)}. Each line must be one "
                f'object like {{"input": "..."}}; fix that line or remove it.',
                path=path,
                line=line_number,
            )
        items.append(value)
        lines.append(line_number)
    return items, lines


def _decoded(
    text: str, path: StrPath, *, first_line: int, advice: str, items_key: str | None = None
) -> Any:
    """`text` (starting on line `first_line` of the file) as JSON, or a DatasetError at the
    line and column of what is wrong with it."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise DatasetError(
            f"invalid JSON ({exc.msg}). {advice}",
            path=path,
            line=first_line + exc.lineno - 1,
            column=exc.colno,
        ) from None
    except _NonFinite:
        raise _non_finite_error(text, path, first_line=first_line, items_key=items_key) from None


def _json_item_lines(text: str, count: int) -> list[int] | None:
    """The line each of the `count` items starts on in a JSON array, or in the `"items"`
    array of an object; None when the text is not laid out that way."""
    decoder = json.JSONDecoder()
    blank = re.compile(r"\s*")
    pos = blank.match(text).end()
    if text.startswith("{", pos):  # {"description": ..., "items": [...]}: find "items"
        pos = blank.match(text, pos + 1).end()
        while not text.startswith("[", pos):
            if text.startswith("}", pos):
                return None
            key, pos = decoder.raw_decode(text, pos)
            pos = blank.match(text, blank.match(text, pos).end() + 1).end()  # past the ":"
            if key == "items" and text.startswith("[", pos):
                break
            _, pos = decoder.raw_decode(text, pos)
            pos = blank.match(text, pos).end()
            pos = blank.match(text, pos + text.startswith(",", pos)).end()
    if not text.startswith("[", pos):
        return None
    lines: list[int] = []
    line, counted = 1, 0
    pos = blank.match(text, pos + 1).end()
    while len(lines) < count and not text.startswith("]", pos):
        line, counted = line + text.count("\n", counted, pos), pos
        lines.append(line)
        _, pos = decoder.raw_decode(text, pos)
        pos = blank.match(text, pos).end()
        pos = blank.match(text, pos + text.startswith(",", pos)).end()
    return lines if len(lines) == count else None


class _NonFinite(Exception):
    """A JSON dataset holds NaN, Infinity or -Infinity (Python's json reads them)."""


class _Constant:
    def __init__(self, name: str) -> None:
        self.name = name


def _refuse_constant(name: str) -> Any:
    raise _NonFinite(name)


BARE_CONSTANT = re.compile(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN)')


def _non_finite_error(
    text: str, path: StrPath, *, first_line: int, items_key: str | None = None
) -> DatasetError:
    """NaN or Infinity cannot be stored (standard JSON has neither): name its line, column
    and field. The text has already been parsed once, up to the constant."""
    token = next(m for m in BARE_CONSTANT.finditer(text) if m.group(1))
    offset = token.start(1)
    line_start = text.rfind("\n", 0, offset) + 1
    try:
        located = find_value(json.loads(text, parse_constant=_Constant), _is_constant)
        field = None if located is None else located[0]
    except json.JSONDecodeError:
        field = None  # the text is broken further on too: the line and column still hold
    where = ""
    if items_key is not None and field:  # a .json file: the array, or {"items": [...]}
        if field[0] == items_key and len(field) > 1:
            field = field[1:]
        if isinstance(field[0], int):
            where, field = f"item at index {field[0]}: ", field[1:]
    if field is None:
        subject = "a value"
    else:
        subject = f"field {field_name(field)!r}" if field else "the value"
    return DatasetError(
        f"{where}{subject} is {token.group(1)}, which a dataset cannot hold (items are stored "
        'as standard JSON). Write a number, null or a string such as "NaN" instead.',
        path=path,
        line=first_line + text.count("\n", 0, offset),
        column=offset - line_start + 1,
    )


def _is_constant(value: Any) -> bool:
    return isinstance(value, _Constant)
