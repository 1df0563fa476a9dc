"""Evaluator plugins: installed packages (entry point group `cobalt.evaluators`) and project files
listed in `plugins = ["plugins/my_eval.py"]`.

A plugin file registers its types with `@register("type-name", options=["keyword"])` from
`cobalt_app.evaluators`, naming the `Evaluator(...)` options the type reads (besides `name` and
`type`); an evaluator given any other option is refused before its run starts. An entry point
names either such a module, or one function that becomes the type named by the entry point:
`fn(evaluator, target, env)`, sync or async, returning an `EvalOutcome`, an `EvalResult`, a
`{"score", "reason"}` dict, a number or a bool. Such a function declares its options as an
attribute, `fn.options = ["keyword"]`; a type registered without options (as the original's
plugins are) is given whatever options the user writes, unchecked.

A plugin that fails to load, or that would replace a built-in type, is an error naming it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from cobalt.config import Config
from cobalt.errors import CobaltError
from cobalt_app import evaluators
from cobalt_app.discovery import PathOutsideProject, confine
from cobalt_app.tracebacks import user_traceback

ENTRY_POINT_GROUP = "cobalt.evaluators"

_loaded_entry_points = False
_loaded_files: set[Path] = set()


class PluginError(CobaltError):
    """A plugin could not be loaded; the message names it and says what went wrong."""

    http_status = 500  # the API's caller cannot fix the project's plugins

    def __init__(self, message: str, *, details: str = "") -> None:
        super().__init__(message)
        self.details = details


def load_plugins(config: Config) -> list[str]:
    """Load installed entry points once per process, then the project's plugin files."""
    global _loaded_entry_points
    loaded: list[str] = []
    evaluators.known_types()  # built-ins first, so a plugin cannot silently replace one
    if not _loaded_entry_points:
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            load_entry_point(entry_point)
            loaded.append(f"entry point {entry_point.name}")
        _loaded_entry_points = True
    for given in config.get("plugins") or []:
        path = plugin_path(config, given)
        if path in _loaded_files:
            continue
        load_file(path, label=given)
        _loaded_files.add(path)
        loaded.append(given)
    return loaded


def plugin_path(config: Config, given: str) -> Path:
    where = f"`plugins` in {config.path.name if config.path else 'the configuration'}"
    try:
        path = confine(given, config.project_dir, what=f"plugin file (from {where})")
    except PathOutsideProject as exc:
        raise PluginError(str(exc)) from None
    if not path.is_file():
        raise PluginError(
            f"plugin file {given!r} (from {where}) does not exist under {config.project_dir}"
        )
    return path


def load_entry_point(entry_point: importlib.metadata.EntryPoint) -> None:
    dist = getattr(entry_point, "dist", None)
    origin = f" from the package {dist.name!r}" if dist is not None else ""
    label = f"plugin entry point {entry_point.name!r} ({entry_point.value}){origin}"
    with guard_builtins(label):
        try:
            target = entry_point.load()
        except Exception as exc:
            raise PluginError(
                f"{label} failed to load: {type(exc).__name__}: {exc}",
                details=user_traceback(exc),
            ) from None
        if isinstance(target, ModuleType):
            return  # the module registered its types when imported
        if not callable(target):
            raise PluginError(
                f"{label} must point to a module or a function, not {type(target).__name__}"
            )
        registered = {t.implementation for t in evaluators.REGISTRY.values()}
        if target not in registered:
            options = getattr(target, "options", None)
            evaluators.register(entry_point.name, options=options)(adapt(target))


def load_file(path: Path, *, label: str) -> None:
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    name = f"cobalt_plugins.{path.stem.replace('-', '_').replace('.', '_')}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin {label!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    before = dict(evaluators.REGISTRY)
    with guard_builtins(f"plugin {label!r}"):
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            where = _line_of(exc, path)
            raise PluginError(
                f"plugin {label!r} failed to load: {type(exc).__name__}: {exc}{where}",
                details=user_traceback(exc),
            ) from None
    if before == evaluators.REGISTRY:
        raise PluginError(
            f"plugin {label!r} registered no evaluator type; decorate a function with "
            '`@register("my-type", options=[...])` from cobalt_app.evaluators'
        )


@contextmanager
def guard_builtins(label: str) -> Iterator[None]:
    """Refuse (and undo) a plugin that replaces a built-in evaluator type."""
    before = dict(evaluators.REGISTRY)
    try:
        yield
    finally:
        replaced = [k for k, v in before.items() if evaluators.REGISTRY.get(k) is not v]
        evaluators.REGISTRY.update({k: before[k] for k in replaced})
    if replaced:
        raise PluginError(
            f"{label} redefines the built-in evaluator type {', '.join(map(repr, replaced))}; "
            "give its type another name"
        )


def adapt(fn: Any) -> evaluators.Implementation:
    """Make a plugin function an implementation: sync or async, any documented return."""

    async def implementation(evaluator: Any, target: Any, env: Any) -> evaluators.EvalOutcome:
        value = await evaluators.call_user_function(fn, evaluator, target, env)
        if isinstance(value, evaluators.EvalOutcome):
            return value
        score, reason = evaluators.normalise_result(value)
        return evaluators.EvalOutcome(evaluator.name, score, reason)

    implementation.__name__ = getattr(fn, "__name__", "plugin")
    return implementation


def _line_of(exc: BaseException, path: Path) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
    if isinstance(exc, SyntaxError) and exc.lineno:
        return f" (line {exc.lineno})"
    return f" (line {frames[-1].lineno})" if frames else ""
