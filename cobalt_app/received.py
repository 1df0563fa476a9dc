"""Received traces (`ReceivedTrace`, `ReceivedSpan`): the one write of what the OTLP receiver
decoded (`otlp`), how those traces join items, and the reads of production traces.

A trace whose id an HTTP target's request carried (`cobalt.http_call`) is linked to its item by
`link_items` when the item's result is written (`trace_store.write`); the spans join the item's
trace whenever they arrive, before or after it finished (`merge`, at read time): no late span is
refused. Any other trace is a production trace (`production_traces`), until its retention.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from django.db import transaction

from cobalt_app import trace_spans
from cobalt_app.models import ReceivedSpan, ReceivedTrace
from cobalt_app.storable import process_secrets

TEXT_LIMIT = 100_000  # characters of a trace's input, output and attributes kept
ROOT_ATTRIBUTES = 50  # the root span's attributes kept on its trace (filters, datasets)
INPUT_KEYS = ("gen_ai.input.messages", "input.value", "cobalt.input", "gen_ai.prompt")
OUTPUT_KEYS = ("gen_ai.output.messages", "output.value", "cobalt.output", "gen_ai.completion")


class Received(NamedTuple):
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    service: str
    step: dict[str, Any]
    attributes: dict[str, Any]


def ingest(spans: Sequence[Received]) -> None:
    """Store received spans (a span received twice is kept once)."""
    if not spans:
        return
    by_trace: dict[str, list[Received]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    with transaction.atomic():
        ReceivedTrace.objects.bulk_create(
            [ReceivedTrace(trace_id=trace_id) for trace_id in by_trace], ignore_conflicts=True
        )
        traces = {t.trace_id: t for t in ReceivedTrace.objects.filter(trace_id__in=list(by_trace))}
        ReceivedSpan.objects.bulk_create(
            [
                ReceivedSpan(
                    trace_id=traces[s.trace_id].pk,
                    span_id=s.span_id,
                    parent_span_id=s.parent_span_id,
                    start_ns=s.start_ns,
                    step=s.step,
                )
                for s in spans
            ],
            ignore_conflicts=True,
        )
        for trace_id, members in by_trace.items():
            _summarise(traces[trace_id], members)


def _summarise(trace: ReceivedTrace, spans: Sequence[Received]) -> None:
    """Fold a batch's spans into their trace's row: counts, times, status, the root's facts."""
    start = min(s.start_ns for s in spans)
    end = max(s.end_ns for s in spans)
    if trace.started_at is not None:
        old_start = int(trace.started_at.timestamp() * 1e9)
        end = max(end, old_start + int((trace.duration_ms or 0) * 1e6))
        start = min(start, old_start)
    trace.started_at = datetime.fromtimestamp(start / 1e9, tz=UTC)
    trace.duration_ms = round((end - start) / 1e6, 3)
    trace.span_count += len(spans)
    if any(s.step["status"] == "error" for s in spans):
        trace.status = "error"
    for span in spans:
        if span.service and not trace.service:
            trace.service = span.service
        if not span.parent_span_id:
            _root(trace, span)
    if not trace.input:  # a web framework's root span around the agent's: the agent's
        agents = [s for s in spans if s.step["kind"] == "agent" and _said(s.attributes)[0]]
        if agents:
            _input_output(trace, min(agents, key=lambda s: s.start_ns))
    trace.save()


def _said(a: dict[str, Any]) -> tuple[Any, Any]:
    given_input = next((a[k] for k in INPUT_KEYS if a.get(k) not in (None, "")), None)
    given_output = next((a[k] for k in OUTPUT_KEYS if a.get(k) not in (None, "")), None)
    return given_input, given_output


def _input_output(trace: ReceivedTrace, span: Received) -> None:
    given_input, given_output = _said(span.attributes)
    if given_input is not None:
        trace.input = trace_spans.shown(given_input, TEXT_LIMIT, process_secrets()) or ""
    if given_output is not None:
        trace.output = trace_spans.shown(given_output, TEXT_LIMIT, process_secrets()) or ""


def _root(trace: ReceivedTrace, span: Received) -> None:
    """The root span's name, attributes, and input and output when it says them."""
    trace.name = span.step["name"][:500]
    _input_output(trace, span)
    kept = dict(list(span.attributes.items())[:ROOT_ATTRIBUTES])
    shown = trace_spans.shown(kept, TEXT_LIMIT, process_secrets())
    trace.attributes = json.loads(shown or "{}")


