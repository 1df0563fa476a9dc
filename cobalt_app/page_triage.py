"""Triage of a run's items: the failures view (identical errors grouped, then the judged
failures by how many evaluators failed), a text search, filters and groups by a dataset field
or metadata key, and where an item stands in the list it was opened from.

A list is a `ListState`, carried in the query string of the run page and of each item's URL
(`/runs/<id>/items/<number>/?repeat=<n>&view=…`), so the item panel's previous/next walk the
list the person came from, with JavaScript or without, and after a reload.
"""

from __future__ import annotations

import functools
import json
import re
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django.db import connection
from django.db.models import Count, Q, QuerySet, TextField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast
from django.urls import get_script_prefix, reverse

from cobalt_app import run_figures, run_search
from cobalt_app.models import Evaluation, ItemResult, Run
from cobalt_app.page_items import ItemFilters, ItemsPage, clamp, item_order, page_of
from cobalt_app.page_selectors import pass_marks
from cobalt_app.run_memo import RunMemo
from cobalt_app.run_search import field_value
from cobalt_app.score_tables import (
    below_mark,
    failing_count,
    failing_order,
    judged_failures,
)
from cobalt_app.selectors import FAILED

MAX_GROUPS = 50
# Words with a digit (an order id, a count, a port, a date): error texts that differ only in
# them are one group of the failures view ("refund timed out for o017" and "… for o025").
ALIKE = re.compile(r"\w*\d\w*")
GROUP_ITEMS_SHOWN = 40  # item links listed under a group of identical errors
# A finished run's lists (and groups) kept in this process for the item panel's steps: j and
# k through 50,000 failures then cost a lookup, not the list's aggregation (~0.2 s at 100k
# items) on every step. Lists are kept as arrays of ids (8 bytes each).
LIST_SECONDS = 300
_lists: RunMemo[Any] = RunMemo(
    entries=300,
    max_bytes=64 * 1024 * 1024,
    size=lambda kept: kept.itemsize * len(kept) if isinstance(kept, array) else 0,
    seconds=LIST_SECONDS,
)


# The list an item is seen in ----------------------------------------------------------------


@dataclass(frozen=True)
class ListState:
    """A list of a run's items: the view, its filters and sort, a search, a field filter."""

    view: str = "failures"
    status: str = ""
    evaluator: str = ""
    min: float | None = None
    max: float | None = None
    sort: str = "index"
    q: str = ""
    key: str = ""
    value: str = ""

    @property
    def narrowed(self) -> bool:
        """Searched, or filtered by a field: only some of the run's items are in the list."""
        return bool(self.q or (self.key and self.value))

    def params(self) -> list[tuple[str, str]]:
        """The list as query parameters (what differs from the defaults, and the view)."""
        found: list[tuple[str, str]] = [("view", self.view)]
        defaults = ListState()
        for name in ("status", "evaluator", "min", "max", "sort", "q", "key", "value"):
            value = getattr(self, name)
            if value not in (None, "") and value != getattr(defaults, name):
                found.append((name, f"{value:g}" if isinstance(value, float) else value))
        return found

    def query(self) -> str:
        return urlencode(self.params())

    def filters(
        self, scope: QuerySet[ItemResult] | None = None, found: Sequence[int] | None = None
    ) -> ItemFilters:
        """What the items table lists of this list (`scope`: what its search and field filter
        leave, `item_scope`; `found`: its ids, ascending, when read: `found_ids`)."""
        return ItemFilters(self.status, self.evaluator, self.min, self.max, self.sort, scope, found)


def item_url(
    run_id: str, number: int, run_index: int = 0, params: Iterable[tuple[str, Any]] = ()
) -> str:
    """An item's address: its number as people see it (`#17`), `?repeat=N` (from 1) for
    the Nth repetition of a run with repetitions, then the list it is seen in."""
    query = [("repeat", run_index + 1)] if run_index else []
    query += [(k, v) for k, v in params if v not in (None, "")]
    url = f"{_items_path(get_script_prefix(), run_id)}{int(number)}/"
    return f"{url}?{urlencode(query)}" if query else url


