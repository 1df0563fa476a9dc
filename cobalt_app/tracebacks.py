"""A user's error, shown from the user's code on.

A runner's exception or an experiment file's import error arrives under frames of the
harness that called it: Cobalt's engine awaiting the runner, the worker thread of a sync
runner, importlib executing the file. Like pytest, which hides its own call machinery, the
stored and printed traceback starts at the first frame of anything else (the user's code, or
a library it called). The frames below the user's code stay (a library's bug shows where it
is), except Cobalt's own under a `CobaltError`: its message already says what is wrong and
the user's frame says which line asked. A file that does not parse has no frame of its own:
its `SyntaxError` shows the line and a caret by itself, without importlib's frames.
"""

from __future__ import annotations

import re
import sysconfig
import traceback
from pathlib import Path
from typing import NamedTuple

from cobalt import version

OWN = (str(Path(version.__file__).parent) + "/", str(Path(__file__).parent) + "/")
STDLIB = str(Path(sysconfig.get_paths()["stdlib"])) + "/"
# Outside a virtualenv, installed packages live below the standard library's folder.
INSTALLED = ("/site-packages/", "/dist-packages/")


def user_traceback(exc: BaseException) -> str:
    """`exc` formatted as `traceback.format_exception` does, its outermost frames of the
    harness left out; whole when every frame is the harness's (an error of Cobalt itself)."""
    from cobalt.errors import CobaltError

    shown = traceback.TracebackException.from_exception(exc)
    frames = list(shown.stack)
    unparsed = isinstance(exc, SyntaxError) and not isinstance(exc, CobaltError)
    start = next(
        (i for i, frame in enumerate(frames) if not is_harness(frame.filename)),
        len(frames) if unparsed else 0,
    )
    end = len(frames)
    if isinstance(exc, CobaltError):
        while end > start + 1 and frames[end - 1].filename.startswith(OWN):
            end -= 1
    shown.stack = traceback.StackSummary.from_list(frames[start:end])
    return "".join(shown.format())


def is_harness(filename: str) -> bool:
    """Cobalt's own code, importlib's frozen modules, or the standard library (the thread
    that ran a sync runner) — not a package installed beside it, even below that folder."""
    if filename.startswith(OWN) or filename.startswith("<frozen "):
        return True
    return filename.startswith(STDLIB) and not any(part in filename for part in INSTALLED)


FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>.+)$')


class RaisedAt(NamedTuple):
    """Where an item's error was raised: `where` reads `experiments/qa.cobalt.py:53 in run`."""

    where: str
    code: str  # the line's source, stripped ('' when the traceback has none)


def raised_at(traceback_text: str, project_dir: Path) -> RaisedAt | None:
    """The stored traceback's last frame in the project's own files (not a virtualenv inside
    it), else its last frame: the line to open to fix an item's error. The terminal summary and
    `cobalt_run`'s summary both say it."""
    lines = (traceback_text or "").splitlines()
    frames = [(i, m) for i, text in enumerate(lines) if (m := FRAME.match(text))]
    if not frames:
        return None
    root = project_dir.resolve()

    def own(file: str) -> bool:
        path = Path(file)
        inside = path.is_absolute() and path.resolve().is_relative_to(root)
        return inside and not any(part in file for part in INSTALLED)

    i, frame = ([(i, m) for i, m in frames if own(m["file"])] or frames)[-1]
    file = Path(frame["file"])
    shown = file.resolve().relative_to(root).as_posix() if own(frame["file"]) else str(file)
    following = lines[i + 1] if i + 1 < len(lines) else ""
    code = following.strip() if following.startswith("    ") else ""
    return RaisedAt(f"{shown}:{frame['line']} in {frame['name']}", code)
