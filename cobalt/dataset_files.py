"""Reading a dataset file: where a relative path starts (the project of the code loading it)
and its UTF-8 text, every failure a `DatasetError` naming the file."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

from cobalt.dataset import DatasetError, StrPath

# The dataset modules: the code loading a dataset is the first frame outside them.
DATASET_MODULES = (
    "cobalt.dataset",
    "cobalt.dataset_files",
    "cobalt.dataset_json",
    "cobalt.dataset_csv",
    "cobalt.dataset_stream",
)


def caller_project() -> Path | None:
    """The project folder (where cobalt.toml is) of the code loading a dataset: relative paths
    start there, as under `cobalt run`, whatever the current folder. None outside a project
    (or from code without a file, such as a notebook cell): the current folder then."""
    frame = inspect.currentframe()
    while frame is not None and frame.f_globals.get("__name__") in DATASET_MODULES:
        frame = frame.f_back
    if frame is None or frame.f_code.co_filename.startswith("<"):
        return None
    from cobalt.config import find_project_dir  # only when a relative path is read

    return find_project_dir(Path(frame.f_code.co_filename).parent)


def located(path: StrPath) -> Path:
    """Where the file is: a relative path from the project of the code loading it."""
    given = Path(path)
    base = None if given.is_absolute() else caller_project()
    return base / given if base else given


def read_text(path: StrPath) -> str:
    """Read a UTF-8 file (optional BOM), turning every failure into a DatasetError."""
    given = Path(path)
    base = None if given.is_absolute() else caller_project()
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
