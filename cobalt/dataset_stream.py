"""JSON Lines and CSV datasets streamed from their file (issue 41): checked whole when loaded,
as before, then read again whenever their items are wanted, never held in memory.

Loading a file reads it once, item by item: every line or record is parsed and checked (a
JSON object, finite numbers, a row as wide as the header, unique ids) with the errors of
`dataset_json` and `dataset_csv`, naming the file, line and column. What is kept is where
each item starts in the file (8 bytes an item) and the file's size and modification time: a
million-item file costs 8 MB instead of the ~270 bytes an item of parsed dicts. Iterating
reads the file again, from the top; `dataset[i]` reads one item from its place. A file changed
after it was loaded is refused (`DatasetError`) rather than read as other items.

Unique ids are checked on a 64-bit hash of each id's key (8 bytes an item, sorted with numpy
once the file is read); only when two hashes are equal is the file read again to name the two
items and their lines, as `check_unique_ids` does for a list.
"""

from __future__ import annotations

import csv
import importlib
import io
import itertools
import json
import os
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, NoReturn, overload

from cobalt.dataset import (
    DatasetError,
    Item,
    StrPath,
    check_finite,
    check_unique_ids,
    find_value,
    is_non_finite,
    item_key,
)
from cobalt.dataset_files import located, read_text

JSONL, CSV = "jsonl", "csv"


class FileItems(Sequence[Item]):
    """A checked JSON Lines or CSV file's items, read from the file when asked for."""

    __slots__ = ("path", "shown", "form", "offsets", "stamp", "delimiter", "header")
    streamed = True  # `Dataset._derive` keeps it as it is

    def __init__(
        self,
        path: Path,
        shown: StrPath,
        form: str,
        offsets: array,
        stamp: tuple[int, int],
        *,
        delimiter: str = ",",
        header: list[str] | None = None,
    ) -> None:
        self.path, self.shown, self.form, self.offsets = path, shown, form, offsets
        self.stamp, self.delimiter, self.header = stamp, delimiter, header

    def __len__(self) -> int:
        return len(self.offsets)

    @overload
    def __getitem__(self, index: int) -> Item: ...
    @overload
    def __getitem__(self, index: slice) -> FileItems | list[Item]: ...
    def __getitem__(self, index: int | slice) -> Item | FileItems | list[Item]:
        if isinstance(index, slice):  # consecutive items stay in the file
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return FileItems(
                self.path,
                self.shown,
                self.form,
                self.offsets[start:stop],
                self.stamp,
                delimiter=self.delimiter,
                header=self.header,
            )
        offset = self.offsets[index]  # IndexError as a tuple's
        with self._open(offset) as file:
            return next(self._read(file))

    def __iter__(self) -> Iterator[Item]:
        """The items in order: the file read from the first one (its items are consecutive)."""
        if not len(self):
            return
        with self._open(self.offsets[0]) as file:
            yield from itertools.islice(self._read(file), len(self))

    def _open(self, offset: int) -> BinaryIO:
        try:
            file = open(self.path, "rb")  # noqa: SIM115 - closed by the caller's `with`
            stat = os.fstat(file.fileno())
        except OSError as exc:
            raise DatasetError(
                f"cannot read the file again ({exc.strerror or exc}): a dataset read from a "
                "file is read from it whenever its items are wanted. Keep the file in place.",
                path=self.shown,
            ) from None
        if (stat.st_size, stat.st_mtime_ns) != self.stamp:
            file.close()
            raise DatasetError(
                "the file changed after the dataset was loaded (a dataset read from a file is "
                "read from it whenever its items are wanted). Load it again.",
                path=self.shown,
            )
        file.seek(offset)
        return file

    def _read(self, file: BinaryIO) -> Iterator[Item]:
        """The items from where `file` stands, in order (checked when loaded)."""
        if self.form == JSONL:
            for line in file:
                if line.strip():
                    yield json.loads(line)
            return
        text = io.TextIOWrapper(file, encoding="utf-8", newline="")
        header = self.header or []
        for row in csv.reader(text, delimiter=self.delimiter, strict=True):
            if row:
                yield dict(zip(header, row, strict=True))


BOM = b"\xef\xbb\xbf"


def scan_jsonl(path: StrPath) -> FileItems:
    """Check every line of a JSON Lines file and keep where each item starts. On the first
    problem the file is read whole by `dataset_json.load_jsonl`, which raises the error it
    always raised (a byte that is not UTF-8 anywhere in the file comes first)."""
    where = located(path)
    offsets, ids, checks = array("q"), _Ids(), _Finite(path)
    with _opened(where, path) as (file, stamp):
        offset = 0
        for line_number, raw in enumerate(file, start=1):
            start, offset = offset, offset + len(raw)
            if start == 0 and raw.startswith(BOM):
                start, raw = len(BOM), raw[len(BOM) :]
            try:
                line = raw.decode("utf-8")
                if not line.strip():
                    continue
                item = json.loads(line, parse_constant=_refuse)
            except (ValueError, _Refused):  # not UTF-8, not JSON, NaN or Infinity
                item = None
            if not isinstance(item, dict):
                _raise_as_loaded(path, "dataset_json", "load_jsonl", line_number)
            checks.add(item, len(offsets))
            ids.add(item)
            offsets.append(start)
    items = FileItems(where, path, JSONL, offsets, stamp)
    ids.check(items, path)
    checks.check()
    return items


