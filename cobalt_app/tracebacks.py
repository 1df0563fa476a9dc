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

import sysconfig
import traceback
from pathlib import Path

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