@functools.lru_cache(maxsize=256)
def _items_path(script_prefix: str, run_id: str) -> str:
    """`/runs/<id>/items/`, reversed once per run (and script prefix): a list page links
    every row's item, and each `reverse()` costs ~0.1 ms of CPU (300 a compare page)."""
    return reverse("cobalt:item", args=[run_id, 0]).removesuffix("0/")


def legacy_item(run: Run, item_id: int) -> ItemResult | None:
    """The item an old address (`/items/<database id>/`) meant, when `item_id` is the id of
    one of this run's items (and no item of the run has that number)."""
    if ItemResult.objects.filter(run=run, item_index=item_id - 1).exists():
        return None
    return ItemResult.objects.filter(run=run, pk=item_id).only("item_index", "run_index").first()


@dataclass(frozen=True)
class ItemAddress:
    """An item result as an address names it: its database id, number and repetition (both
    from 1), and whether the address was an old one (by its database id)."""

    id: int
    number: int
    repeat: int
    moved: bool = False


def item_address(run: Run, number: int, repeat: int = 1) -> ItemAddress | None:
    """The item `/items/<number>/?repeat=<repeat>` names (the API's addresses, as the pages'):
    by its number; else, when no item of the run has that number, the item whose database id
    it is (an old address: `moved`); None when neither."""
    found = (
        ItemResult.objects.filter(run=run, item_index=number - 1, run_index=repeat - 1)
        .values_list("id", flat=True)
        .first()
    )
    if found is not None:
        return ItemAddress(found, number, repeat)
    old = legacy_item(run, number)
    if old is None:
        return None
    return ItemAddress(old.id, old.item_index + 1, old.run_index + 1, moved=True)


# Search and field filters -------------------------------------------------------------------


def item_scope(run: Run, state: ListState) -> QuerySet[ItemResult] | None:
    """The run's items the search and the field filter leave; None when neither is set."""
    if not state.narrowed:
        return None
    items = in_id_order(ItemResult.objects.filter(run=run))
    if state.q:
        items = items.annotate(
            input_text=Cast("input", TextField()), output_text=Cast("output", TextField())
        ).filter(_matching(run, state.q))
    if state.key and state.value:
        items = items.annotate(field_value=field_value(state.key)).filter(field_value=state.value)
    return items


def found_ids(run: Run, state: ListState) -> array | None:
    """The ids of `item_scope` (ascending), read now in one query; None when nothing narrows
    the list. A page then counts, lists, groups and finds the errors among them by id
    (`id_scope`) instead of searching the run again for each (the failures view searched
    three times). A finished run's index (`run_search`) answers without reading the run;
    without it the search reads every item and reason of the run (~80 ms of CPU at 100,000
    items on SQLite, five times that at 500,000), and a field filter every item's JSON
    (~55 ms). A finished run's ids are kept a few minutes, as its lists are: paging through
    what they found, switching views, grouping it or stepping through it in the item panel
    then costs a lookup. Read unordered: the items' default order joins each row to its run
    and sorts them."""
    if not state.narrowed:
        return None
    narrowing = ListState(q=state.q, key=state.key, value=state.value).query()

    def read() -> array:
        indexed = run_search.found_ids(run, state.q, state.key, state.value)
        if indexed is not None:
            return array("q", sorted(indexed))
        found = item_scope(run, state).order_by().values_list("id", flat=True)
        return array("q", sorted(found.iterator(chunk_size=2000)))

    return _lists.get(run, f"scope|{narrowing}", read)


def id_scope(ids: array | None) -> QuerySet[ItemResult] | None:
    """The items of `found_ids`, by id."""
    return None if ids is None else ItemResult.objects.filter(id__in=_id_list(list(ids)))


