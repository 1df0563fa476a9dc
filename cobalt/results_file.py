"""The results file's forms, which one a run gets, and the one way to read any of them.

A run's results file is `<timestamp>_<name>_<id>` with a suffix naming its form: `.json` (one
JSON document, the header and its `items`) or `.jsonl` (JSON Lines: the header on the first
line, then one item per line), either of them gzip-compressed (`.gz`). `[results]` in
cobalt.toml chooses: `format = "auto" | "json" | "jsonl"` and `compress = "auto" | true |
false`; `auto` means JSON Lines, compressed, for runs of more than `large_run` item results
(LARGE_RUN), a plain JSON document for the others.

gzip, not zstd: the standard library writes and reads it, and so do `zcat`, `jq` (through
`zcat`), pandas and every archive tool. `load_results` and `read_results` read every form.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

# Item results above which `auto` writes JSON Lines, compressed. A results entry weighs about
# 800 bytes (more with traces): a 20,000-item JSON document is 16 MB and more than 100 MB of
# Python objects once loaded whole, where JSON Lines are read one item at a time.
LARGE_RUN = 20_000
FORMATS = ("auto", "json", "jsonl")
SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")
# The results file is written on `cobalt run`'s way out: level 1 compresses results ~14x at
# ~140 MB/s here, level 6 (gzip's default) ~18x at ~60 MB/s, Python's 9 slower still.
GZIP_LEVEL = 1


@dataclass(frozen=True)
class Form:
    """How a results file is written: JSON Lines or one document, compressed or not."""

    lines: bool = False
    compressed: bool = False

    @property
    def suffix(self) -> str:
        return (".jsonl" if self.lines else ".json") + (".gz" if self.compressed else "")


def choose(settings: Mapping[str, Any] | None, items: int) -> Form:
    """The form of the results file of a run of `items` item results, by `[results]`."""
    settings = settings or {}
    large = items > settings.get("large_run", LARGE_RUN)
    fmt, compress = settings.get("format", "auto"), settings.get("compress", "auto")
    return Form(
        lines=fmt == "jsonl" or (fmt == "auto" and large),
        compressed=compress is True or (compress == "auto" and large),
    )


def form_of(path: str | Path) -> Form:
    """The form a results file's name says it has (ValueError for another file)."""
    name = Path(path).name
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return Form(lines=".jsonl" in suffix, compressed=suffix.endswith(".gz"))
    raise ValueError(f"{name}: not a results file (they end in {', '.join(SUFFIXES)})")


def open_text(path: str | Path, mode: str, *, compressed: bool) -> IO[str]:
    """A results file (or an export) opened as UTF-8 text ("r" or "w"), through gzip when
    compressed; line ends are written and read as they are (CSV rows end in CR LF)."""
    if compressed:
        return gzip.open(path, mode + "t", encoding="utf-8", newline="", compresslevel=GZIP_LEVEL)
    return open(path, mode, encoding="utf-8", newline="")


def read_results(path: str | Path) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
    """A results file's header (the document without `items`) and its items, in order.

    JSON Lines are read one line at a time, so a million-item run never sits in memory; a
    JSON document is read whole (`auto` writes it only for runs up to `large_run` items)."""
    form = form_of(path)
    if not form.lines:
        with open_text(path, "r", compressed=form.compressed) as fh:
            document = json.load(fh)
        items = document.pop("items", [])
        return document, iter(items)
    fh = open_text(path, "r", compressed=form.compressed)
    try:
        header = json.loads(fh.readline())
    except BaseException:
        fh.close()
        raise
    return header, _lines(fh)


def _lines(fh: IO[str]) -> Iterator[dict[str, Any]]:
    with fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def load_results(path: str | Path) -> dict[str, Any]:
    """A results file of any form as the one JSON document (its items in a list)."""
    header, items = read_results(path)
    return {**header, "items": list(items)}


def results_files(folder: str | Path) -> list[Path]:
    """The results files in a folder, in any form, by name."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.endswith(SUFFIXES) and p.is_file())
