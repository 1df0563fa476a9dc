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
used without Django; so do the file formats it loads by name when first needed
(:mod:`cobalt.dataset_json`, :mod:`cobalt.dataset_csv`, reading through
:mod:`cobalt.dataset_files`). Here: the :class:`Dataset` API, :class:`DatasetError`,
:func:`item_key`, and the checks every item passes (unique ids, finite numbers).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import os
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from cobalt.errors import CobaltError

__all__ = ["Dataset", "DatasetError", "Item", "item_key", "SUPPORTED_EXTENSIONS"]

Item = dict[str, Any]
"""One dataset item: a plain dict of named fields."""

StrPath = str | os.PathLike[str]
Lines = list[int] | Callable[[], list[int] | None]
"""Each item's line in its file, or a function finding them (called only for a message)."""

_JSON_EXTENSIONS = (".json",)
_JSONL_EXTENSIONS = (".jsonl", ".ndjson")
_CSV_EXTENSIONS = (".csv",)
SUPPORTED_EXTENSIONS: tuple[str, ...] = _JSON_EXTENSIONS + _JSONL_EXTENSIONS + _CSV_EXTENSIONS
"""File extensions understood by :meth:`Dataset.from_file`."""

INLINE_SOURCE = "inline"


class DatasetError(CobaltError, ValueError):
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


def type_name(value: object) -> str:
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
                f"{type_name(items)}. Wrap a single item in a list: Dataset([item])."
            )
        checked: list[Item] = []
        for index, item in enumerate(items):
            if not isinstance(item, dict):
                raise DatasetError(
                    f"item at index {index} is {type_name(item)}, expected a dict. Make every "
                    f'item a dict of named fields, for example {{"input": "..."}}.',
                    path=source if source not in (None, INLINE_SOURCE) else None,
                )
            checked.append(dict(item))
        file = source if source not in (None, INLINE_SOURCE) else None
        check_unique_ids(checked, path=file, lines=None)
        check_finite(checked, path=file)
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
        # A file's items stay in their file (`dataset_stream`); the others become a tuple.
        kept = items if getattr(items, "streamed", False) else tuple(items)
        derived._init(kept, self._name, self._source, seed)  # type: ignore[arg-type]
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
        items, lines = _sibling("dataset_json").load_json(path)
        return cls._loaded(items, path, name, lines)

    @classmethod
    def from_jsonl(cls, path: StrPath, *, name: str | None = None) -> Dataset:
        """Load a JSON Lines file: one JSON object per line; blank lines are skipped.

        The file is checked whole now, then streamed: its items are read from it whenever
        they are wanted (:mod:`cobalt.dataset_stream`), so a big file is never held in memory.
        """
        return cls._streamed(_sibling("dataset_stream").scan_jsonl(path), path, name)

    @classmethod
    def from_csv(cls, path: StrPath, *, delimiter: str = ",", name: str | None = None) -> Dataset:
        """Load an RFC 4180 CSV file whose first row names the fields.

        Quoted fields may contain the delimiter, doubled quotes (``""``) and newlines. The file
        must be UTF-8 (a leading byte-order mark is ignored). Values are kept as strings and
        blank lines are skipped. Every row must have exactly as many fields as the header.
        Like JSON Lines, the file is checked whole now, then streamed.
        """
        scanned = _sibling("dataset_stream").scan_csv(path, delimiter=delimiter)
        return cls._streamed(scanned, path, name)

    # Remote loaders live in cobalt.remote (HTTP, pagination, credentials; standard library
    # only, like this module).

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Dataset:
        """Load JSON, JSON Lines or CSV over HTTP(S): ``format=``, ``headers=``, ``name=``."""
        return _sibling("remote").from_url(url, **options)

    @classmethod
    def from_langfuse(cls, name: str, **options: Any) -> Dataset:
        """Every item of a Langfuse dataset (``LANGFUSE_PUBLIC_KEY``/``SECRET_KEY``/``HOST``)."""
        return _sibling("remote").from_langfuse(name, **options)

    @classmethod
    def from_langsmith(cls, name: str, **options: Any) -> Dataset:
        """Every example of a LangSmith dataset (``LANGSMITH_API_KEY``, ``LANGSMITH_ENDPOINT``)."""
        return _sibling("remote").from_langsmith(name, **options)

    @classmethod
    def from_braintrust(cls, project: str, dataset: str, **options: Any) -> Dataset:
        """Every record of a Braintrust dataset (``BRAINTRUST_API_KEY``, ``BRAINTRUST_API_URL``)."""
        return _sibling("remote").from_braintrust(project, dataset, **options)

    @classmethod
    def from_basalt(
        cls, dataset_id: str, *, api_key: str | None = None, base_url: str | None = None
    ) -> Dataset:
        """Every item of a Basalt dataset (``BASALT_API_KEY``, ``BASALT_API_URL``)."""
        return _sibling("remote").from_basalt(dataset_id, api_key=api_key, base_url=base_url)

    @classmethod
    def _loaded(
        cls, items: list[Item], path: StrPath, name: str | None, lines: Lines | None
    ) -> Dataset:
        # Duplicate ids are refused here, before Dataset(), to name both items' lines.
        check_unique_ids(items, path=path, lines=lines)
        source = os.fspath(path)
        return cls(items, name=name if name is not None else Path(source).stem, source=source)

    @classmethod
    def _streamed(cls, items: Sequence[Item], path: StrPath, name: str | None) -> Dataset:
        """A dataset over a checked file's items (`dataset_stream.FileItems`), not copied."""
        dataset = object.__new__(cls)
        source = os.fspath(path)
        dataset._init(items, name if name is not None else Path(source).stem, source, None)  # type: ignore[arg-type]
        return dataset

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
                    f"map function returned {type_name(result)} for item at index {index}, "
                    "expected a dict. Return the new item, for example "
                    '{**item, "input": ...}.',
                )
            mapped.append(dict(result))
        check_unique_ids(mapped, path=None, lines=None)
        check_finite(mapped, path=None)
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


