"""Where the collected static files live: a cache folder per installed version.

Read by the settings of every command, so it imports nothing of Django or whitenoise
(`static_files` collects and serves them).
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from pathlib import Path

MANIFEST = "staticfiles.json"
# Whose static files are collected besides our own (the admin, the browsable API, API docs).
STATIC_DISTRIBUTIONS = ("django", "djangorestframework", "drf-spectacular-sidecar", "whitenoise")


def default_root(sources: Path) -> Path:
    """`<cache>/cobalt/static-<fingerprint>`: the fingerprint covers our static files (names,
    sizes, times) and the versions of the packages whose static files are collected."""
    from importlib import metadata

    parts = []
    for name in ("cobalt", *STATIC_DISTRIBUTIONS):
        try:
            parts.append(f"{name}={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{name}=-")
    for file in sorted(sources.rglob("*")):
        if file.is_file():
            stat = file.stat()
            parts.append(f"{file.relative_to(sources)}:{stat.st_size}:{stat.st_mtime_ns}")
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return _cache_dir() / f"static-{digest}"


def _cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cobalt"
    try:
        base.mkdir(parents=True, exist_ok=True)
        if os.access(base, os.W_OK):
            return base
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"cobalt-{os.getuid() if hasattr(os, 'getuid') else 0}"


class LazyRoot(os.PathLike):
    """`default_root(sources)`, worked out on first use (`os.fspath`, `str`): the fingerprint
    reads package metadata, ~12 ms that every command would pay in its settings, while only
    the processes serving pages or collecting files use the folder."""

    def __init__(self, sources: Path) -> None:
        self.sources = sources

    @functools.cached_property
    def path(self) -> Path:
        return default_root(self.sources)

    def __fspath__(self) -> str:
        return str(self.path)

    __str__ = __fspath__

    def __repr__(self) -> str:
        return f"LazyRoot({self.sources!s})"
