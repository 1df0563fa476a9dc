"""Reads behind a run's items: the items table (filtered, sorted and paginated on the
server), the item panel, and flaky marks (the failures view is `page_triage`'s).

Pages of items find their ids with narrow queries on indexed columns, then load only those
rows: sorting 50k wide rows (inputs and outputs) would cost more than the whole page.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db.models import F, FilteredRelation, Q, QuerySet

from cobalt.verdict import Verdict, evaluation_verdict
from cobalt_app.flaky import HISTORY_RUNS, ItemFlakiness, item_flakiness, observations
from cobalt_app.models import Evaluation, ItemResult, Run
from cobalt_app.page_selectors import pass_marks
from cobalt_app.page_values import ordered_verdicts

TEXT_PREVIEW = 160
ITEM_SORTS = {
    "index": ("item_index", "run_index"),
    "latency": ("latency_ms",),
    "tokens": ("tokens",),
}


# Items table --------------------------------------------------------------------------------


@dataclass
class ItemRow:
    id: int
    number: int  # for people: 1-based, as in the terminal (`item_index` + 1)
    run_index: int
    key: str
    status: str
    input: str
    output: str
    latency_ms: float | None
    tokens: int
    error: str
    scores: list[dict[str, Any]] = field(default_factory=list)
    # An item run several times (`--runs K`): every repetition, and per evaluator the mean,
    # stddev and how many repetitions passed (pass@k: at least one did).
    repetitions: list[ItemRow] = field(default_factory=list)
    summary: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failed_count(self) -> int:
        """How many evaluators failed it (or errored on it)."""
        return sum(1 for s in self.scores if s.get("verdict") in ("fail", "error"))

    @property
    def why(self) -> str:
        """Why the item failed: its error, else each failing evaluator with its reason."""
        if self.error:
            return self.error
        if self.status not in (ItemResult.Status.OK, ItemResult.Status.PENDING):
            return self.status
        failing = [s for s in self.scores if s.get("verdict") in ("fail", "error")]
        return preview(
            "; ".join(f"{s['name']}: {s.get('reason') or s.get('error') or ''}" for s in failing)
        )


@dataclass
class Paging:
    """Where a page of `total` rows is, `per_page` at a time (numbered from 1)."""

    number: int
    per_page: int
    total: int

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.per_page))

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def has_next(self) -> bool:
        return self.number < self.pages

    @property
    def start(self) -> int:
        return (self.number - 1) * self.per_page + 1 if self.total else 0

    @property
    def end(self) -> int:
        return min(self.total, self.number * self.per_page)


@dataclass
class ItemsPage(Paging):
    rows: list[ItemRow] = field(default_factory=list)

    @property
    def summary(self) -> str:
        if not self.total:
            return "No items"
        return f"Items {self.start:,}–{self.end:,} of {self.total:,}"


ROW_FIELDS = (
    "id",
    "item_index",
    "run_index",
    "item_key",
    "status",
    "input",
    "output",
    "latency_ms",
    "tokens",
    "error",
)


@dataclass(frozen=True)
class ItemFilters:
    """Which of a run's items a list shows, and in which order: a status, one evaluator's
    score range, a sort (`index`, `latency`, `tokens` or `score:<evaluator>`; `-` first for
    descending), and `scope`: only these items, as a search or a field filter narrows them."""

    status: str = ""
    evaluator: str = ""
    min_score: float | None = None
    max_score: float | None = None
    sort: str = "index"
    scope: QuerySet[ItemResult] | None = None
    found: Sequence[int] | None = None  # the scope's ids in ascending order, when read

    @property
    def by_found_ids(self) -> bool:
        """Whether the list is the scope's ids as read, in index order (or reversed):
        nothing else narrows or sorts it."""
        narrowed = self.status or self.ranged
        return self.found is not None and not narrowed and self.sort.lstrip("-") == "index"

    @property
    def ranged(self) -> bool:
        """Whether an evaluator's score range narrows the list."""
        return bool(self.evaluator) and (self.min_score is not None or self.max_score is not None)

    @property
    def everything(self) -> bool:
        """Whether the list is all the run's items by index."""
        return not self.status and not self.ranged and self.sort == "index" and self.scope is None


