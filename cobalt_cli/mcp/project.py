"""The project a server works in, and the modules its experiments import.

A long-lived server imports the agent once per run. Python would reuse a module already in
`sys.modules`, and a `.pyc` whose recorded source mtime and size still match (an edit saved
within the same second, of the same length). So every module an experiment brings in from
user code is remembered with the SHA-256 of its source; before the next import, the project's
own modules are forgotten, and so is every module from outside the project whose source
changed (with its cached bytecode), so the edited code is what runs.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from cobalt.config import Config, ConfigError, load_config
from cobalt_app.user_modules import UserModules

DEFAULT_RESULT_TOKENS = 20_000
MIN_RESULT_TOKENS = 2_000


def source_hash(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


@dataclass
class Reimport:
    """What `Project.importing()` did before an import, for the tool result."""

    forgotten: int = 0
    changed_outside: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {
            "projectModulesReimported": self.forgotten,
            "outsideProject": self.outside,
            "reloadedOutsideProject": self.changed_outside,
        }


class Project:
    """The project the server works in; its configuration is re-read for every call."""

    def __init__(self, config: Config) -> None:
        self.dir = config.project_dir.resolve()
        # One import at a time: runs and generations import (and forget) the project's modules.
        self.lock = anyio.Semaphore(1)
        self.hashes: dict[str, tuple[str, str]] = {}  # module -> (file, sha256) as imported
        self.modules = UserModules(self.dir)

    def config(self) -> Config:
        return load_config(self.dir)

    def result_tokens(self, config: Config) -> int:
        """`[mcp] result_tokens`: the largest tool result, in tokens (default 20,000)."""
        value = config.get("mcp.result_tokens", DEFAULT_RESULT_TOKENS)
        if not isinstance(value, int) or isinstance(value, bool) or value < MIN_RESULT_TOKENS:
            raise ConfigError(
                f"`mcp.result_tokens` must be a whole number of at least {MIN_RESULT_TOKENS} "
                f"(got {value!r})"
            )
        return value

    def relative(self, path: str | Path | None) -> str | None:
        if not path:
            return None
        try:
            return Path(path).resolve().relative_to(self.dir).as_posix()
        except ValueError:
            return str(path)

    # ---------------------------------------------------------------- modules

    def forget_modules(self) -> Reimport:
        """Drop the project's modules from `sys.modules` (and the bytecode of the changed ones),
        so the next import reads the code. Modules from outside the project are kept unless
        one of them changed: then all of them go (one may hold names from another)."""
        done = Reimport()
        changed = {
            name: path
            for name, (path, digest) in self.hashes.items()
            if source_hash(path) != digest
        }
        for path in changed.values():
            cached = importlib.util.cache_from_source(path)
            if os.path.exists(cached):
                os.remove(cached)  # it may record the edit's mtime and size: it would be trusted
        done.forgotten = self.modules.forget_project()
        if changed:
            for name in self.modules.loaded(set(self.hashes) & set(sys.modules)):
                if name in changed:
                    done.changed_outside.append(name)
                del sys.modules[name]
        for name in changed:
            del self.hashes[name]
        done.changed_outside.sort()
        importlib.invalidate_caches()
        return done

    def remember_modules(self, before: set[str]) -> None:
        """Record the source hash of the user modules imported since `before`."""
        for name, path in self.modules.loaded(set(sys.modules) - before).items():
            digest = source_hash(path)
            if digest:
                self.hashes[name] = (path, digest)

    @contextmanager
    def importing(self) -> Iterator[Reimport]:
        """Around an import of experiment code (the caller holds `lock`)."""
        done = self.forget_modules()
        before = set(sys.modules)
        try:
            yield done
        finally:
            self.remember_modules(before)
            done.outside = sorted(
                name for name, (path, _) in self.hashes.items() if not self.modules.in_project(path)
            )