def _id_list(ids: list[int]) -> RawSQL:
    """The ids as one parameter (a JSON array on SQLite, an array on PostgreSQL), so a list of
    100k ids stays within the databases' limits on parameters."""
    if connection.vendor == "sqlite":
        return RawSQL("SELECT value FROM json_each(%s)", [json.dumps(ids)])
    return RawSQL("SELECT unnest(%s::bigint[])", [ids])


def in_id_order(rows: QuerySet) -> QuerySet:
    """The same rows, read in the order they were stored. `id >= 0` holds for every row; it
    leads SQLite to scan a run's rows by its `run` index (in id order) instead of by another
    index starting with the run, `(run, latency)` or `(run, evaluator, score)`, which visits
    them at random: at 100k items, a search or a field filter reads the run 3-4x faster
    (~190 -> ~50 ms of CPU) and a group's verdict counts 2.5x (~1.1 -> ~0.43 s)."""
    return rows.filter(id__gte=0)


def _matching(run: Run, text: str) -> Q:
    """Items whose input (the dataset item: input, expected output, fields), output, error or
    evaluation reasons contain `text`, ignoring case. JSON is searched as stored: SQLite keeps
    it with non-ASCII characters and quotes escaped, so the escaped form is searched too."""
    reasons = Evaluation.objects.filter(run=run, reason__icontains=text).values("item_id")
    found = Q(error__icontains=text) | Q(id__in=reasons)
    for form in dict.fromkeys([text, json.dumps(text)[1:-1]]):
        found |= Q(input_text__icontains=form) | Q(output_text__icontains=form)
    return found


# The failures view --------------------------------------------------------------------------


@dataclass
class ErrorGroup:
    """Items that errored or timed out with the same error text, or texts that differ only
    in numbers and ids (`varied`: "timed out for o017", "… for o025"); `error` is the first."""

    status: str
    error: str
    items: list[tuple[int, int, int]] = field(default_factory=list)  # id, number, run_index
    varied: bool = False

    @property
    def search(self) -> str:
        """What the search for the group's items looks for: its text, up to where its
        items' texts differ."""
        found = ALIKE.search(self.error) if self.varied else None
        return (self.error[: found.start()] if found else self.error).strip()

    @property
    def count(self) -> int:
        return len(self.items)

    @property
    def first(self) -> tuple[int, int, int]:
        return self.items[0]

    @property
    def shown(self) -> list[tuple[int, int, int]]:
        return self.items[:GROUP_ITEMS_SHOWN]


@dataclass
class FailuresPage(ItemsPage):
    """A page of the failures view: groups of identical errors first (each counts as one
    row), then judged failures, most failing evaluators first."""

    groups: list[ErrorGroup] = field(default_factory=list)

    @property
    def summary(self) -> str:
        if not self.total:
            return "No failures"
        return f"Failures {self.start:,}–{self.end:,} of {self.total:,} (identical errors as one)"


def error_groups(run: Run, scope: QuerySet[ItemResult] | None = None) -> list[ErrorGroup]:
    """The run's errors and timeouts, one group per status and error text (numbers and ids
    masked: `ALIKE`), the largest group
    first (then by the first item's number); items in index order. One query on the
    `(run, status)` index, sorted here: ordered in SQL, SQLite walks every item of the run in
    index order instead (its unique index gives that order), reading each wide row for its
    status — 30 ms of CPU at 50,000 items for 500 errors, ten times that at 500,000."""
    broken = ItemResult.objects.filter(run=run, status__in=FAILED)
    if scope is not None:
        broken = broken.filter(id__in=scope.values("id"))
    rows = sorted(
        broken.order_by().values_list("id", "item_index", "run_index", "status", "error"),
        key=lambda row: (row[1], row[2]),
    )
    groups: dict[tuple[str, str], ErrorGroup] = {}
    for item_id, index, run_index, status, error in rows:
        alike = (status, ALIKE.sub("#", error or ""))
        group = groups.setdefault(alike, ErrorGroup(status=status, error=error))
        group.varied = group.varied or error != group.error
        group.items.append((item_id, index + 1, run_index))
    return sorted(groups.values(), key=lambda g: (-g.count, g.first[1], g.first[2]))


