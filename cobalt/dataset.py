"""Datasets for Cobalt experiments.

A :class:`Dataset` is an immutable, ordered collection of items, where every item is a plain
``dict`` (for example ``{"input": "What is 2 + 2?", "expected": "4"}``). Datasets are written
inline in an experiment file or loaded from ``.json``, ``.jsonl``/``.ndjson`` and ``.csv``
files::

    from cobalt.dataset import Dataset

    qa = Dataset.from_file("datasets/qa.jsonl")
    smoke = qa.filter(lambda item: item.get("tag") == "smoke").sample(20, seed=7)

Every transformation (:meth:`Dataset.map`, :meth:`Dataset.filter`, :meth:`Dataset.sample`,
:meth:`Dataset.slice`) returns a new dataset and leaves the original untouched.

Problems with the data raise :class:`DatasetError`, whose message names the file, line and
(where known) column, and says how to fix it::

    datasets/qa.jsonl, line 3, column 12: invalid JSON (Expecting ',' delimiter). Fix that
    line or remove it.

:func:`item_key` gives every item a stable identity (its ``id`` field, or a content hash) so
results can be compared across runs.

This module deliberately depends on the standard library only, so it loads fast and can be
used without Django.
"""

from __future__ import annotations

import csv
import hashlib
import importlib
import inspect
import io
import json
import math
import os
import random
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["Dataset", "DatasetError", "Item", "item_key", "SUPPORTED_EXTENSIONS"]

Item = dict[str, Any]
"""One dataset item: a plain dict of named fields."""

StrPath = str | os.PathLike[str]

_JSON_EXTENSIONS = (".json",)
_JSONL_EXTENSIONS = (".jsonl", ".ndjson")
_CSV_EXTENSIONS = (".csv",)
SUPPORTED_EXTENSIONS: tuple[str, ...] = _JSON_EXTENSIONS + _JSONL_EXTENSIONS + _CSV_EXTENSIONS
"""File extensions understood by :meth:`Dataset.from_file`."""

INLINE_SOURCE = "inline"


