"""Production traces (received traces no item's request started): the reads behind
`cobalt traces list|show`, the traces page and the API, and turning them into tests.

`to_dataset` appends each chosen trace to a JSON Lines dataset of the project as an item: its
input and output from the root span (the OpenTelemetry GenAI conventions' `gen_ai.input.messages`
/ `gen_ai.output.messages`, the user's last message and the answer's text; else OpenInference's
`input.value` / `output.value`), the output as `expected_output`, the trace attached (`trace`:
its steps) and where it came from in `metadata`. A trace whose id the file already holds is
skipped, said in the answer. A trace that holds its model calls' messages also gives its item a
recording (`trace_recordings`), so `cobalt run --replay` runs the item offline. `clean` removes
production traces past their retention.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from cobalt.config import active_config
from cobalt.dataset import Dataset, DatasetError
from cobalt.errors import CobaltError, NotFoundError
from cobalt_app import label_datasets, received, recording_store, storable, trace_recordings
from cobalt_app.models import ReceivedTrace

STATUSES = ("ok", "error")
ID_PREFIX = "trace-"


class TraceFilterError(CobaltError):
    """A filter that cannot be read (a status, an attribute)."""


def traces(
    *,
    service: str | None = None,
    status: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    attributes: Sequence[str] = (),
) -> QuerySet[ReceivedTrace]:
    """Production traces, newest first, narrowed by service, status, when they started and
    root-span attributes (`key=value` each, compared as text)."""
    found = received.production_traces().filter(span_count__gt=0)
    if service:
        found = found.filter(service=service)
    if status:
        if status not in STATUSES:
            raise TraceFilterError(f"status: {status!r} is not one of {', '.join(STATUSES)}")
        found = found.filter(status=status)
    if since:
        found = found.filter(start_ns__gte=int(since.timestamp() * 1e9))
    if until:
        found = found.filter(start_ns__lt=int(until.timestamp() * 1e9))
    for given in attributes:
        key, sep, value = given.partition("=")
        if not sep or not key.strip():
            raise TraceFilterError(f"attribute: {given!r} must be written key=value")
        found = found.filter(_attribute_is(key.strip(), value))
    return found


def _attribute_is(key: str, value: str) -> Q:
    """The root span's attribute `key` equals `value` (a number or flag as its text too)."""
    options = Q(**{f"attributes__{key}": value})
    for parsed in (_number(value), {"true": True, "false": False}.get(value)):
        if parsed is not None:
            options |= Q(**{f"attributes__{key}": parsed})
    return options


def _number(text: str) -> int | float | None:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return None


def get(trace_id: str) -> ReceivedTrace:
    """A received trace by its id or the id's first characters (at least 6)."""
    trace_id = (trace_id or "").strip().lower()
    if len(trace_id) < 6:
        raise NotFoundError(f"trace {trace_id!r}: give at least 6 characters of its id")
    matches = list(ReceivedTrace.objects.filter(trace_id__startswith=trace_id)[:2])
    if not matches:
        raise NotFoundError(f"no received trace {trace_id!r} (`cobalt traces list` shows them)")
    if len(matches) > 1:
        raise NotFoundError(f"trace {trace_id!r} is ambiguous: give more of its id")
    return matches[0]


def since_ago(age: str) -> datetime:
    """`30m`, `12h`, `7d` ago."""
    units = {"m": 60, "h": 3600, "d": 86400}
    text = (age or "").strip().lower()
    if len(text) < 2 or text[-1] not in units or not text[:-1].isdigit():
        raise TraceFilterError(f"since: {age!r} must be an age such as 30m, 12h or 7d")
    return timezone.now() - timedelta(seconds=int(text[:-1]) * units[text[-1]])