def _sibling(name: str) -> Any:
    """`cobalt.<name>`, imported by name when first needed: this module imports the standard
    library only, and building a dataset inline never pays for the file formats (the
    `dataset_json`/`dataset_csv` loaders) or the remote ones (`remote`)."""
    return importlib.import_module(f"cobalt.{name}")


# ---------------------------------------------------------------------- item checks


def check_unique_ids(
    items: list[Item],
    *,
    path: StrPath | None,
    lines: Lines | None,
    indices: list[int] | None = None,
) -> None:
    """Refuse two items with the same `id`: a run, compare and `--resume` know an item by its
    `item_key`, `str(id)` (so `1` and `"1"` are the same id), and would take them for one.

    Items without an id are keyed by their content: two identical ones are the same test
    case, and stay allowed. `lines` (each item's line in its file, or a function finding
    them, called only for the message) point the error at both items; `indices`, each
    item's index in its dataset when `items` are some of its items.
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
        shown, shown_first = (indices[index], indices[first]) if indices else (index, first)
        raise DatasetError(
            f"item at index {shown} has the id {item_id!r}, already used by the item at index "
            f"{shown_first}{f' (line {lines[first]})' if lines else ''}{alike}. Ids must be unique "
            "within a dataset: runs, compare and --resume match items by id. Give each item "
            "its own id, or remove the duplicate.",
            path=path,
            line=lines[index] if lines else None,
        )


def check_finite(items: list[Item], *, path: StrPath | None, first_index: int = 0) -> None:
    """NaN and infinities (`float("nan")` in code) cannot be stored: JSON has neither.
    (`first_index`: the first item's index in its dataset, when `items` are some of them.)"""
    for index, item in enumerate(items, start=first_index):
        if all(type(value) in _PLAIN for value in item.values()):
            continue  # flat text, integers, booleans and None: nothing to find (issue 41)
        found = find_value(item, is_non_finite)
        if found is not None:
            field, value = found
            raise DatasetError(
                f"item at index {index}: field {field_name(field)!r} is {value!r}, which a "
                "dataset cannot hold (items are stored as standard JSON). Use None, a number "
                'or a string such as "NaN" instead.',
                path=path,
            )


_PLAIN = frozenset((str, int, bool, type(None)))


def is_non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def find_value(value: Any, wanted: Callable[[Any], bool]) -> tuple[list[str | int], Any] | None:
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
        below = find_value(child, wanted)
        if below is not None:
            return [key, *below[0]], below[1]
    return None


def field_name(path: list[str | int]) -> str:
    """`metadata.scores[2]`."""
    name = ""
    for part in path:
        if isinstance(part, int):
            name += f"[{part}]"
        else:
            name += f".{part}" if name else part
    return name
