"""An item's trace as the item page shows it: a page of `STEPS_PER_PAGE` steps at a time,
consecutive steps of the same kind (and, for tools, the same tool) grouped into one
collapsed line ("llm × 1,200", "tool search × 2,400") that opens on its steps.

A trace of thousands of steps stays a page of a hundred: each step's row, input and output
(cut to `page_values.SHOWN_CHARS`) is rendered only on the page that holds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cobalt_app import trace_spans, trace_store
from cobalt_app.models import ItemResult, Run
from cobalt_app.page_items import Paging
from cobalt_app.page_values import shown

STEPS_PER_PAGE = 100


@dataclass
class StepGroup:
    """Consecutive steps of one kind (and tool): `count` in the whole trace, from step
    `first` (numbered from 1); `rows` are those on this page."""

    kind: str
    name: str
    first: int
    count: int
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def label(self) -> str:
        what = f"{self.kind} {self.name}" if self.kind == "tool" else self.kind
        return f"{what} × {self.count:,}"

    @property
    def partial(self) -> bool:
        """Whether some of the group's steps are on other pages."""
        return len(self.rows) < self.count

    @property
    def shown_from(self) -> int:
        return self.rows[0]["number"] if self.rows else self.first

    @property
    def shown_to(self) -> int:
        return self.rows[-1]["number"] if self.rows else self.first


@dataclass
class TracePage(Paging):
    summary: str = ""
    missing: str = ""  # why the trace was not captured ("" when it was)
    groups: list[StepGroup] = field(default_factory=list)


def item_trace(item: ItemResult, page: int = 1) -> TracePage:
    """Page `page` of the trace of an item read with `select_related("trace")`."""
    stored = trace_store.of_item(item)
    result = trace_page(stored.steps, page)
    result.missing = stored.missing
    return result


def trace_only(run: Run, item_id: int) -> ItemResult | None:
    """The run's item with its trace and none of its other values (a 5 MB output is not
    read for a page of the trace); None when the run has no such item."""
    items = ItemResult.objects.filter(run=run, id=item_id).select_related("trace")
    return items.only("id", "run_id", "trace__data", "trace__blobs", "trace__missing").first()


def trace_page(
    steps: Sequence[dict[str, Any]], page: int = 1, per_page: int = STEPS_PER_PAGE
) -> TracePage:
    """Page `page` of the trace's steps (clamped to the pages there are), grouped."""
    total = len(steps)
    pages = max(1, -(-total // per_page))
    number = min(max(1, page), pages)
    start, stop = (number - 1) * per_page, min(number * per_page, total)
    result = TracePage(
        number=number,
        per_page=per_page,
        total=total,
        summary=trace_spans.summary(steps) if steps else "",
    )
    rows = trace_spans.timeline(steps, start, stop)
    for row in rows:
        for key in ("input", "output"):
            row[key] = shown(row[key]) if row.get(key) is not None else None
            row[f"{key}_part"] = f"step-{row['number']}-{key}"  # `page_values.item_download`
    groups = iter(_runs(steps))
    group = next(groups, None)
    for row in rows:
        while group is not None and row["number"] >= group.first + group.count:
            group = next(groups, None)
        if group is None:
            break
        if not result.groups or result.groups[-1] is not group:
            result.groups.append(group)
        group.rows.append(row)
    return result


def _runs(steps: Sequence[dict[str, Any]]) -> list[StepGroup]:
    """The trace's runs of consecutive steps with the same kind (and tool name) and the same
    parent: a framework's tree (graph → node → model call) is never folded across levels."""
    groups: list[StepGroup] = []
    parents: list[Any] = []
    for number, step in enumerate(steps, 1):
        kind = step.get("kind") or "other"
        name = str(step.get("name") or "") if kind == "tool" else ""
        last = groups[-1] if groups else None
        same = last is not None and (last.kind, last.name) == (kind, name)
        if same and parents[-1] == step.get("parent"):
            last.count += 1
        else:
            groups.append(StepGroup(kind=kind, name=name, first=number, count=1))
            parents.append(step.get("parent"))
    return groups
