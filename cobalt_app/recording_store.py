"""Where recordings live: the project's database (`Recording` rows; SQLite in
`.cobalt/history.db` embedded, the team's PostgreSQL in team mode, so every worker reads
what any of them recorded). Written and read by `recordings`, listed and cleaned by
`cobalt recordings`."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import Count, Max, Sum
from django.utils import timezone

from cobalt_app.models import Recording


def load_experiment(experiment: str) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Every recording of an experiment: (item key, repetition) → its exchanges."""
    rows = Recording.objects.filter(experiment=experiment).values_list(
        "item_key", "run_index", "exchanges"
    )
    return {(key, run_index): exchanges for key, run_index, exchanges in rows}


def save(
    *,
    experiment: str,
    item_key: str,
    run_index: int,
    exchanges: list[dict[str, Any]],
    run_id: str = "",
) -> None:
    """Store (or replace) one item's recording; safe to repeat (a redelivered item)."""
    Recording.objects.update_or_create(
        experiment=experiment,
        item_key=item_key,
        run_index=run_index,
        defaults={
            "exchanges": exchanges,
            "request_count": len(exchanges),
            "recorded_by": run_id,
            "recorded_at": timezone.now(),
        },
    )


def experiments_summary() -> list[dict[str, Any]]:
    """Per experiment: items recorded, requests, the newest recording."""
    return list(
        Recording.objects.values("experiment")
        .annotate(items=Count("id"), requests=Sum("request_count"), latest=Max("recorded_at"))
        .order_by("experiment")
    )


def items_of(experiment: str, limit: int = 200) -> list[dict[str, Any]]:
    """The recordings of one experiment (without their exchanges), newest first."""
    return list(
        Recording.objects.filter(experiment=experiment)
        .order_by("-recorded_at", "item_key", "run_index")
        .values("item_key", "run_index", "request_count", "recorded_by", "recorded_at")[:limit]
    )


def delete(*, older_than_seconds: float | None = None, experiment: str | None = None) -> int:
    """Delete recordings (all, one experiment's, or those recorded before a while ago)."""
    rows = Recording.objects.all()
    if experiment is not None:
        rows = rows.filter(experiment=experiment)
    if older_than_seconds is not None:
        rows = rows.filter(recorded_at__lt=timezone.now() - timedelta(seconds=older_than_seconds))
    deleted, _ = rows.delete()
    return deleted