def item_of(trace: ReceivedTrace, steps: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The dataset item a production trace becomes (`steps`: its steps, when read already)."""
    if steps is None:
        steps = received.steps_of_trace(trace)
    metadata = {
        "source": "production",
        "traceId": trace.trace_id,
        "service": trace.service,
        "span": trace.name,
        "startedAt": trace.started_at.isoformat() if trace.started_at else None,
    }
    return {
        "id": ID_PREFIX + trace.trace_id[:16],
        "input": _text_of(trace.input, role="user"),
        "expected_output": _text_of(trace.output, role="assistant"),
        "trace": [{k: v for k, v in s.items() if k != "messages"} for s in steps],
        "metadata": metadata,
    }


def _text_of(stored: str, *, role: str) -> Any:
    """GenAI messages as their last `role` message's text; other JSON as its value."""
    if not stored:
        return None
    try:
        value = json.loads(stored)
    except ValueError:
        return stored
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        said = [m for m in value if m.get("role") in (role, None)] or value
        return _content(said[-1])
    return value


def _content(message: dict[str, Any]) -> Any:
    if isinstance(message.get("content"), str):
        return message["content"]
    parts = message.get("parts") or message.get("content") or []
    texts = [p.get("content") or p.get("text") for p in parts if isinstance(p, dict)]
    texts = [t for t in texts if isinstance(t, str)]
    return "\n".join(texts) if texts else message


def to_dataset(trace_ids: Sequence[str], path: str) -> dict[str, Any]:
    """Append these traces to the project's JSON Lines dataset `path` (made when missing)."""
    chosen = [get(t) for t in trace_ids]
    if not chosen:
        raise TraceFilterError("choose at least one trace")
    linked = [t.trace_id for t in chosen if t.item_id is not None]
    if linked:
        raise TraceFilterError(f"trace {linked[0]} is an item's trace, not a production one")
    project = active_config().project_dir.resolve()
    target = label_datasets.dataset_path(path, project)
    shown = target.relative_to(project).as_posix()
    target.parent.mkdir(parents=True, exist_ok=True)
    added, skipped, recorded = [], [], []
    with label_datasets.locked(target) as fh:
        fh.seek(0)
        existing = fh.read().decode("utf-8-sig", errors="replace")
        keys = _keys(existing, target, shown)
        if existing and not existing.endswith("\n"):
            fh.write(b"\n")
        for trace in chosen:
            steps = received.steps_of_trace(trace)
            item = item_of(trace, steps)
            if item["id"] in keys:
                skipped.append(item["id"])
                continue
            keys.add(item["id"])
            fh.write((storable.dumps_at(item, "item") + "\n").encode("utf-8"))
            added.append(item["id"])
            exchanges = trace_recordings.exchanges_of(steps)
            if exchanges:
                recording_store.save(
                    experiment=recording_store.SHARED,
                    item_key=item["id"],
                    run_index=0,
                    exchanges=exchanges,
                )
                recorded.append(item["id"])
    return {"file": shown, "added": added, "skipped": skipped, "recorded": recorded}


def _keys(existing: str, target: Any, shown: str) -> set[str]:
    if not existing.strip():
        return set()
    try:
        return set(Dataset.from_jsonl(target).keys())
    except DatasetError as exc:
        where = f"{shown}, line {exc.line}" if exc.line else shown
        raise label_datasets.DatasetRefused(f"file: {where}: {exc.reason}") from None


def expired(older_than: timedelta) -> QuerySet[ReceivedTrace]:
    """Production traces received before `older_than` ago."""
    return received.production_traces().filter(received_at__lt=timezone.now() - older_than)


def clean(older_than: timedelta) -> int:
    """Delete production traces received before `older_than` ago (with their spans); how many."""
    _, by_model = expired(older_than).delete()
    return by_model.get("cobalt_app.ReceivedTrace", 0)


def services() -> list[str]:
    """The services that sent production traces (for the page's filter)."""
    names = received.production_traces().exclude(service="").values_list("service", flat=True)
    return sorted(set(names.order_by()[:10_000]))
