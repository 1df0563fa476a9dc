"""Find experiment files and import them (they register; they do not run).

Files are `*.cobalt.py` / `*.experiment.py` under the test directory. Which file may run is
one rule (`runnable_file`) that every door applies: the CLI, the API, the MCP server and the
workers.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

from cobalt import variants
from cobalt.config import Config
from cobalt.errors import CobaltError, NotFoundError
from cobalt.experiments import Experiment, collecting
from cobalt_app.storable import redacted
from cobalt_app.tracebacks import user_traceback


class FileRefused(CobaltError):
    """A file a user named may not be used; the message says why and what may."""


class PathOutsideProject(FileRefused):
    pass


class NotAnExperimentFile(FileRefused):
    pass


class PathNotFound(NotFoundError, FileNotFoundError):
    """A path a user named does not exist (an OSError too, for callers reading files)."""


@dataclass
class LoadedFile:
    path: Path
    experiments: list[Experiment] = field(default_factory=list)
    error: str | None = None
    traceback: str | None = None


def confine(path: str | Path, root: Path, *, what: str = "path") -> Path:
    """Resolve a user-given path (symlinks too) and refuse it unless it is inside `root`."""
    root = root.resolve()
    candidate = Path(path)
    if not candidate.is_absolute():
        candidate = root / candidate
    resolved = candidate.resolve()
    if resolved != root and root not in resolved.parents:
        raise PathOutsideProject(
            f"{what} {str(path)!r} resolves outside the project folder {root}; "
            "only files inside the project can be used"
        )
    return resolved


def runnable_file(path: str | Path, config: Config, *, what: str = "file") -> Path:
    """The one rule for which file may run, whoever asks (the CLI, the API, the MCP server, a
    worker): an experiment file inside the project (symlinks resolved), under its test
    directory, whose name matches `test_match`. Nothing is imported to decide."""
    resolved = confine(path, config.project_dir, what=what)
    test_dir = config.test_dir.resolve()
    if test_dir not in resolved.parents:
        shown = _relative(test_dir, config.project_dir)
        raise NotAnExperimentFile(
            f"{str(path)!r} is not under the test directory {shown}/; experiment files run only "
            "from there (test_dir)"
        )
    if not resolved.is_file():
        raise PathNotFound(f"{what} {str(path)!r} does not exist or is not a file")
    patterns = test_patterns(config)
    if not matches(resolved, patterns, test_dir):
        raise NotAnExperimentFile(
            f"{str(path)!r} is not an experiment file: its name must match "
            f"{', '.join(patterns)} (test_match)"
        )
    return resolved


def test_patterns(config: Config) -> list[str]:
    return config.get("test_match") or ["**/*.cobalt.py", "**/*.experiment.py"]


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def matches(path: Path, patterns: list[str], base: Path) -> bool:
    relative = path.relative_to(base).as_posix() if base in path.parents else path.name
    for pattern in patterns:
        if fnmatch(relative, pattern) or fnmatch(path.name, pattern.split("/")[-1]):
            return True
    return False


def discover(config: Config, paths: list[str] | None = None) -> list[Path]:
    """Experiment files: the given files/folders, or everything under the test directory."""
    patterns = test_patterns(config)
    roots: list[Path] = []
    files: list[Path] = []
    for given in paths or []:
        resolved = confine(Path(given).resolve(), config.project_dir, what="experiment path")
        if resolved.is_dir():
            roots.append(resolved)
        elif resolved.is_file():
            files.append(runnable_file(resolved, config, what="experiment path"))
        else:
            raise PathNotFound(f"experiment path {given!r} does not exist")
    if not paths:
        roots.append(config.test_dir)
    for root in roots:
        if not root.is_dir():
            continue
        for candidate in sorted(root.rglob("*.py")):
            if "__pycache__" in candidate.parts or any(
                part.startswith(".") for part in candidate.relative_to(root).parts
            ):
                continue
            if matches(candidate, patterns, root):
                try:
                    files.append(runnable_file(candidate, config))
                except PathOutsideProject:
                    files.append(candidate)  # listed under its name; load_file refuses it
                except NotAnExperimentFile:
                    continue  # outside the test directory
    return list(dict.fromkeys(files))


def module_name_for(path: Path) -> str:
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    stem = path.name.split(".")[0].replace("-", "_")
    return f"cobalt_experiments.{stem}_{digest}"


def shadowed_folder_hint(exc: BaseException, project_dir: Path) -> str:
    """Why `from agents.support import x` fails in a project with an `agents/` folder: an
    installed package of the same name (the OpenAI Agents SDK is `agents`) wins over a folder
    without `__init__.py` (a namespace package), whatever the order of `sys.path`."""
    if not isinstance(exc, ImportError) or not exc.name:
        return ""
    top = exc.name.partition(".")[0]
    folder = project_dir / top
    installed = getattr(sys.modules.get(top), "__file__", None)
    if not folder.is_dir() or (folder / "__init__.py").exists() or not installed:
        return ""
    if Path(installed).resolve().is_relative_to(project_dir.resolve()):
        return ""
    return (
        f" (the folder {top}/ of this project is hidden by the installed package {top!r} at "
        f"{Path(installed).parent}: add an empty {top}/__init__.py, or rename the folder)"
    )


def load_file(path: Path, project_dir: Path) -> LoadedFile:
    """Import an experiment file in registration mode; an import error is reported, not raised.

    A file that resolves outside the project folder (a symlink leading out) is never
    imported, whoever asks (`cobalt run`, the API's listing, a worker): it is reported so.
    """
    loaded = LoadedFile(path=path)
    try:
        confine(path, project_dir, what="experiment file")
    except PathOutsideProject as exc:
        loaded.error = f"{exc}; it was not imported"
        return loaded
    for folder in (str(project_dir), str(path.parent)):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    name = module_name_for(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        loaded.error = "not a Python file"
        return loaded
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    with collecting() as found:
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:  # an experiment file may even call sys.exit()
            if isinstance(exc, KeyboardInterrupt):
                raise
            sys.modules.pop(name, None)
            # Printed, logged by CI and answered by the API and MCP: no secret in either.
            error = f"{type(exc).__name__}: {exc}{shadowed_folder_hint(exc, project_dir)}"
            loaded.error = redacted(error)
            loaded.traceback = redacted(user_traceback(exc))
            return loaded
    for experiment in found:
        experiment.file = str(path)
    # One experiment per variant: every loader finds a variant's run by its name.
    loaded.experiments = variants.expand_all(found)
    return loaded
