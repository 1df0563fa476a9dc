"""Which loaded modules are user code, and which of those belong to the project.

`cobalt run --watch` watches the project modules an experiment file imports; the MCP server
imports them afresh before every run. Both forget them from `sys.modules` the same way.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path

COBALT_PACKAGES = {"cobalt", "cobalt_app", "cobalt_cli", "cobalt_project", "tests"}
VENDORED_DIRS = {"site-packages", "dist-packages", "node_modules", "__pypackages__"}


def installed_roots() -> tuple[str, ...]:
    """Folders of the standard library and installed packages: never user code."""
    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    return tuple(os.path.abspath(root) + os.sep for root in roots)


class UserModules:
    """The user code among the loaded modules, seen from a project folder."""

    def __init__(self, project: Path) -> None:
        self.project = project.resolve()
        self._installed = installed_roots()

    def source(self, name: str, module: object) -> str | None:
        """The source file of a module of user code (None for Cobalt, installed, built-in)."""
        file = getattr(module, "__file__", None)
        if not file or name == "__main__" or name.split(".")[0] in COBALT_PACKAGES:
            return None
        path = os.path.abspath(file)
        if not path.endswith(".py") or path.startswith(self._installed):
            return None
        if VENDORED_DIRS.intersection(Path(path).parts):  # another environment's packages
            return None
        return path

    def in_project(self, path: str) -> bool:
        """Inside the project, and not in a hidden or vendored folder of it."""
        root = str(self.project) + os.sep
        if not path.startswith(root):
            return False
        parts = Path(path[len(root) :]).parts
        return not any(p.startswith(".") or p in VENDORED_DIRS for p in parts)

    def loaded(self, names: Iterable[str] | None = None) -> dict[str, str]:
        """Module name → source file of the user modules among `names` (default: all loaded)."""
        found = {}
        for name in sys.modules if names is None else names:
            path = self.source(name, sys.modules.get(name))
            if path:
                found[name] = path
        return found

    def forget_project(self) -> int:
        """Drop the project's modules from `sys.modules`, so the next import reads their
        current code; how many there were."""
        forgotten = [name for name, path in self.loaded().items() if self.in_project(path)]
        for name in forgotten:
            del sys.modules[name]
        return len(forgotten)
