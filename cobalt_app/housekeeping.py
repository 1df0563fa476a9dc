"""Cleaning old results: result files and their runs in the history."""

from __future__ import annotations

import time
from datetime import timedelta

from django.utils import timezone

from cobalt import results_file
from cobalt.config import Config
from cobalt_app import liveness
from cobalt_app.models import Run


def delete_results(config: Config, *, older_than_days: float | None = None) -> tuple[int, int]:
    """Delete result files and runs (all, or those older than N days). Returns the counts."""
    cutoff_seconds = time.time() - older_than_days * 86400 if older_than_days is not None else None
    files = 0
    for path in results_file.results_files(config.results_dir):
        if cutoff_seconds is None or path.stat().st_mtime < cutoff_seconds:
            path.unlink()
            files += 1
    liveness.sweep()  # runs whose process vanished are finished too
    runs = Run.objects.filter(status__in=Run.FINISHED)
    if older_than_days is not None:
        runs = runs.filter(created_at__lt=timezone.now() - timedelta(days=older_than_days))
    deleted_runs = runs.count()
    runs.delete()
    return files, deleted_runs