def item_page(
    run: Run, filters: ItemFilters = ItemFilters(), *, page: int = 1, per_page: int = 50
) -> ItemsPage:
    """One page of a run's items with their scores.

    The page's ids are found with a narrow query on indexed columns, then only those rows are
    loaded: sorting 50k wide rows (inputs and outputs) would cost more than the whole page.
    Score filters and score sorts read the `(run, evaluator, score)` index.
    """
    count, ids_from = item_order(run, filters)
    total = count()
    number, offset = clamp(page, total, per_page)
    return page_of(run, ids_from(offset, per_page), number, per_page, total)


def item_order(
    run: Run, filters: ItemFilters, column: str = "id"
) -> tuple[Callable[[], int], Callable[[int, int | None], list[int]]]:
    """The items table's rule, the one every list of a run's items follows: a function
    counting the rows it lists, and one giving `limit` of their `column` from `offset` in its
    order (all of them with `limit=None`: the item panel walks them; `column="item_index"`: a
    run with repeats lists an item at each matching repeat)."""
    status, evaluator, scope, ranged = (
        filters.status,
        filters.evaluator,
        filters.scope,
        filters.ranged,
    )
    min_score, max_score = filters.min_score, filters.max_score
    descending = filters.sort.startswith("-")
    if filters.by_found_ids and column == "id":
        # Item ids follow (item_index, run_index). Counting and ordering 100k ids given as a
        # parameter costs ~100 ms of database CPU at 500,000 items (SQLite), five times it on
        # PostgreSQL; slicing the ids already read costs nothing.
        found = filters.found
        return (lambda: len(found)), lambda offset, limit: _in_order(
            found, descending, offset, limit
        )
    key = filters.sort.lstrip("-")
    sort_evaluator = key.removeprefix("score:") if key.startswith("score:") else ""
    if ranged and sort_evaluator in ("", evaluator):
        verdicts = _verdicts(run, evaluator, status, min_score, max_score, scope)
        if sort_evaluator:
            order = ["-score", "-id"] if descending else ["score", "id"]
        elif key == "index":
            # Item ids follow (item_index, run_index): rows are created in that order.
            order = ["-item_id"] if descending else ["item_id"]
        else:
            by = f"item__{ITEM_SORTS[key][0]}"
            order = [f"-{by}" if descending else by, "item_id"]
        page_ids = verdicts.order_by(*order).values_list(_of_item(column), flat=True)
        return verdicts.count, lambda offset, limit: _slice(page_ids, offset, limit)
    if sort_evaluator and not ranged:
        return _items(run, status, scope).count, lambda offset, limit: _ids_by_score(
            run, sort_evaluator, status, descending, offset, limit, scope, column
        )
    items = _items(run, status, scope)
    if ranged:
        items = items.annotate(
            verdict=FilteredRelation("evaluations", condition=Q(evaluations__evaluator=evaluator))
        )
        if min_score is not None:
            items = items.filter(verdict__score__gte=min_score)
        if max_score is not None:
            items = items.filter(verdict__score__lte=max_score)
    count = items.count
    if sort_evaluator:
        items = items.annotate(
            ranked=FilteredRelation(
                "evaluations", condition=Q(evaluations__evaluator=sort_evaluator)
            )
        )
        score = F("ranked__score")
        ranked = score.desc(nulls_last=True) if descending else score.asc(nulls_last=True)
        order = [ranked, "item_index", "run_index"]
    else:
        columns = ITEM_SORTS.get(key, ITEM_SORTS["index"])
        order = [f"-{c}" if descending else c for c in columns]
        if key != "index":
            order += ["item_index", "run_index"]
    ordered = items.order_by(*order).values_list(column, flat=True)
    return count, lambda offset, limit: _slice(ordered, offset, limit)


def _of_item(column: str) -> str:
    """An item's `column` read from its evaluations."""
    return "item_id" if column == "id" else f"item__{column}"


def _in_order(ids: Sequence[int], descending: bool, offset: int, limit: int | None) -> list[int]:
    """`limit` of `ids` (ascending) from `offset`, in ascending or descending order."""
    end = len(ids) if limit is None else min(len(ids), offset + limit)
    if not descending:
        return list(ids[offset:end])
    return [ids[len(ids) - 1 - i] for i in range(offset, end)]


def _slice(ids: QuerySet, offset: int, limit: int | None) -> list[int]:
    return list(ids[offset:] if limit is None else ids[offset : offset + limit])


