"""Where recordings live: the project's database (`Recording` rows; SQLite in
`.cobalt/history.db` embedded, the team's PostgreSQL in team mode, so every worker reads
what any of them recorded), their exchanges stored by `blob_store` (compressed; the system
prompt and tool definitions every request repeats stored once). Written (`save`) and read
(`load_experiment`) by `recordings`, listed and cleaned by `cobalt recordings`.

A recording made from a production trace (`trace_recordings`) is the item's, whichever
experiment runs it: stored under the experiment SHARED, read for every repetition (ANY)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Count, Max, Sum
from django.utils import timezone

from cobalt_app import blob_store
from cobalt_app.models import Recording

SHARED = ""  # the experiment of recordings every experiment's items replay
ANY = -1  # the repetition a SHARED recording is read as: any


def load_experiment(experiment: str) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Every recording of an experiment: (item key, repetition) → its exchanges; the SHARED
    ones as (item key, ANY)."""
    rows = list(
        Recording.objects.filter(experiment__in=[experiment, SHARED]).values_list(
            "experiment", "item_key", "run_index", "data", "blobs"
        )
    )
    exchanges = blob_store.read((data, refs) for *_, data, refs in rows)
    return {
        (row[1], row[2] if row[0] != SHARED else ANY): found
        for row, found in zip(rows, exchanges, strict=True)
    }


def save(
    *,
    experiment: str,
    item_key: str,
    run_index: int,
    exchanges: list[dict[str, Any]],
    run_id: str = "",
) -> None:
    """Store (or replace) one item's recording; safe to repeat (a redelivered item)."""
    blobs: dict[str, bytes] = {}
    ((data, refs),) = blob_store.pack([(exchanges, None)], blobs)
    with transaction.atomic():
        blob_store.save_blobs(blobs)
        Recording.objects.update_or_create(
            experiment=experiment,
            item_key=item_key,
            run_index=run_index,
            defaults={
                "data": data,
                "blobs": refs,
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
