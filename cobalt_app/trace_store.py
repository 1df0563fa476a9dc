"""Where traces live: an `ItemTrace` row per item that produced steps, its steps stored by
`blob_store` (compressed; what items share, like the system prompt in every model call's
input, stored once). `write` is the one write, from `services.record_item_outcomes`; `read`
(or `of_item`, for an item read with its trace) the one read, for the results file, the
pages, the API and the evaluators of a re-judge."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connection

from cobalt_app import blob_store
from cobalt_app.models import ItemResult, ItemTrace

ROWS_PER_STATEMENT = 300  # 900 parameters: under SQLite's oldest limit (999)


def write(traces: Sequence[tuple[int, str, Any]]) -> None:
    """Store (or replace) items' traces, (item id, the steps' JSON text, the steps) each, in
    the caller's transaction."""
    if not traces:
        return
    blobs: dict[str, bytes] = {}
    stored = blob_store.pack([(steps, text) for _, text, steps in traces], blobs)
    blob_store.save_blobs(blobs)
    rows = [(item_id, *row) for (item_id, _, _), row in zip(traces, stored, strict=True)]
    # Raw, many rows a statement: SQLite's `executemany` gives the GIL up at every row, each
    # time waiting for it while the event loop is busy (see `bulk_sql`).
    with connection.cursor() as cursor:
        for start in range(0, len(rows), ROWS_PER_STATEMENT):
            chunk = rows[start : start + ROWS_PER_STATEMENT]
            cursor.execute(
                "INSERT INTO cobalt_app_itemtrace (item_id, data, blobs) VALUES "
                + ", ".join(["(%s, %s, %s)"] * len(chunk))
                + " ON CONFLICT (item_id) DO UPDATE SET data = excluded.data, "
                "blobs = excluded.blobs",
                [value for row in chunk for value in row],
            )


def read(item_ids: Iterable[int]) -> dict[int, list[dict[str, Any]]]:
    """The steps of these items' traces, by item id (an item without one is left out)."""
    rows = ItemTrace.objects.filter(item_id__in=list(item_ids))
    return _decoded(list(rows.values_list("item_id", "data", "blobs")))


def of_item(item: ItemResult) -> list[dict[str, Any]]:
    """The steps of an item read with `select_related("trace")` ([] when it has none)."""
    stored = getattr(item, "trace", None)
    if stored is None:
        return []
    return _decoded([(item.id, stored.data, stored.blobs)])[item.id]


def _decoded(rows: list[tuple[int, bytes, str]]) -> dict[int, list[dict[str, Any]]]:
    values = blob_store.read((data, refs) for _, data, refs in rows)
    return {item_id: steps for (item_id, _, _), steps in zip(rows, values, strict=True)}