def link_items(links: Iterable[tuple[int, str]]) -> None:
    """Items' trace ids (from their HTTP target calls): those traces are the items' (their
    rows made now when no span has arrived yet)."""
    pairs = {trace_id: item_id for item_id, trace_id in links}
    if not pairs:
        return
    ReceivedTrace.objects.bulk_create(
        [ReceivedTrace(trace_id=t, item_id=i) for t, i in pairs.items()], ignore_conflicts=True
    )
    for trace_id, item_id in pairs.items():
        ReceivedTrace.objects.filter(trace_id=trace_id).exclude(item_id=item_id).update(
            item_id=item_id
        )


def linked_trace_ids(steps: Sequence[dict[str, Any]]) -> list[str]:
    return [s["traceId"] for s in steps if s.get("traceId")]


def merge(traces: dict[int, Any]) -> None:
    """Put the spans services exported for these items into their steps (in place): each
    service's tree under the client step whose request carried its trace id."""
    wanted = {item_id for item_id, trace in traces.items() if linked_trace_ids(trace.steps)}
    if not wanted:
        return
    received = ReceivedSpan.objects.filter(trace__item_id__in=wanted).values_list(
        "trace__item_id", "trace__trace_id", "span_id", "parent_span_id", "start_ns", "step"
    )
    by_item: dict[int, list[tuple]] = {}
    for row in received:
        by_item.setdefault(row[0], []).append(row[1:])
    for item_id, rows in by_item.items():
        _merge_steps(traces[item_id].steps, rows)


def _merge_steps(steps: list[dict[str, Any]], rows: list[tuple]) -> None:
    clients = {(s["traceId"], s.get("spanId")): i for i, s in enumerate(steps) if s.get("traceId")}
    origins = {
        s["traceId"]: s.get("startUnixMs", 0) - s["startMs"] for s in steps if s.get("traceId")
    }
    rows = sorted(rows, key=lambda r: r[3])
    rows = tree_order(rows, span=lambda r: (r[0], r[1]), parent=lambda r: (r[0], r[2]))
    base = len(steps)
    index_of = {(r[0], r[1]): base + n for n, r in enumerate(rows)}
    for trace_id, _span_id, parent_id, start_ns, step in rows:
        step = dict(step)
        step["startMs"] = round(start_ns / 1e6 - origins.get(trace_id, 0), 3)
        parent = index_of.get((trace_id, parent_id))
        if parent is None:
            parent = clients.get((trace_id, parent_id))
        step["parent"] = parent
        steps.append(step)


def tree_order(rows: list[Any], *, span: Any, parent: Any) -> list[Any]:
    """Rows (in start order) with every parent before its children, siblings by start: clocks
    of a millisecond's precision (JavaScript's) may start a child "before" its parent."""
    known = {span(row) for row in rows}
    children: dict[Any, list[Any]] = {}
    roots = []
    for row in rows:
        if parent(row) in known and parent(row) != span(row):
            children.setdefault(parent(row), []).append(row)
        else:
            roots.append(row)
    ordered: list[Any] = []
    pending = list(reversed(roots))
    while pending:
        row = pending.pop()
        ordered.append(row)
        pending.extend(reversed(children.pop(span(row), [])))
    if len(ordered) < len(rows):  # a cycle of parents (a broken exporter): kept, at the end
        placed = {id(row) for row in ordered}
        ordered.extend(row for row in rows if id(row) not in placed)
    return ordered


def production_traces() -> Any:
    """Received traces no item's request started (a queryset, newest first)."""
    return ReceivedTrace.objects.filter(item__isnull=True).order_by("-received_at", "-id")


def steps_of_trace(trace: ReceivedTrace) -> list[dict[str, Any]]:
    """A received trace's spans as steps in start order (times from its first span)."""
    rows = list(
        trace.spans.order_by("start_ns").values_list(
            "span_id", "parent_span_id", "start_ns", "step"
        )
    )
    if not rows:
        return []
    origin = rows[0][2]
    rows = tree_order(rows, span=lambda r: r[0], parent=lambda r: r[1])
    index_of = {row[0]: n for n, row in enumerate(rows)}
    steps = []
    for _span_id, parent_id, start_ns, step in rows:
        step = dict(step)
        step["startMs"] = round((start_ns - origin) / 1e6, 3)
        step["parent"] = index_of.get(parent_id)
        steps.append(step)
    return steps