def failure_page(
    run: Run,
    *,
    evaluator: str = "",
    scope: QuerySet[ItemResult] | None = None,
    page: int = 1,
    per_page: int = 50,
) -> FailuresPage:
    """A page of the failures view. Four queries: the errors, the judged failures' order
    (stored at finalisation when nothing narrows the list: of every evaluator with the score
    table, of one evaluator in `run_figures`; read whole, once, among the items a search or a
    field filter leaves; else their count and the page's ids), its rows and scores (two)."""
    groups = error_groups(run, scope)
    failing = judged_failures(run, evaluator, scope)
    if scope is not None:
        order: list[int] | None = list(failing.values_list("item_id", flat=True))
    else:
        order = run_figures.failing_order(run, evaluator) if evaluator else failing_order(run)
    if order is not None:
        total = len(groups) + len(order)
    else:
        stored = failing_count(run, evaluator)
        total = len(groups) + (failing.count() if stored is None else stored)
    number, offset = clamp(page, total, per_page)
    shown = groups[offset : offset + per_page]
    start, wanted = max(0, offset - len(groups)), per_page - len(shown)
    if order is not None:
        ids = order[start : start + wanted] if wanted else []
    else:
        ranked = failing.values_list("item_id", flat=True)
        ids = list(ranked[start : start + wanted]) if wanted else []
    judged = page_of(run, ids, number, per_page, total)
    return FailuresPage(
        rows=judged.rows, number=number, per_page=per_page, total=total, groups=shown
    )


def failure_ids(
    run: Run, evaluator: str = "", scope: QuerySet[ItemResult] | None = None
) -> list[int]:
    """Every item of the failures view, in its order (each group's items in turn)."""
    grouped = [item[0] for group in error_groups(run, scope) for item in group.items]
    order = None
    if scope is None:
        order = run_figures.failing_order(run, evaluator) if evaluator else failing_order(run)
    if order is None:
        order = list(judged_failures(run, evaluator, scope).values_list("item_id", flat=True))
    return grouped + order


# Groups by a field --------------------------------------------------------------------------


@dataclass
class GroupRow:
    value: str | None  # None: the item has no such field
    items: int
    broken: int  # errored or timed out
    rates: list[dict[str, Any]]  # per evaluator: scored, passed, errors, rate


@dataclass
class GroupTable:
    key: str
    evaluators: list[str]
    rows: list[GroupRow]
    more: int  # groups not shown (only the MAX_GROUPS largest are)


def group_table(run: Run, key: str, scope: QuerySet[ItemResult] | None = None) -> GroupTable:
    """The run's items grouped by a field's value (largest groups first), with each group's
    errors and pass rate per evaluator: the share of its scored evaluations at or above the
    pass mark (`score_tables.below_mark`, the one verdict rule). Two queries."""
    items = in_id_order(ItemResult.objects.filter(run=run)) if scope is None else scope
    counted = (
        items.annotate(group=field_value(key))
        .values("group")
        .annotate(n=Count("id"), broken=Count("id", filter=Q(status__in=FAILED)))
        .order_by("-n", "group")
    )
    found = list(counted[: MAX_GROUPS + 1])
    shown = found[:MAX_GROUPS]
    names = run.evaluator_names
    verdicts = in_id_order(Evaluation.objects.filter(run=run))
    if scope is not None:
        verdicts = verdicts.filter(item_id__in=scope.values("id"))
    ok = Q(status=Evaluation.Status.OK)
    verdicts = verdicts.annotate(group=field_value(key, "item__"))
    if len(found) > MAX_GROUPS:  # only the groups shown (each row reads its field again)
        verdicts = verdicts.filter(
            Q(group__in=[row["group"] for row in shown]) | Q(group__isnull=True)
        )
    counts = verdicts.values("group", "evaluator").annotate(
        scored=Count("id", filter=ok & Q(score__isnull=False)),
        failed=Count("id", filter=ok & below_mark(pass_marks(run), names)),
        errors=Count("id", filter=~ok | Q(score__isnull=True)),
    )
    by_group = {(row["group"], row["evaluator"]): row for row in counts}
    rows = []
    for row in shown:
        rates = []
        for name in names:
            got = by_group.get((row["group"], name), {"scored": 0, "failed": 0, "errors": 0})
            scored, passed = got["scored"], got["scored"] - got["failed"]
            rate = passed / scored if scored else None
            rates.append({"name": name, **got, "passed": passed, "rate": rate})
        rows.append(GroupRow(row["group"], row["n"], row["broken"], rates))
    more = max(0, len(found) - MAX_GROUPS)
    return GroupTable(key=key, evaluators=names, rows=rows, more=more)


