"""Where traces live: an `ItemTrace` row per item that produced steps or whose trace was not
captured (`missing` says why, see `traces`), its steps stored by `blob_store` (compressed;
what items share, like the system prompt in every model call's input, stored once). `write` is
the one write, from `services.record_item_outcomes`; `read` (or `of_item`, for an item read
with its trace) the one read, for the results file, the pages, the API and the evaluators of a
re-judge; `not_captured` what a run says of its items' traces. Both also link an HTTP
target's items to the traces their services export (`received.link_items`, `received.merge`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from django.db import connection
from django.db.models import Count
from django.db.models.expressions import RawSQL

from cobalt_app import blob_store, received, trace_spans
from cobalt_app.models import ItemResult, ItemTrace

ROWS_PER_STATEMENT = 190  # 950 parameters: under SQLite's oldest limit (999)


class Trace(NamedTuple):
    """An item's stored trace: its steps, and why it was not captured ("" when it was).
    `read_traces(..., as_text=True)` may leave the steps as their JSON text (a `str`)."""

    steps: list[dict[str, Any]] | str
    missing: str = ""


LINKED = '"traceId"'  # in the JSON text of a trace that a service's spans may join


def write(traces: Sequence[tuple[int, str, Any, str]]) -> None:
    """Store (or replace) items' traces, (item id, the steps' JSON text, the steps, why the
    trace was not captured) each, in the caller's transaction."""
    if not traces:
        return
    blobs: dict[str, bytes] = {}
    stored = blob_store.pack([(steps, text) for _, text, steps, _ in traces], blobs)
    blob_store.save_blobs(blobs)
    rows = [
        (item_id, *row, missing, trace_spans.estimated_usage(steps or []))
        for (item_id, _, steps, missing), row in zip(traces, stored, strict=True)
    ]
    # Raw, many rows a statement: SQLite's `executemany` gives the GIL up at every row, each
    # time waiting for it while the event loop is busy (see `bulk_sql`).
    with connection.cursor() as cursor:
        for start in range(0, len(rows), ROWS_PER_STATEMENT):
            chunk = rows[start : start + ROWS_PER_STATEMENT]
            cursor.execute(
                "INSERT INTO cobalt_app_itemtrace (item_id, data, blobs, missing, estimated) "
                "VALUES "
                + ", ".join(["(%s, %s, %s, %s, %s)"] * len(chunk))
                + " ON CONFLICT (item_id) DO UPDATE SET data = excluded.data, "
                "blobs = excluded.blobs, missing = excluded.missing, "
                "estimated = excluded.estimated",
                [value for row in chunk for value in row],
            )
    received.link_items(
        (item_id, trace_id, span_id)
        for item_id, _, steps, _ in traces
        for trace_id, span_id in received.linked_requests(steps or [])
    )


def read(item_ids: Iterable[int]) -> dict[int, list[dict[str, Any]]]:
    """The steps of these items' traces, by item id (an item without one is left out)."""
    return {item_id: trace.steps for item_id, trace in read_traces(item_ids).items()}


def read_traces(item_ids: Iterable[int] | RawSQL, *, as_text: bool = False) -> dict[int, Trace]:
    """These items' traces with why each was not captured, by item id (an item without one
    is left out). `item_ids` may be a subquery of them (`RawSQL`): a results file's chunk
    of 2,000 items as 2,000 parameters cost more to bind than to read (issue 41).
    `as_text`: the steps of a trace that no service's spans join (`received`) are left as
    their stored JSON text (one line), for a writer that puts it in its own JSON as it is:
    parsing it to encode it again was a tenth of a traced item's CPU (the results file)."""
    ids = item_ids if isinstance(item_ids, RawSQL) else list(item_ids)
    rows = list(
        ItemTrace.objects.filter(item_id__in=ids).values_list("item_id", "data", "blobs", "missing")
    )
    if not as_text:
        found = _decoded(rows)
        received.merge(found)  # the spans services exported for these items' requests
        return found
    texts = blob_store.read_texts((data, refs) for _, data, refs, _ in rows)
    found = {
        item_id: Trace(
            text if LINKED not in text and "\n" not in text else json.loads(text), missing
        )
        for (item_id, _, _, missing), text in zip(rows, texts, strict=True)
    }
    received.merge({k: t for k, t in found.items() if not isinstance(t.steps, str)})
    return found


def of_item(item: ItemResult) -> Trace:
    """The trace of an item read with `select_related("trace")` (no step when it has none)."""
    stored = getattr(item, "trace", None)
    if stored is None:
        return Trace([])
    found = _decoded([(item.id, stored.data, stored.blobs, stored.missing)])
    received.merge(found)
    return found[item.id]


def not_captured(run_id: str) -> list[dict[str, Any]]:
    """Why the run's items' traces were not captured, each reason with how many items, the
    most frequent first (empty when every trace was)."""
    rows = (
        ItemTrace.objects.filter(item__run_id=run_id)
        .exclude(missing="")
        .values_list("missing")
        .annotate(items=Count("pk"))
    )
    found = sorted(rows, key=lambda row: (-row[1], row[0]))
    return [{"why": why, "items": items} for why, items in found]


def estimated_usage(run_id: str) -> list[dict[str, Any]]:
    """The run's model calls that reported no usage (see `token_counts`), by model and how
    their tokens were found: `{"model", "method", "calls", "items"}`, the most calls first.
    Only items that have such calls are read."""
    found: dict[tuple[str, str], list[int]] = {}
    rows = ItemTrace.objects.filter(item__run_id=run_id).exclude(estimated="")
    for note in rows.values_list("estimated", flat=True):
        for entry in json.loads(note):
            counts = found.setdefault((entry["model"], entry["method"]), [0, 0])
            counts[0] += entry["calls"]
            counts[1] += 1
    return [
        {"model": model, "method": method, "calls": calls, "items": items}
        for (model, method), (calls, items) in sorted(found.items(), key=lambda e: -e[1][0])
    ]


def _decoded(rows: list[tuple[int, bytes, str, str]]) -> dict[int, Trace]:
    values = blob_store.read((data, refs) for _, data, refs, _ in rows)
    return {
        item_id: Trace(steps, missing)
        for (item_id, _, _, missing), steps in zip(rows, values, strict=True)
    }
