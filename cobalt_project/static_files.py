"""Static files with hashed names, compressed, cached for a year, with no setup step.

whitenoise serves hashed names (`cobalt.3f2a….js`) with `Cache-Control: max-age=315360000,
immutable` and a gzip copy, but only after `collectstatic` has written them and their manifest.
A pip-installed `cobalt serve` must work without that step, so the first process that needs
the static files collects them itself (`CollectedStaticStorage`), into a cache folder named by
a fingerprint of what is installed (`static_root.default_root`): an upgrade or an edited
stylesheet gets a new folder (one no process started on for 30 days is removed), and every
later start finds its files ready. The collection is written to a temporary folder and
renamed into place, so processes starting together never see half of it.
The Docker image collects at build time into `COBALT_STATIC_ROOT`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path

from whitenoise.middleware import WhiteNoiseMiddleware
from whitenoise.storage import CompressedManifestStaticFilesStorage

from cobalt_project.static_root import MANIFEST

IGNORED = ["CVS", ".*", "*~"]
UNUSED_DAYS = 30


def ensure_collected(root: Path) -> None:
    """Collect every app's static files into `root` unless its manifest is already there."""
    if (root / MANIFEST).is_file():
        _mark_used(root)
        return
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        collect(staging)
        try:
            staging.rename(root)
        except OSError:  # the folder exists: another process got there first, or it was given
            if not (root / MANIFEST).is_file():
                shutil.copytree(staging, root, dirs_exist_ok=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if root.name.startswith("static-"):
        _forget_unused(root)


def _mark_used(root: Path) -> None:
    with contextlib.suppress(OSError):  # a read-only folder (an image's) is used all the same
        os.utime(root)


def _forget_unused(root: Path) -> None:
    """Remove other fingerprints of the cache folder that no process has started on for
    `UNUSED_DAYS` (another install may still use a recent one)."""
    cutoff = time.time() - UNUSED_DAYS * 86400
    for other in root.parent.glob("static-*"):
        with contextlib.suppress(OSError):  # gone already
            if other != root and other.stat().st_mtime < cutoff:
                shutil.rmtree(other, ignore_errors=True)


def collect(target: Path) -> None:
    """What `collectstatic` does, into `target`: copy what the finders find, then hash,
    rewrite references and compress (whitenoise's post-processing)."""
    from django.conf import settings
    from django.contrib.staticfiles.finders import get_finders

    storage = CompressedManifestStaticFilesStorage(
        location=str(target), base_url=settings.STATIC_URL
    )
    found = {}
    for finder in get_finders():
        for path, source in finder.list(IGNORED):
            prefix = getattr(source, "prefix", None)
            name = os.path.join(prefix, path) if prefix else path
            if name in found:  # the first finder wins, as in collectstatic
                continue
            found[name] = (source, path)
            with source.open(path) as handle:
                storage.save(name, handle)
    for _original, _hashed, processed in storage.post_process(found, dry_run=False):
        if isinstance(processed, Exception):
            raise processed


class CollectedStaticStorage(CompressedManifestStaticFilesStorage):
    """whitenoise's hashed, compressed storage that collects its files when they are missing."""

    def __init__(self, *args, **kwargs) -> None:
        from django.conf import settings

        ensure_collected(Path(kwargs.get("location") or settings.STATIC_ROOT))
        super().__init__(*args, **kwargs)


class CollectingWhiteNoiseMiddleware(WhiteNoiseMiddleware):
    """whitenoise's middleware, once the static files are collected: it lists `STATIC_ROOT`
    when it starts, so the storage (which collects them) is set up first."""

    def __init__(self, *args, **kwargs) -> None:
        from django.contrib.staticfiles.storage import staticfiles_storage

        staticfiles_storage.location  # noqa: B018 — sets the storage up, collecting if needed
        super().__init__(*args, **kwargs)