class DatasetError(ValueError):
    """A dataset could not be built or loaded.

    ``str(error)`` reads like ``datasets/qa.jsonl, line 3, column 12: invalid JSON (...). Fix
    that line or remove it.`` The pieces are also available separately:

    * ``path`` -- the file the problem is in, or ``None`` for inline data;
    * ``line`` -- 1-based line number, or ``None`` when not known;
    * ``column`` -- 1-based column number, or ``None`` when not known;
    * ``reason`` -- the message without the location prefix.
    """

    def __init__(
        self,
        reason: str,
        *,
        path: StrPath | None = None,
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        self.reason = reason
        self.path = os.fspath(path) if path is not None else None
        self.line = line
        self.column = column
        super().__init__(self._format())

    def _format(self) -> str:
        location = []
        if self.path is not None:
            location.append(self.path)
        if self.line is not None:
            location.append(f"line {self.line}")
            if self.column is not None:
                location.append(f"column {self.column}")
        if not location:
            return self.reason
        return f"{', '.join(location)}: {self.reason}"


def item_key(item: Item) -> str:
    """Return a stable identity for ``item``.

    If the item has an ``id`` field that is not ``None``, the key is ``str(item["id"])``.
    Otherwise it is ``"sha256:"`` followed by the first 16 hex digits of the SHA-256 of the
    item's canonical JSON (sorted keys, compact separators, UTF-8), so the key does not depend
    on the order of the fields.
    """
    item_id = item.get("id")
    if item_id is not None:
        return str(item_id)
    canonical = json.dumps(
        item, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    )
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    return "sha256:" + digest[:16]


def _type_name(value: object) -> str:
    """Describe the type of a value the way a dataset author would think of it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


class Dataset:
    """An immutable, ordered collection of dict items.

    ``Dataset(items, name=..., source=...)`` builds a dataset from any iterable of dicts. Each
    item is shallow-copied on the way in and on the way out (:attr:`items`, iteration,
    indexing), so neither the caller's data nor the dataset can be changed behind the other's
    back.
    """

    __slots__ = ("_items", "_name", "_source", "_sample_seed")

    _items: tuple[Item, ...]
    _name: str | None
    _source: str
    _sample_seed: int | None

    def __init__(
        self,
        items: Iterable[Item] | None = None,
        *,
        name: str | None = None,
        source: str | None = None,
    ) -> None:
        if items is None:
            items = ()
        if isinstance(items, dict | str | bytes):
            raise DatasetError(
                f"items must be an iterable of dicts (for example a list), got "
                f"{_type_name(items)}. Wrap a single item in a list: Dataset([item])."
            )
        checked: list[Item] = []
        for index, item in enumerate(items):
            if not isinstance(item, dict):
                raise DatasetError(
                    f"item at index {index} is {_type_name(item)}, expected a dict. Make every "
                    f'item a dict of named fields, for example {{"input": "..."}}.',
                    path=source if source not in (None, INLINE_SOURCE) else None,
                )
            checked.append(dict(item))
        file = source if source not in (None, INLINE_SOURCE) else None
        _check_unique_ids(checked, path=file, lines=None)
        _check_finite(checked, path=file)
        self._init(tuple(checked), name, source if source is not None else INLINE_SOURCE, None)

    def _init(
        self, items: tuple[Item, ...], name: str | None, source: str, sample_seed: int | None
    ) -> None:
        object.__setattr__(self, "_items", items)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_source", source)
        object.__setattr__(self, "_sample_seed", sample_seed)

    def _derive(self, items: Iterable[Item], *, sample_seed: int | None = None) -> Dataset:
        """Build a new dataset with the same name and source from already-checked items."""
        derived = object.__new__(type(self))
        seed = sample_seed if sample_seed is not None else self._sample_seed
        derived._init(tuple(items), self._name, self._source, seed)
        return derived

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(
            f"Dataset is immutable; cannot set {name!r}. Use map/filter/sample/slice to build "
            "a new dataset."
        )

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Dataset is immutable; cannot delete {name!r}.")

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_file(cls, path: StrPath, *, name: str | None = None) -> Dataset:
        """Load a dataset, choosing the format from the file extension.

        ``.json`` -> :meth:`from_json`, ``.jsonl``/``.ndjson`` -> :meth:`from_jsonl`,
        ``.csv`` -> :meth:`from_csv`. The dataset's name defaults to the file name without
        its extension.
        """
        suffix = Path(path).suffix.lower()
        if suffix in _JSON_EXTENSIONS:
            return cls.from_json(path, name=name)
        if suffix in _JSONL_EXTENSIONS:
            return cls.from_jsonl(path, name=name)
        if suffix in _CSV_EXTENSIONS:
            return cls.from_csv(path, name=name)
        found = f"{suffix!r}" if suffix else "no extension"
        raise DatasetError(
            f"unsupported dataset file type ({found}). Supported extensions are "
            f"{', '.join(SUPPORTED_EXTENSIONS)}; rename or convert the file.",
            path=path,
        )

    @classmethod
    def from_json(cls, path: StrPath, *, name: str | None = None) -> Dataset:
        """Load a JSON file holding an array of objects, or an object with an ``"items"`` array."""
        text = _read_text(path)
        try:
            data = json.loads(text, parse_constant=_refuse_constant)
        except json.JSONDecodeError as exc:
            raise DatasetError(
                f"invalid JSON ({exc.msg}). Fix the JSON syntax at that position.",
                path=path,
                line=exc.lineno,
                column=exc.colno,
            ) from None
        except _NonFinite:
            raise _non_finite_error(text, path, first_line=1, items_key="items") from None
        if isinstance(data, dict) and isinstance(data.get("items"), list):
            raw_items = data["items"]
            where = 'the "items" array'
        elif isinstance(data, list):
            raw_items = data
            where = "the top-level array"
        else:
            if isinstance(data, dict):
                found = (
                    f'an object whose "items" is {_type_name(data["items"])}'
                    if "items" in data
                    else 'an object without an "items" array'
                )
            else:
                found = _type_name(data)
            raise DatasetError(
                f'expected an array of objects or an object with an "items" array, found '
                f'{found}. Use [{{...}}, {{...}}] or {{"items": [{{...}}, {{...}}]}}.',
                path=path,
            )
        for index, item in enumerate(raw_items):
            if not isinstance(item, dict):
                raise DatasetError(
                    f"item at index {index} of {where} is {_type_name(item)}, expected an "
                    f'object. Make every item an object like {{"input": "..."}}.',
                    path=path,
                )
        count = len(raw_items)
        _check_unique_ids(raw_items, path=path, lines=lambda: _json_item_lines(text, count))
        return cls._loaded(raw_items, path, name)

    @classmethod
    def from_jsonl(cls, path: StrPath, *, name: str | None = None) -> Dataset:
        """Load a JSON Lines file: one JSON object per line; blank lines are skipped."""
        text = _read_text(path)
        items: list[Item] = []
        lines: list[int] = []
        # Split on "\n" only: U+2028 and friends are legal inside JSON strings.
        for line_number, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line, parse_constant=_refuse_constant)
            except json.JSONDecodeError as exc:
                raise DatasetError(
                    f"invalid JSON ({exc.msg}). Fix that line or remove it.",
                    path=path,
                    line=line_number,
                    column=exc.colno,
                ) from None
            except _NonFinite:
                raise _non_finite_error(line, path, first_line=line_number) from None
            if not isinstance(value, dict):
                raise DatasetError(
                    f"expected a JSON object, found {_type_name(value)}. Each line must be one "
                    f'object like {{"input": "..."}}; fix that line or remove it.',
                    path=path,
                    line=line_number,
                )
            items.append(value)
            lines.append(line_number)
        _check_unique_ids(items, path=path, lines=lines)  # before Dataset(): naming the lines
        return cls._loaded(items, path, name)

    @classmethod
    def from_csv(cls, path: StrPath, *, delimiter: str = ",", name: str | None = None) -> Dataset:
        """Load an RFC 4180 CSV file whose first row names the fields.

        Quoted fields may contain the delimiter, doubled quotes (``""``) and newlines. The file
        must be UTF-8 (a leading byte-order mark is ignored). Values are kept as strings and
        blank lines are skipped. Every row must have exactly as many fields as the header.
        """
        text = _read_text(path)
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
        header: list[str] | None = None
        items: list[Item] = []
        lines: list[int] = []
        previous_line = 0
        while True:
            record_line = previous_line + 1
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                raise _csv_error(
                    exc, _Record(text, record_line, delimiter, header), path, reader.line_num
                ) from None
            previous_line = reader.line_num
            if not row:
                continue  # blank line
            record = _Record(text, record_line, delimiter, header)
            if header is None:
                header = _check_header(row, record, path)
                continue
            if len(row) != len(header):
                raise _field_count_error(header, row, record, path)
            items.append(dict(zip(header, row, strict=True)))
            lines.append(record_line)
        if header is None:
            raise DatasetError(
                "the file is empty; expected a header row naming the fields (for example "
                "input,expected). Add a header row followed by one row per item.",
                path=path,
            )
        _check_unique_ids(items, path=path, lines=lines)  # before Dataset(): naming the lines
        return cls._loaded(items, path, name)

    # Remote loaders live in cobalt.remote (HTTP, pagination, credentials; standard library
    # only, like this module). It is imported by name, lazily, so loading a dataset file never
    # pays for it.

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Dataset:
        """Load JSON, JSON Lines or CSV over HTTP(S): ``format=``, ``headers=``, ``name=``."""
        return _remote().from_url(url, **options)

    @classmethod
    def from_langfuse(cls, name: str, **options: Any) -> Dataset:
        """Every item of a Langfuse dataset (``LANGFUSE_PUBLIC_KEY``/``SECRET_KEY``/``HOST``)."""
        return _remote().from_langfuse(name, **options)

    @classmethod
    def from_langsmith(cls, name: str, **options: Any) -> Dataset:
        """Every example of a LangSmith dataset (``LANGSMITH_API_KEY``, ``LANGSMITH_ENDPOINT``)."""
        return _remote().from_langsmith(name, **options)

    @classmethod
    def from_braintrust(cls, project: str, dataset: str, **options: Any) -> Dataset:
        """Every record of a Braintrust dataset (``BRAINTRUST_API_KEY``, ``BRAINTRUST_API_URL``)."""
        return _remote().from_braintrust(project, dataset, **options)

    @classmethod
    def from_basalt(
        cls, dataset_id: str, *, api_key: str | None = None, base_url: str | None = None
    ) -> Dataset:
        """Every item of a Basalt dataset (``BASALT_API_KEY``, ``BASALT_API_URL``)."""
        return _remote().from_basalt(dataset_id, api_key=api_key, base_url=base_url)

    @classmethod
    def _loaded(cls, items: Iterable[Item], path: StrPath, name: str | None) -> Dataset:
        source = os.fspath(path)
        return cls(items, name=name if name is not None else Path(source).stem, source=source)

    # ------------------------------------------------------------------ accessors

    @property
    def items(self) -> list[Item]:
        """The items, as a new list of shallow copies (changing it does not change the dataset)."""
        return [dict(item) for item in self._items]

    @property
    def name(self) -> str | None:
        """The dataset's name (the file name without extension for loaded datasets)."""
        return self._name

    @property
    def source(self) -> str:
        """Where the items came from: the file path as given, or ``"inline"``."""
        return self._source

    @property
    def sample_seed(self) -> int | None:
        """The seed used by :meth:`sample` to build this dataset, or ``None`` if not sampled.

        Re-sampling the original dataset with this seed and the same size gives the same items.
        """
        return self._sample_seed

    def keys(self) -> list[str]:
        """The :func:`item_key` of every item, in order."""
        return [item_key(item) for item in self._items]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Item]:
        return (dict(item) for item in self._items)

    def __getitem__(self, index: int) -> Item:
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(
                f"Dataset indices must be integers, not {type(index).__name__}; "
                "use dataset.slice(start, end) for a range."
            )
        try:
            return dict(self._items[index])
        except IndexError:
            raise IndexError(
                f"Dataset index {index} out of range (dataset has {len(self._items)} items)"
            ) from None

    def __repr__(self) -> str:
        parts = [f"name={self._name!r}", f"source={self._source!r}", f"len={len(self._items)}"]
        if self._sample_seed is not None:
            parts.append(f"sample_seed={self._sample_seed}")
        return f"Dataset({', '.join(parts)})"

    # ------------------------------------------------------------------ transformations

    def map(self, fn: Callable[[Item], Item]) -> Dataset:
        """Return a new dataset of ``fn(item)`` for every item; ``fn`` must return a dict.

        ``fn`` receives a copy of each item, so changing it in place does not affect this
        dataset.
        """
        mapped: list[Item] = []
        for index, item in enumerate(self._items):
            try:
                result = fn(dict(item))
            except Exception as exc:
                exc.add_note(f"(while mapping item at index {index} of {self._describe()})")
                raise
            if not isinstance(result, dict):
                raise DatasetError(
                    f"map function returned {_type_name(result)} for item at index {index}, "
                    "expected a dict. Return the new item, for example "
                    '{**item, "input": ...}.',
                )
            mapped.append(dict(result))
        _check_unique_ids(mapped, path=None, lines=None)
        _check_finite(mapped, path=None)
        return self._derive(mapped)

    def filter(self, fn: Callable[[Item], object]) -> Dataset:
        """Return a new dataset with only the items for which ``fn(item)`` is truthy."""
        kept: list[Item] = []
        for index, item in enumerate(self._items):
            try:
                keep = fn(dict(item))
            except Exception as exc:
                exc.add_note(f"(while filtering item at index {index} of {self._describe()})")
                raise
            if keep:
                kept.append(item)
        return self._derive(kept)

    def sample(self, n: int, seed: int | None = None) -> Dataset:
        """Return a new dataset of ``n`` items chosen at random without replacement.

        With ``seed`` the choice is reproducible. Without one, a fresh seed is generated; either
        way it is recorded in :attr:`sample_seed` of the result, so
        ``original.sample(n, seed=result.sample_seed)`` reproduces it. If ``n`` is at least the
        dataset's length, all items are returned in their original order.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise DatasetError(f"sample size must be a non-negative integer, got {n!r}.")
        if seed is None:
            seed = random.SystemRandom().randrange(2**32)
        if n >= len(self._items):
            return self._derive(self._items, sample_seed=seed)
        chosen = random.Random(seed).sample(self._items, n)
        return self._derive(chosen, sample_seed=seed)

    def slice(self, start: int, end: int | None = None) -> Dataset:
        """Return a new dataset of the items ``start`` up to (not including) ``end``.

        Follows Python slicing rules: negative indices count from the end and out-of-range
        bounds are clipped.
        """
        return self._derive(self._items[start:end])

    def _describe(self) -> str:
        if self._name is not None:
            return f"dataset {self._name!r}"
        if self._source != INLINE_SOURCE:
            return f"dataset from {self._source}"
        return "inline dataset"


# ---------------------------------------------------------------------- file helpers


def _remote() -> Any:
    return importlib.import_module("cobalt.remote")


def _caller_project() -> Path | None:
    """The project folder (where cobalt.toml is) of the code loading a dataset: relative paths
    start there, as under `cobalt run`, whatever the current folder. None outside a project
    (or from code without a file, such as a notebook cell): the current folder then."""
    frame = inspect.currentframe()
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    if frame is None or frame.f_code.co_filename.startswith("<"):
        return None
    config = importlib.import_module("cobalt.config")  # by name, as `_remote()`: stdlib only
    return config.find_project_dir(Path(frame.f_code.co_filename).parent)


def _read_text(path: StrPath) -> str:
    """Read a UTF-8 file (optional BOM), turning every failure into a DatasetError."""
    given = Path(path)
    base = None if given.is_absolute() else _caller_project()
    try:
        data = (base / given if base else given).read_bytes()
    except FileNotFoundError:
        where = f"the project folder, {base}" if base else f"the current folder, {os.getcwd()}"
        raise DatasetError(
            f"file not found. Check the path (relative paths are resolved from {where}).",
            path=path,
        ) from None
    except IsADirectoryError:
        raise DatasetError(
            "is a directory, not a dataset file. Point at a .json, .jsonl or .csv file.",
            path=path,
        ) from None
    except OSError as exc:
        raise DatasetError(
            f"cannot read the file ({exc.strerror or exc}). Check that it exists and is readable.",
            path=path,
        ) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        raise DatasetError(
            f"the file is not valid UTF-8 (byte 0x{data[exc.start]:02x}). Re-save the file "
            "with UTF-8 encoding.",
            path=path,
            line=data.count(b"\n", 0, exc.start) + 1,
            column=exc.start - line_start + 1,
        ) from None


def _check_unique_ids(
    items: list[Item],
    *,
    path: StrPath | None,
    lines: list[int] | Callable[[], list[int] | None] | None,
) -> None:
    """Refuse two items with the same `id`: a run, compare and `--resume` know an item by its
    `item_key`, `str(id)` (so `1` and `"1"` are the same id), and would take them for one.

    Items without an id are keyed by their content: two identical ones are the same test
    case, and stay allowed. `lines` (each item's line in its file, or a function finding
    them, called only for the message) point the error at both items.
    """
    first_of: dict[str, int] = {}
    for index, item in enumerate(items):
        item_id = item.get("id")
        if item_id is None:
            continue
        first = first_of.setdefault(item_key(item), index)
        if first == index:
            continue
        if callable(lines):
            lines = lines()
        earlier = items[first]["id"]
        alike = "" if repr(earlier) == repr(item_id) else f", as {earlier!r}: ids compare as text"
        raise DatasetError(
            f"item at index {index} has the id {item_id!r}, already used by the item at index "
            f"{first}{f' (line {lines[first]})' if lines else ''}{alike}. Ids must be unique "
            "within a dataset: runs, compare and --resume match items by id. Give each item "
            "its own id, or remove the duplicate.",
            path=path,
            line=lines[index] if lines else None,
        )


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
        located = _find(json.loads(text, parse_constant=_Constant), _is_constant)
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
        subject = f"field {_field_name(field)!r}" if field else "the value"
    return DatasetError(
        f"{where}{subject} is {token.group(1)}, which a dataset cannot hold (items are stored "
        'as standard JSON). Write a number, null or a string such as "NaN" instead.',
        path=path,
        line=first_line + text.count("\n", 0, offset),
        column=offset - line_start + 1,
    )


def _check_finite(items: list[Item], *, path: StrPath | None) -> None:
    """NaN and infinities (`float("nan")` in code) cannot be stored: JSON has neither."""
    for index, item in enumerate(items):
        found = _find(item, _is_non_finite)
        if found is not None:
            field, value = found
            raise DatasetError(
                f"item at index {index}: field {_field_name(field)!r} is {value!r}, which a "
                "dataset cannot hold (items are stored as standard JSON). Use None, a number "
                'or a string such as "NaN" instead.',
                path=path,
            )


def _is_constant(value: Any) -> bool:
    return isinstance(value, _Constant)


def _is_non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _find(value: Any, wanted: Callable[[Any], bool]) -> tuple[list[str | int], Any] | None:
    """The keys and indices leading to the first value that is `wanted` (in the order of the
    text, for parsed JSON), and that value."""
    if wanted(value):
        return [], value
    if isinstance(value, dict):
        children: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, list | tuple):
        children = enumerate(value)
    else:
        return None
    for key, child in children:
        below = _find(child, wanted)
        if below is not None:
            return [key, *below[0]], below[1]
    return None


def _field_name(path: list[str | int]) -> str:
    """`metadata.scores[2]`."""
    name = ""
    for part in path:
        if isinstance(part, int):
            name += f"[{part}]"
        else:
            name += f".{part}" if name else part
    return name


class _Record:
    """Where the fields of one CSV record start in the file, read again only for an error
    message (the csv module gives lines, not columns)."""

    def __init__(self, text: str, line: int, delimiter: str, header: list[str] | None) -> None:
        self.text, self.line, self.delimiter, self.header = text, line, delimiter, header

    def column_name(self, number: int) -> str:
        """`field 2 ("expected")`: by number, and by the header's name when there is one."""
        named = self.header and number <= len(self.header)
        return f"field {number}" + (f" ({self.header[number - 1]!r})" if named else "")

    def scan(self) -> tuple[list[tuple[int, int]], tuple[int, int], tuple[str, int, int] | None]:
        """(line, column) of each field's start, of the record's end, and the first problem:
        `("unterminated", ...)` at an opening quote never closed, `("after-quote", ...)` at
        text that follows a closing quote."""
        text, delimiter = self.text, self.delimiter
        pos = _line_offset(text, self.line)
        line, column = self.line, 1
        fields: list[tuple[int, int]] = []
        field_start, quoted, opened = True, False, (line, column)
        while pos < len(text):
            char = text[pos]
            if field_start:
                fields.append((line, column))
                field_start = False
                if char == '"':
                    quoted, opened = True, (line, column)
                    pos, column = pos + 1, column + 1
                    continue
            if quoted and char == '"':
                if text.startswith('""', pos):
                    pos, column = pos + 2, column + 2
                    continue
                quoted = False
                pos, column = pos + 1, column + 1
                if pos < len(text) and text[pos] not in (delimiter, "\r", "\n"):
                    return fields, (line, column), ("after-quote", line, column)
                continue
            if char in "\r\n":
                if not quoted:
                    break
                pos += 2 if text.startswith("\r\n", pos) else 1
                line, column = line + 1, 1
                continue
            if char == delimiter and not quoted:
                field_start = True
            pos, column = pos + 1, column + 1
        if quoted:
            return fields, (line, column), ("unterminated", *opened)
        if field_start:
            fields.append((line, column))
        return fields, (line, column), None


