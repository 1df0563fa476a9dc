"""Where the user's code called Cobalt: the first frame outside Cobalt's own call path.

`Evaluator(...)` and `experiment(...)` remember the file and line they were written at, for
messages that point there. The frames stepped over belong to the modules on the call path:
`cobalt.evaluator` and `cobalt.experiments`, and a door that wraps them declares itself with
`on_call_path(__name__)` (`cobalt_cli.script`, the user's `cobalt.experiment`).
"""

from __future__ import annotations

from types import FrameType

_CALL_PATH = {"cobalt.evaluator", "cobalt.experiments"}


def on_call_path(module: str) -> None:
    """Step over the frames of `module` (by its `__name__`) when looking for the user's call."""
    _CALL_PATH.add(module)


def in_call_path(frame: FrameType) -> bool:
    return frame.f_globals.get("__name__") in _CALL_PATH
