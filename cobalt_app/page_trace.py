"""An item's trace as the item page shows it: a page of `STEPS_PER_PAGE` steps at a time, as
a collapsible tree (a step inside its parent span's `<details>`), consecutive steps of the
same kind (and, for tools, the same tool) under the same parent grouped into one collapsed
line ("llm × 1,200", "tool search × 2,400") that opens on its steps.

Each step shows its offset from the item's start and its duration, its messages or call
(`trace_messages`), and its branch's tokens and cost; the step where the item failed is
marked and open. A trace of thousands of steps stays a page of a hundred: each step's row,
input and output (cut to `page_values.SHOWN_CHARS`) is rendered only on the page that holds
it, and the template walks one flat list (no recursion): each row says which lists it opens
and closes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cobalt_app import trace_messages, trace_spans, trace_store
from cobalt_app.models import ItemResult, Run
from cobalt_app.page_items import Paging
from cobalt_app.page_values import SHOWN_CHARS, shown

STEPS_PER_PAGE = 100
MAX_DEPTH = 20  # of the parent walk: a stored trace's parents are trusted to end, not to loop
OPEN_LEVELS = 2  # branches open on load down to this many levels: a root and its children


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
    total_ms: float = 0.0  # from the item's start to the end of its last step
    rows: list[dict[str, Any]] = field(default_factory=list)
    failed: int | None = None  # the number of the step where the item failed
    failed_page: int | None = None


def item_trace(item: ItemResult, page: int = 1) -> TracePage:
    """Page `page` of the trace of an item read with `select_related("trace")`."""
    stored = trace_store.of_item(item)
    result = trace_page(stored.steps, page, item_error=getattr(item, "error", "") or "")
    result.missing = stored.missing
    return result


def trace_only(run: Run, item_id: int) -> ItemResult | None:
    """The run's item with its trace and none of its other values (a 5 MB output is not
    read for a page of the trace); None when the run has no such item."""
    items = ItemResult.objects.filter(run=run, id=item_id).select_related("trace")
    fields = ("id", "run_id", "error", "trace__data", "trace__blobs", "trace__missing")
    return items.only(*fields).first()


def trace_page(
    steps: Sequence[dict[str, Any]],
    page: int = 1,
    per_page: int = STEPS_PER_PAGE,
    *,
    item_error: str = "",
) -> TracePage:
    """Page `page` of the trace's steps (clamped to the pages there are), as a tree."""
    total = len(steps)
    pages = max(1, -(-total // per_page))
    number = min(max(1, page), pages)
    start, stop = (number - 1) * per_page, min(number * per_page, total)
    result = TracePage(
        number=number,
        per_page=per_page,
        total=total,
        summary=trace_spans.summary(steps) if steps else "",
        total_ms=trace_spans.total_ms(steps),
    )
    failed = trace_spans.failing_step(steps, item_error)
    if failed is not None:
        result.failed, result.failed_page = failed + 1, failed // per_page + 1
    rows = trace_spans.timeline(steps, start, stop)
    totals = trace_spans.branch_usage(steps)
    for row in rows:
        index = row["number"] - 1
        row["branch_tokens"], row["branch_cost"] = totals[index]
        row["view"] = trace_messages.view(_page_cut(row))
        row["failed_here"] = index == failed
        if index == failed and not row.get("error"):
            row["error"] = item_error  # the step before the item's error: that error
        for key in ("input", "output"):
            row[key] = shown(row[key]) if row.get(key) is not None else None
            row[f"{key}_part"] = f"step-{row['number']}-{key}"  # `page_values.item_download`
    _nest(rows, steps, _groups(rows, steps), failed)
    result.rows = rows
    return result


def _page_cut(row: dict[str, Any]) -> dict[str, Any]:
    """The step with its input and output cut as the page cuts them (`SHOWN_CHARS`)."""
    cut = {}
    for key in ("input", "output"):
        text = row.get(key)
        if isinstance(text, str) and len(text) > SHOWN_CHARS:
            cut[key] = text[:SHOWN_CHARS] + trace_messages.CUT
    return {**row, **cut} if cut else row


def _groups(rows: list[dict[str, Any]], steps: Sequence[dict[str, Any]]) -> list[StepGroup | None]:
    """The group (of more than one step) each row of the page belongs to, or None."""
    found: list[StepGroup | None] = []
    groups = iter(_runs(steps))
    group = next(groups, None)
    for row in rows:
        while group is not None and row["number"] >= group.first + group.count:
            group = next(groups, None)
        if group is not None and group.count > 1:
            group.rows.append(row)
            found.append(group)
        else:
            found.append(None)
    return found


def _nest(
    rows: list[dict[str, Any]],
    steps: Sequence[dict[str, Any]],
    groups: list[StepGroup | None],
    failed: int | None,
) -> None:
    """Give each row what the template opens and closes around it: `group_open` (a group's
    line opens before the row), `has_children` (the row's list of children opens after it)
    and `closes` (after the row: for each list that ends, whether it held children).

    A row goes inside its parent's list when the parent is open on this page, else at the
    page's top level (its parent is on an earlier page)."""
    stack: list[tuple[str, Any, dict[str, Any] | None]] = []  # (kind, key, its row)
    previous: dict[str, Any] | None = None
    opened = _failing_branch(steps, failed)
    for row, group in zip(rows, groups, strict=True):
        index = row["number"] - 1
        row.update(group_open=None, has_children=False, closes=[], open=index in opened)
        parent = steps[index].get("parent")
        if group is not None and any(k == ("group", group.first) for k in _keys(stack)):
            target: tuple[str, Any] | None = ("group", group.first)
        else:
            target = ("row", parent) if ("row", parent) in _keys(stack) else None
        closes = []
        while stack and (target is None or (stack[-1][0], stack[-1][1]) != target):
            kind, _, closed = stack.pop()
            closes.append(kind == "group" or bool(closed and closed["has_children"]))
        if previous is not None:
            previous["closes"] = closes
        if stack and stack[-1][0] == "row":
            stack[-1][2]["has_children"] = True
        if group is not None and target != ("group", group.first):
            row["group_open"] = group
            row["group_is_open"] = failed is not None and group.first - 1 <= failed < (
                group.first - 1 + group.count
            )
            stack.append(("group", group.first, None))
        stack.append(("row", index, row))
        previous = row
    if previous is not None:
        previous["closes"] = [
            kind == "group" or bool(r and r["has_children"]) for kind, _, r in reversed(stack)
        ]
    for row in rows:  # the first levels' branches open: a request span alone hides the trace
        if row["has_children"] and _depth(steps, row["number"] - 1) < OPEN_LEVELS:
            row["open"] = True


def _keys(stack: list[tuple[str, Any, Any]]) -> list[tuple[str, Any]]:
    return [(kind, key) for kind, key, _ in stack]


def _depth(steps: Sequence[dict[str, Any]], index: int) -> int:
    """How many ancestors the step has (0 for a root), counting up to `MAX_DEPTH`."""
    depth = 0
    parent = steps[index].get("parent")
    while parent is not None and 0 <= parent < len(steps) and depth < MAX_DEPTH:
        depth += 1
        parent = steps[parent].get("parent")
    return depth


def _failing_branch(steps: Sequence[dict[str, Any]], failed: int | None) -> set[int]:
    """The failing step and its ancestors: opened on the page."""
    found: set[int] = set()
    index = failed
    while index is not None and 0 <= index < len(steps) and len(found) < MAX_DEPTH:
        found.add(index)
        index = steps[index].get("parent")
    return found


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