def page_of(run: Run, ids: list[int], number: int, per_page: int, total: int) -> ItemsPage:
    loaded = ItemResult.objects.only(*ROW_FIELDS).in_bulk(ids)
    scores = _scores_of(ids)
    names = run.evaluator_names
    marks = pass_marks(run)
    return ItemsPage(
        rows=[_item_row(loaded[i], scores.get(i, {}), names, marks) for i in ids if i in loaded],
        number=number,
        per_page=per_page,
        total=total,
    )


def _items(
    run: Run, status: str, scope: QuerySet[ItemResult] | None = None
) -> QuerySet[ItemResult]:
    items = ItemResult.objects.filter(run=run) if scope is None else scope
    return items.filter(status=status) if status else items


def _verdicts(
    run: Run,
    name: str,
    status: str,
    min_score: float | None,
    max_score: float | None,
    scope: QuerySet[ItemResult] | None = None,
) -> QuerySet[Evaluation]:
    verdicts = Evaluation.objects.filter(run=run, evaluator=name, score__isnull=False)
    if scope is not None:
        verdicts = verdicts.filter(item_id__in=scope.values("id"))
    if min_score is not None:
        verdicts = verdicts.filter(score__gte=min_score)
    if max_score is not None:
        verdicts = verdicts.filter(score__lte=max_score)
    if status:
        verdicts = verdicts.filter(item__status=status)
    return verdicts


def clamp(page: int, total: int, per_page: int) -> tuple[int, int]:
    number = min(max(1, page), max(1, math.ceil(total / per_page)))
    return number, (number - 1) * per_page


def _ids_by_score(
    run: Run,
    name: str,
    status: str,
    descending: bool,
    offset: int,
    limit: int | None,
    scope: QuerySet[ItemResult] | None = None,
    column: str = "id",
) -> list[int]:
    """Scored items in score order, then the items without a score (errors) by index."""
    scored = _verdicts(run, name, status, None, None, scope)
    scored_count = scored.count()
    ids: list[int] = []
    if offset < scored_count:
        order = ["-score", "-id"] if descending else ["score", "id"]
        ids = _slice(
            scored.order_by(*order).values_list(_of_item(column), flat=True), offset, limit
        )
    if limit is None or len(ids) < limit:
        start = max(0, offset - scored_count)
        unscored = (
            _items(run, status, scope)
            .exclude(id__in=_verdicts(run, name, "", None, None).values("item_id"))
            .order_by("item_index", "run_index")
            .values_list(column, flat=True)
        )
        ids += _slice(unscored, start, None if limit is None else limit - len(ids))
    return ids


def _scores_of(item_ids: list[int]) -> dict[int, dict[str, dict[str, Any]]]:
    result: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    if not item_ids:
        return result
    rows = Evaluation.objects.filter(item_id__in=item_ids).values_list(
        "item_id", "evaluator", "score", "status", "cached", "reason", "error"
    )
    for item_id, name, score, status, cached, reason, error in rows:
        result[item_id][name] = {
            "score": score,
            "status": status,
            "cached": cached,
            "reason": preview(reason or ""),
            "error": preview(error or ""),
        }
    return result


def _item_row(
    item: ItemResult,
    scores: dict[str, dict[str, Any]],
    names: list[str],
    marks: dict[str, float],
) -> ItemRow:
    names = names or sorted(scores)
    cells = []
    for name in names:
        cell = scores.get(name, {"score": None, "status": None})
        if cell["status"] is None:  # not evaluated (yet)
            verdict = Verdict.NONE
        else:
            errored = cell["status"] != Evaluation.Status.OK
            verdict = evaluation_verdict(cell["score"], marks.get(name), error=errored)
        cells.append({"name": name, **cell, "verdict": verdict})
    return ItemRow(
        id=item.id,
        number=item.item_index + 1,
        run_index=item.run_index,
        key=item.item_key,
        status=item.status,
        input=preview(input_text(item.input)),
        output=preview(output_text(item.output)),
        latency_ms=item.latency_ms,
        tokens=item.tokens,
        error=preview(item.error),
        scores=cells,
    )


def input_text(value: Any) -> str:
    """The item's `input` field when it has one, otherwise the whole item as JSON."""
    if isinstance(value, dict) and "input" in value:
        value = value["input"]
    return value if isinstance(value, str) else _compact(value)