def _line_offset(text: str, line: int) -> int:
    """Where 1-based `line` starts, counting lines as the csv module does (\\n, \\r\\n, \\r)."""
    if line <= 1:
        return 0
    for number, match in enumerate(re.finditer(r"\r\n|\r|\n", text), start=2):
        if number == line:
            return match.end()
    return len(text)


def _check_header(row: list[str], record: _Record, path: StrPath) -> list[str]:
    starts, _, _ = record.scan()
    seen: dict[str, int] = {}
    for position, field in enumerate(row, start=1):
        column = starts[position - 1][1] if position <= len(starts) else None
        if not field.strip():
            raise DatasetError(
                f"header field {position} is empty. Give every column a name in the header row.",
                path=path,
                line=record.line,
                column=column,
            )
        if field in seen:
            raise DatasetError(
                f"header name {field!r} appears more than once (fields {seen[field]} and "
                f"{position}). Rename one of the columns so every name is unique.",
                path=path,
                line=record.line,
                column=column,
            )
        seen[field] = position
    return row


def _field_count_error(
    header: list[str], row: list[str], record: _Record, path: StrPath
) -> DatasetError:
    expected, found = len(header), len(row)
    starts, end, _ = record.scan()
    if found > expected:
        at = starts[expected] if len(starts) > expected else end
        what = f"field {expected + 1} has no column in the header"
        advice = (
            'Quote values that contain the delimiter (for example "a, b") or remove the '
            "extra fields."
        )
    else:
        at = end
        missing = ", ".join(repr(name) for name in header[found:])
        what = f"no value for {missing}"
        advice = "Add the missing values (an empty value is written as nothing between commas)."
    on_line = at[0] == record.line
    where = "" if on_line else f" (at line {at[0]}, column {at[1]})"
    return DatasetError(
        f"expected {expected} fields ({', '.join(header)}), found {found}: {what}{where}. {advice}",
        path=path,
        line=record.line,
        column=at[1] if on_line else None,
    )


def _csv_error(exc: csv.Error, record: _Record, path: StrPath, current_line: int) -> DatasetError:
    message = str(exc)
    starts, _, problem = record.scan()
    if problem is not None:
        kind, line, column = problem
        field = record.column_name(
            sum(1 for start in starts if start <= (line, column)) if starts else 1
        )
        if kind == "unterminated":
            return DatasetError(
                f"unterminated quoted field: the quote that opens {field} is never closed. "
                'Close the quote, and write any " inside a quoted value as "".',
                path=path,
                line=line,
                column=column,
            )
        return DatasetError(
            f"malformed CSV ({message}) in {field}: text follows its closing quote. Wrap values "
            'containing the delimiter, quotes or newlines in double quotes, and write any " '
            'inside them as "".',
            path=path,
            line=line,
            column=column,
        )
    if "unexpected end of data" in message:
        return DatasetError(
            "unterminated quoted field: a quote opened in the record starting on this line is "
            'never closed. Close the quote, and write any " inside a quoted value as "".',
            path=path,
            line=record.line,
        )
    return DatasetError(
        f"malformed CSV ({message}). Wrap values containing the delimiter, quotes or newlines "
        'in double quotes, and write any " inside them as "".',
        path=path,
        line=max(current_line, record.line),
    )