def scan_csv(path: StrPath, *, delimiter: str = ",") -> FileItems:
    """Check every record of a CSV file and keep where each item starts. On the first problem
    the file is read whole by `dataset_csv.load_csv`, which raises the error it always raised,
    naming the line, column and field."""
    where = located(path)
    offsets, ids = array("q"), _Ids()
    with _opened(where, path) as (file, stamp):
        lines = _Lines(file)
        reader = csv.reader(lines, delimiter=delimiter, strict=True)
        header: list[str] | None = None
        while True:
            start = lines.offset
            try:
                row = next(reader)
            except StopIteration:
                break
            except (csv.Error, UnicodeDecodeError):
                _raise_as_loaded(
                    path, "dataset_csv", "load_csv", reader.line_num, delimiter=delimiter
                )
            if not row:
                continue
            if header is None:
                if any(not name.strip() for name in row) or len(set(row)) != len(row):
                    _raise_as_loaded(
                        path, "dataset_csv", "load_csv", reader.line_num, delimiter=delimiter
                    )
                header = row
                continue
            if len(row) != len(header):
                _raise_as_loaded(
                    path, "dataset_csv", "load_csv", reader.line_num, delimiter=delimiter
                )
            ids.add(dict(zip(header, row, strict=True)))
            offsets.append(start)
    if header is None:
        _raise_as_loaded(path, "dataset_csv", "load_csv", 0, delimiter=delimiter)
    items = FileItems(where, path, CSV, offsets, stamp, delimiter=delimiter, header=header)
    ids.check(items, path)
    return items


def _raise_as_loaded(
    path: StrPath, module: str, loader: str, line: int, **options: Any
) -> NoReturn:
    """Read the file whole as `cobalt.<module>.<loader>` did before streaming: it raises the
    error naming the file, line and column. (Should it not, the line is still named.)"""
    getattr(importlib.import_module(f"cobalt.{module}"), loader)(path, **options)
    raise DatasetError("the file could not be read as a dataset.", path=path, line=line or None)


class _Refused(Exception):
    """NaN, Infinity or -Infinity in a JSON line (Python's json reads them)."""


def _refuse(name: str) -> Any:
    raise _Refused(name)


class _Finite:
    """The first item holding a number JSON cannot (1e999 reads as infinity), raised once the
    ids are checked, as `Dataset` did after `check_unique_ids`."""

    def __init__(self, path: StrPath) -> None:
        self.path, self.first = path, None

    def add(self, item: Item, index: int) -> None:
        if self.first is None and find_value(item, is_non_finite) is not None:
            self.first = (index, item)

    def check(self) -> None:
        if self.first is not None:
            check_finite([self.first[1]], path=self.path, first_index=self.first[0])


class _Lines:
    """A binary file's lines as the csv module reads them (split at \\n, \\r\\n or \\r, kept
    whole), counting the bytes handed over: `offset` is where the next line starts."""

    def __init__(self, file: BinaryIO) -> None:
        self.offset = len(BOM) if file.read(len(BOM)) == BOM else 0
        file.seek(self.offset)
        self.text = io.TextIOWrapper(file, encoding="utf-8", newline="")

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        line = next(self.text)
        self.offset += len(line.encode("utf-8"))
        return line


class _opened:
    """The file, opened to be scanned, with its size and modification time."""

    def __init__(self, where: Path, shown: StrPath) -> None:
        self.where, self.shown = where, shown

    def __enter__(self) -> tuple[BinaryIO, tuple[int, int]]:
        try:
            self.file = open(self.where, "rb")  # noqa: SIM115 - closed by __exit__
        except OSError:
            read_text(self.shown)  # raises the error saying why it cannot be read
            raise
        stat = os.fstat(self.file.fileno())
        return self.file, (stat.st_size, stat.st_mtime_ns)

    def __exit__(self, *exc: object) -> None:
        self.file.close()


class _Ids:
    """A 64-bit hash of each id's key: equal hashes are looked at again once the file is read
    (`check_unique_ids` on the items sharing one, with their indices and lines)."""

    def __init__(self) -> None:
        self.hashes = array("q")

    def add(self, item: Item) -> None:
        if item.get("id") is not None:
            self.hashes.append(hash(item_key(item)))

    def check(self, items: FileItems, path: StrPath) -> None:
        if len(self.hashes) < 2:
            return
        import numpy as np  # here: only a file dataset with ids sorts their hashes

        hashes = np.sort(np.frombuffer(self.hashes, dtype=np.int64))
        twice = set(hashes[1:][hashes[1:] == hashes[:-1]].tolist())
        if not twice:
            return
        chosen = [
            (index, item)
            for index, item in enumerate(items)
            if item.get("id") is not None and hash(item_key(item)) in twice
        ]
        check_unique_ids(
            [item for _, item in chosen],
            path=path,
            lines=lambda: [_line_of(items, index) for index, _ in chosen],
            indices=[index for index, _ in chosen],
        )


def _line_of(items: FileItems, index: int) -> int:
    """The 1-based line where item `index` starts (read again, for an error message)."""
    with items._open(0) as file:
        return file.read(items.offsets[index]).count(b"\n") + 1