def output_text(value: Any) -> str:
    """The output as text: a conversation as its turns (`user: Hi · assistant: Hello`), other
    values that are not text as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if _is_conversation(value):
        return " · ".join(f"{turn['role']}: {output_text(turn['content'])}" for turn in value)
    return _compact(value)


def _is_conversation(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(turn, dict) and {"role", "content"} <= turn.keys() for turn in value)
    )


def preview(text: str, limit: int = TEXT_PREVIEW) -> str:
    text = text or ""
    # Spaces folded over the start only: a 5 MB output is not split for 160 characters.
    folded = " ".join(text[: limit * 8].split())
    if len(folded) <= limit and len(text) <= limit * 8:
        return folded
    return folded[: limit - 1] + "…"


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def item_detail(run: Run, item_id: int) -> ItemResult | None:
    """One item of a run with its evaluations (in the run's evaluator order); its trace is
    read with it (`page_trace.item_trace` pages it)."""
    return _detailed(run, ItemResult.objects.filter(run=run, id=item_id))


def item_detail_at(run: Run, number: int, repeat: int = 1) -> ItemResult | None:
    """`item_detail` of the item shown as `#number` (repetition `repeat`, both from 1)."""
    return _detailed(
        run, ItemResult.objects.filter(run=run, item_index=number - 1, run_index=repeat - 1)
    )


def _detailed(run: Run, found: QuerySet[ItemResult]) -> ItemResult | None:
    item = found.select_related("trace").first()
    if item is None:
        return None
    item.verdicts = ordered_verdicts(run, item)
    marks = pass_marks(run)
    for verdict in item.verdicts:  # the colour of its score cell
        verdict.verdict = evaluation_verdict(
            verdict.score,
            marks.get(verdict.evaluator),
            error=verdict.status != Evaluation.Status.OK,
        )
    return item


# Settings of how a run was executed, not of what ran: they do not make another version.
EXECUTION_SETTINGS = ("concurrency", "runs", "repeat_flaky")


def version_fingerprint(run: Run) -> str:
    """What makes two runs the same version of an experiment: file, settings and evaluators
    (not how many repetitions or how concurrently), tags and git commit. Verdicts that change
    between versions say the agent changed, not that it is flaky."""
    config = {k: v for k, v in run.config.items() if k not in EXECUTION_SETTINGS}
    dataset = config.get("dataset")
    if isinstance(dataset, dict):  # a sample of the same dataset is the same version
        config["dataset"] = {k: v for k, v in dataset.items() if k not in ("size", "sampleSeed")}
    return json.dumps(
        [run.file, config, sorted(run.tags or []), run.git_commit], sort_keys=True, default=str
    )


def flaky_marks(run: Run, keys: Iterable[str]) -> dict[str, ItemFlakiness]:
    """The flaky items among `keys`: verdicts that flipped across the repetitions of this run
    and of the earlier runs of the same version (`version_fingerprint`), never across
    versions. Two queries: the candidate runs, then their observations of these keys (with
    this run's pass marks: the same version has the same evaluators)."""
    keys = list(keys)
    if not keys:
        return {}
    fingerprint = version_fingerprint(run)
    candidates = Run.objects.filter(
        name=run.name, status__in=Run.FINISHED, parent__isnull=True, created_at__lte=run.created_at
    ).only("id", "file", "config", "tags", "git_commit")
    same = [
        other.id
        for other in candidates.order_by("-created_at", "-id")[:HISTORY_RUNS]
        if other.id == run.id or version_fingerprint(other) == fingerprint
    ]
    if run.id not in same:
        same.append(run.id)  # still running: its repetitions so far
    found = item_flakiness(
        observations(list(reversed(same)), keys=keys, pass_marks=pass_marks(run))
    )
    return {key: item for key, item in found.items() if item.flaky}


def conversation_turns(output: Any, metadata: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A conversation's messages for the item page, each assistant reply with its per-turn
    scores (`per_turn=True` evaluators); [] when the output is not a conversation."""
    from cobalt_app.conversation import is_transcript

    if not is_transcript(output):
        return []
    info = (metadata or {}).get("conversation") or {}
    per_turn = info.get("turnScores") or {}
    turns, reply = [], 0
    for message in output:
        entry = {"role": message["role"], "content": message.get("content", ""), "scores": []}
        if message["role"] == "assistant":
            entry["scores"] = [
                (name, scores[reply]) for name, scores in per_turn.items() if reply < len(scores)
            ]
            reply += 1
        turns.append(entry)
    return turns