def run_groups(
    run: Run, key: str, state: ListState, scope: QuerySet[ItemResult] | None
) -> GroupTable:
    """`group_table` of the items `state` narrows to (`scope`), kept a few minutes for a
    finished run, whose items and verdicts no longer change: grouping 100k items costs about
    half a second of CPU on SQLite; going back to the grouped list then costs a lookup."""
    narrowing = ListState(q=state.q, key=state.key, value=state.value).query()
    return _lists.get(run, f"groups|{key}|{narrowing}", lambda: group_table(run, key, scope))


# Where an item stands in its list -----------------------------------------------------------


@dataclass
class Place:
    """An item's place in the list it was opened from: "3 of 31", its neighbours and the next
    failure after it, each as `(number, run_index)`."""

    position: int  # from 1; 0 when the item is not in the list
    total: int
    previous: tuple[int, int] | None = None
    next: tuple[int, int] | None = None
    next_failure: tuple[int, int] | None = None


def list_ids(run: Run, state: ListState, scope: QuerySet[ItemResult] | None) -> list[int]:
    """Every item of the list, in its order."""
    if state.view == "failures":
        return failure_ids(run, state.evaluator, scope)
    _, ids_from = item_order(run, state.filters(scope))  # the ids only: no count
    return ids_from(0, None)


def item_place(run: Run, item: ItemResult, state: ListState | None) -> Place:
    """Where the item stands in the list `state` names (None: all items by number). The list's
    ids are read whole (ids only: 100k of them in tens of milliseconds), then the neighbours'
    numbers in one query."""
    if state is None:
        return _numbered_place(run, item)
    item_id = item.id
    scope = id_scope(found_ids(run, state))
    ids = _lists.get(run, state.query(), lambda: array("q", list_ids(run, state, scope)))
    try:  # one scan of the list, not two
        position = ids.index(item_id) + 1
    except ValueError:
        position = 0
    previous = ids[position - 2] if position > 1 else None
    following = ids[position:]  # after the item; the whole list when it is not in it
    upcoming = following[0] if following else None
    if state.view == "failures":
        next_failure = upcoming
    else:
        narrowing = ListState(view="failures", q=state.q, key=state.key, value=state.value)
        failures = narrowing.query()
        failing = set(_lists.get(run, failures, lambda: array("q", failure_ids(run, "", scope))))
        next_failure = next((i for i in following if i in failing), None)
    wanted = [i for i in (previous, upcoming, next_failure) if i is not None]
    numbers = {
        pk: (index + 1, run_index)
        for pk, index, run_index in ItemResult.objects.filter(id__in=wanted).values_list(
            "id", "item_index", "run_index"
        )
    }
    return Place(
        position=position,
        total=len(ids),
        previous=numbers.get(previous),
        next=numbers.get(upcoming),
        next_failure=numbers.get(next_failure),
    )


def _numbered_place(run: Run, item: ItemResult) -> Place:
    """An item of a run whose items ran once, among all of them by number: its neighbours are
    the numbers beside its own (one count; no list to read)."""
    total = ItemResult.objects.filter(run=run).count()
    number = item.item_index + 1
    return Place(
        position=number,
        total=total,
        previous=(number - 1, 0) if number > 1 else None,
        next=(number + 1, 0) if number < total else None,
    )
