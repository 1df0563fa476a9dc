"""Reads behind the dashboard pages: run lists, a run's overview and items, compare, trends.

Lists read the summaries stored on runs at finalisation; only a run that is still running
is aggregated from its rows. The histogram, which touches every evaluation of a large run,
is one SQL pass over the `(run, evaluator, score)` index; compare is
`selectors.compare_runs`, shared with the CLI, the API and the MCP tool.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, time
from typing import Any

from django.db import connection
from django.db.models import Count, F, FilteredRelation, Max, Min, Q, QuerySet, Sum
from django.utils import timezone

from cobalt_app import trace_spans
from cobalt_app.models import Evaluation, ItemResult, Run, RunTag
from cobalt_app.selectors import compare_runs
from cobalt_app.significance import ALPHA

HISTOGRAM_BINS = 10
TEXT_PREVIEW = 160

RUN_SORTS = {
    "created": "created_at",
    "name": "name",
    "status": "status",
    "items": "total_items",
    "errors": "error_count",
    "duration": "duration_ms",
    "cost": "estimated_cost",
}
ITEM_SORTS = {
    "index": ("item_index", "run_index"),
    "latency": ("latency_ms",),
    "tokens": ("tokens",),
}


# Runs list ----------------------------------------------------------------------------------


def run_search(
    *,
    name: str = "",
    tag: str = "",
    status: str = "",
    date_from: date | None = None,
    date_to: date | None = None,
    sort: str = "-created",
) -> QuerySet[Run]:
    """Runs matching the list filters, sorted; never touches item rows."""
    runs = Run.objects.defer("config", "failure")
    if name:
        runs = runs.filter(name__icontains=name)
    if tag:
        runs = runs.filter(id__in=RunTag.objects.filter(name=tag).values("run_id"))
    if status:
        runs = runs.filter(status=status)
    if date_from:
        runs = runs.filter(created_at__gte=_day_start(date_from))
    if date_to:
        runs = runs.filter(created_at__lt=_day_start(date_to) + timezone.timedelta(days=1))
    descending = sort.startswith("-")
    column = RUN_SORTS.get(sort.lstrip("-"), "created_at")
    order = f"-{column}" if descending else column
    return runs.order_by(order, "-created_at", "id")


def tag_names() -> list[str]:
    return list(RunTag.objects.order_by("name").values_list("name", flat=True).distinct())


def latest_experiment() -> str:
    """The experiment of the most recent run (the trends page opens on it)."""
    return Run.objects.order_by("-created_at").values_list("name", flat=True).first() or ""


def experiment_names() -> list[str]:
    return list(Run.objects.order_by("name").values_list("name", flat=True).distinct())


def score_cells(run: Run) -> list[tuple[str, float | None]]:
    """(evaluator, average) pairs from the stored summary."""
    return [(name, (values or {}).get("avg")) for name, values in _scores(run).items()]


def _scores(run: Run) -> dict[str, dict[str, Any]]:
    return (run.summary or {}).get("scores") or {}


def _day_start(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min), timezone.get_current_timezone())


# Run detail ---------------------------------------------------------------------------------


@dataclass
class RunOverview:
    """Everything the top of a run's page shows; `live` when aggregated from rows."""

    run: Run
    summary: dict[str, Any]
    evaluators: list[dict[str, Any]]
    histogram: dict[str, list[int]]
    live: bool
    progress: int

    @property
    def chart_data(self) -> dict[str, Any]:
        return {
            "bars": {
                "labels": [e["name"] for e in self.evaluators],
                "values": [e.get("avg") for e in self.evaluators],
            },
            "histogram": {
                "labels": [
                    f"{i / HISTOGRAM_BINS:.1f}–{(i + 1) / HISTOGRAM_BINS:.1f}"
                    for i in range(HISTOGRAM_BINS)
                ],
                "series": [{"label": k, "values": v} for k, v in self.histogram.items()],
            },
        }


def run_overview(run: Run) -> RunOverview:
    """The stored summary of a finished run, or one aggregated now for a run in progress."""
    live = not run.is_finished or not run.summary
    summary = live_summary(run) if live else run.summary
    names = run.evaluator_names or list(summary.get("scores", {}))
    evaluators = [{"name": name, **(summary.get("scores", {}).get(name) or {})} for name in names]
    progress = 0
    if run.total_items:
        progress = min(100, round(100 * run.finished_items / run.total_items))
    elif run.is_finished:
        progress = 100
    return RunOverview(
        run=run,
        summary=summary,
        evaluators=evaluators,
        histogram=score_histogram(run, names),
        live=live,
        progress=progress,
    )


def live_summary(run: Run) -> dict[str, Any]:
    """What is known so far about a run: counts, sums and score avg/min/max (no percentiles)."""
    items = (
        ItemResult.objects.filter(run=run)
        .values("status")
        .annotate(n=Count("id"), tokens=Sum("tokens"), cost=Sum("cost"))
    )
    status_counts = {row["status"]: row["n"] for row in items}
    agent_tokens = sum(row["tokens"] or 0 for row in items)
    agent_cost = sum(row["cost"] or 0.0 for row in items)
    per_evaluator: dict[str, dict[str, Any]] = {}
    judge_tokens, judge_cost = 0, 0.0
    rows = (
        Evaluation.objects.filter(run=run)
        .values("evaluator")
        .annotate(
            count=Count("id", filter=Q(status=Evaluation.Status.OK, score__isnull=False)),
            errors=Count("id", filter=~Q(status=Evaluation.Status.OK) | Q(score__isnull=True)),
            total=Sum("score", filter=Q(status=Evaluation.Status.OK)),
            low=Min("score", filter=Q(status=Evaluation.Status.OK)),
            high=Max("score", filter=Q(status=Evaluation.Status.OK)),
            tokens=Sum("tokens"),
            cost=Sum("cost"),
        )
    )
    for row in rows:
        count = row["count"]
        per_evaluator[row["evaluator"]] = {
            "avg": row["total"] / count if count else None,
            "min": row["low"],
            "max": row["high"],
            "p50": None,
            "p95": None,
            "count": count,
            "errors": row["errors"],
            "passRate": None,
        }
        judge_tokens += row["tokens"] or 0
        judge_cost += row["cost"] or 0.0
    duration = None
    if run.started_at:
        duration = ((run.finished_at or timezone.now()) - run.started_at).total_seconds() * 1000
    return {
        "totalItems": run.total_items,
        "totalDurationMs": duration,
        "avgLatencyMs": None,
        "latency": {},
        "totalTokens": agent_tokens + judge_tokens,
        "estimatedCost": agent_cost + judge_cost,
        "itemStatus": status_counts,
        "errors": status_counts.get(ItemResult.Status.ERROR, 0),
        "timeouts": status_counts.get(ItemResult.Status.TIMEOUT, 0),
        "evaluationErrors": sum(e["errors"] for e in per_evaluator.values()),
        "scores": per_evaluator,
    }


def score_histogram(run: Run, evaluators: list[str] | None = None) -> dict[str, list[int]]:
    """Scores per evaluator in ten bins over [0, 1] (outliers in the end bins), one query.

    Each bin is a range count on the `(run, evaluator, score)` index, which is far cheaper
    than evaluating a bin expression for every row (and portable: casting a float truncates
    on SQLite but rounds on PostgreSQL).
    """
    names = list(evaluators or [])
    if not names:
        return {}
    table = Evaluation._meta.db_table
    edges = [i / HISTOGRAM_BINS for i in range(1, HISTOGRAM_BINS)]
    counts, params = [], []
    for name in names:
        for i in range(HISTOGRAM_BINS):
            bounds, values = [], []
            if i > 0:
                bounds.append("score >= %s")
                values.append(edges[i - 1])
            if i < HISTOGRAM_BINS - 1:
                bounds.append("score < %s")
                values.append(edges[i])
            counts.append(
                f"(SELECT COUNT(*) FROM {table} WHERE run_id = %s AND evaluator = %s"
                f" AND {' AND '.join(bounds)})"
            )
            params += [run.id, name, *values]
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(counts), params)
        row = cursor.fetchone()
    return {
        name: list(row[n * HISTOGRAM_BINS : (n + 1) * HISTOGRAM_BINS])
        for n, name in enumerate(names)
    }


def previous_run(run: Run) -> Run | None:
    """The latest earlier run of the same experiment (to compare against)."""
    return (
        Run.objects.filter(name=run.name, created_at__lt=run.created_at)
        .only("id", "created_at")
        .order_by("-created_at")
        .first()
    )


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


@dataclass
class ItemsPage:
    rows: list[ItemRow]
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


def item_page(
    run: Run,
    *,
    status: str = "",
    evaluator: str = "",
    min_score: float | None = None,
    max_score: float | None = None,
    sort: str = "index",
    page: int = 1,
    per_page: int = 50,
) -> ItemsPage:
    """One page of a run's items with their scores.

    The page's ids are found with a narrow query on indexed columns, then only those rows are
    loaded: sorting 50k wide rows (inputs and outputs) would cost more than the whole page.
    Score filters and score sorts read the `(run, evaluator, score)` index.
    """
    descending = sort.startswith("-")
    key = sort.lstrip("-")
    sort_evaluator = key.removeprefix("score:") if key.startswith("score:") else ""
    ranged = bool(evaluator) and (min_score is not None or max_score is not None)
    if ranged and sort_evaluator in ("", evaluator):
        verdicts = _verdicts(run, evaluator, status, min_score, max_score)
        total = verdicts.count()
        number, offset = _clamp(page, total, per_page)
        if sort_evaluator:
            order = ["-score", "-id"] if descending else ["score", "id"]
        elif key == "index":
            # Item ids follow (item_index, run_index): rows are created in that order.
            order = ["-item_id"] if descending else ["item_id"]
        else:
            column = f"item__{ITEM_SORTS[key][0]}"
            order = [f"-{column}" if descending else column, "item_id"]
        page_ids = verdicts.order_by(*order).values_list("item_id", flat=True)
        ids = list(page_ids[offset : offset + per_page])
    elif sort_evaluator and not ranged:
        total = _items(run, status).count()
        number, offset = _clamp(page, total, per_page)
        ids = _ids_by_score(run, sort_evaluator, status, descending, offset, per_page)
    else:
        items = _items(run, status)
        if ranged:
            items = items.annotate(
                verdict=FilteredRelation(
                    "evaluations", condition=Q(evaluations__evaluator=evaluator)
                )
            )
            if min_score is not None:
                items = items.filter(verdict__score__gte=min_score)
            if max_score is not None:
                items = items.filter(verdict__score__lte=max_score)
        total = items.count()
        number, offset = _clamp(page, total, per_page)
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
        ids = list(items.order_by(*order).values_list("id", flat=True)[offset : offset + per_page])
    loaded = ItemResult.objects.only(*ROW_FIELDS).in_bulk(ids)
    scores = _scores_of(ids)
    names = run.evaluator_names
    return ItemsPage(
        rows=[_item_row(loaded[i], scores.get(i, {}), names) for i in ids if i in loaded],
        number=number,
        per_page=per_page,
        total=total,
    )


def _items(run: Run, status: str) -> QuerySet[ItemResult]:
    items = ItemResult.objects.filter(run=run)
    return items.filter(status=status) if status else items


def _verdicts(
    run: Run, name: str, status: str, min_score: float | None, max_score: float | None
) -> QuerySet[Evaluation]:
    verdicts = Evaluation.objects.filter(run=run, evaluator=name, score__isnull=False)
    if min_score is not None:
        verdicts = verdicts.filter(score__gte=min_score)
    if max_score is not None:
        verdicts = verdicts.filter(score__lte=max_score)
    if status:
        verdicts = verdicts.filter(item__status=status)
    return verdicts


def _clamp(page: int, total: int, per_page: int) -> tuple[int, int]:
    number = min(max(1, page), max(1, math.ceil(total / per_page)))
    return number, (number - 1) * per_page


def _ids_by_score(
    run: Run, name: str, status: str, descending: bool, offset: int, limit: int
) -> list[int]:
    """Scored items in score order, then the items without a score (errors) by index."""
    scored = _verdicts(run, name, status, None, None)
    scored_count = scored.count()
    ids: list[int] = []
    if offset < scored_count:
        order = ["-score", "-id"] if descending else ["score", "id"]
        ranked = scored.order_by(*order).values_list("item_id", flat=True)
        ids = list(ranked[offset : offset + limit])
    if len(ids) < limit:
        start = max(0, offset - scored_count)
        unscored = (
            _items(run, status)
            .exclude(id__in=_verdicts(run, name, "", None, None).values("item_id"))
            .order_by("item_index", "run_index")
            .values_list("id", flat=True)
        )
        ids += list(unscored[start : start + limit - len(ids)])
    return ids


def _scores_of(item_ids: list[int]) -> dict[int, dict[str, dict[str, Any]]]:
    result: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    if not item_ids:
        return result
    rows = Evaluation.objects.filter(item_id__in=item_ids).values_list(
        "item_id", "evaluator", "score", "status", "cached"
    )
    for item_id, name, score, status, cached in rows:
        result[item_id][name] = {"score": score, "status": status, "cached": cached}
    return result


def _item_row(item: ItemResult, scores: dict[str, dict[str, Any]], names: list[str]) -> ItemRow:
    names = names or sorted(scores)
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
        scores=[{"name": n, **scores.get(n, {"score": None, "status": None})} for n in names],
    )


def input_text(value: Any) -> str:
    """The item's `input` field when it has one, otherwise the whole item as JSON."""
    if isinstance(value, dict) and "input" in value:
        value = value["input"]
    return value if isinstance(value, str) else _compact(value)


def output_text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else _compact(value)


def preview(text: str, limit: int = TEXT_PREVIEW) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def pretty(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, indent=2, default=str)


def item_detail(run: Run, item_id: int) -> ItemResult | None:
    """One item of a run with its evaluations (ordered by the run's evaluator order)."""
    item = ItemResult.objects.filter(run=run, id=item_id).select_related("trace").first()
    if item is None:
        return None
    order = {name: i for i, name in enumerate(run.evaluator_names)}
    item.verdicts = sorted(
        Evaluation.objects.filter(item=item), key=lambda e: (order.get(e.evaluator, 99), e.id)
    )
    stored = getattr(item, "trace", None)  # none when no step was captured
    steps = stored.steps if stored is not None else []
    item.timeline = trace_spans.timeline(steps)
    item.trace_summary = trace_spans.summary(steps) if steps else ""
    return item


# Compare ------------------------------------------------------------------------------------


@dataclass
class Comparison:
    a: Run
    b: Run
    evaluators: list[dict[str, Any]]
    regressions: list[dict[str, Any]]
    improvements: list[dict[str, Any]]
    matched: int
    only_in_a: int
    only_in_b: int
    alpha: float = ALPHA

    @property
    def chart_data(self) -> dict[str, Any]:
        return {
            "labels": [e["name"] for e in self.evaluators],
            "a": [e["a"] for e in self.evaluators],
            "b": [e["b"] for e in self.evaluators],
            "labelA": f"A · {self.a.id}",
            "labelB": f"B · {self.b.id}",
        }


def compare(a: Run, b: Run, *, top: int = 10, alpha: float = ALPHA) -> Comparison:
    """The compare page's view of `selectors.compare_runs`: the same averages, paired tests
    and movers as the CLI, the API and the MCP tool, one row per evaluator."""
    diff = compare_runs(a, b, top=top, alpha=alpha)
    evaluators = []
    for name, values in diff["evaluators"].items():
        test = diff["significance"][name]
        evaluators.append(
            {
                "name": name,
                **values,
                "pairs": test["n"],
                "meanDelta": test["delta"],
                "ci": test["ci"],
                "pValue": test["pValue"],
                "test": test["test"],
                "verdict": test["verdict"],
            }
        )
    return Comparison(
        a=a,
        b=b,
        evaluators=evaluators,
        regressions=diff["regressions"],
        improvements=diff["improvements"],
        matched=diff["matchedItems"],
        only_in_a=len(diff["onlyInA"]),
        only_in_b=len(diff["onlyInB"]),
        alpha=diff["alpha"],
    )


def side_by_side(a: Run, b: Run, key: str) -> list[dict[str, Any]]:
    """Each repetition of the item with this key in both runs, outputs and verdicts paired."""
    items = (
        ItemResult.objects.filter(run__in=[a, b], item_key=key)
        .prefetch_related("evaluations")
        .order_by("run_index")
    )
    by_repetition: dict[int, dict[str, ItemResult]] = defaultdict(dict)
    for item in items:
        by_repetition[item.run_index]["a" if item.run_id == a.id else "b"] = item
    result = []
    for repetition in sorted(by_repetition):
        pair = by_repetition[repetition]
        names = list(dict.fromkeys([*a.evaluator_names, *b.evaluator_names]))
        verdicts = {
            side: {e.evaluator: e for e in item.evaluations.all()} for side, item in pair.items()
        }
        result.append(
            {
                "runIndex": repetition,
                "a": pair.get("a"),
                "b": pair.get("b"),
                "input": pretty((pair.get("a") or pair.get("b")).input),
                "outputA": pretty(pair["a"].output) if "a" in pair else "",
                "outputB": pretty(pair["b"].output) if "b" in pair else "",
                "verdicts": [
                    {
                        "name": name,
                        "a": verdicts.get("a", {}).get(name),
                        "b": verdicts.get("b", {}).get(name),
                    }
                    for name in names
                ],
            }
        )
    return result


def recent_runs(limit: int = 100) -> list[Run]:
    return list(
        Run.objects.only("id", "name", "created_at", "status").order_by("-created_at")[:limit]
    )


# Trends -------------------------------------------------------------------------------------


@dataclass
class Trend:
    experiment: str
    tag: str
    runs: list[Run]
    evaluators: list[str]

    def averages(self, run: Run) -> list[float | None]:
        return [(_scores(run).get(name) or {}).get("avg") for name in self.evaluators]

    def points(self) -> list[dict[str, Any]]:
        return [{"run": run, "scores": self.averages(run)} for run in self.runs]

    @property
    def chart_data(self) -> dict[str, Any]:
        columns = list(zip(*(self.averages(run) for run in self.runs), strict=True))
        return {
            "labels": [run.created_at.strftime("%Y-%m-%d %H:%M:%S") for run in self.runs],
            "runs": [run.id for run in self.runs],
            "series": [
                {"label": name, "values": list(columns[i]) if columns else []}
                for i, name in enumerate(self.evaluators)
            ],
        }


def trend(experiment: str, *, tag: str = "", limit: int = 100) -> Trend:
    """The latest finished runs of an experiment (optionally with a tag), oldest first."""
    runs = Run.objects.filter(name=experiment, status=Run.Status.COMPLETED).defer(
        "config", "failure"
    )
    if tag:
        runs = runs.filter(id__in=RunTag.objects.filter(name=tag).values("run_id"))
    latest = list(runs.order_by("-created_at")[:limit])
    latest.reverse()
    names = list(dict.fromkeys(name for run in latest for name in _scores(run)))
    return Trend(experiment=experiment, tag=tag, runs=latest, evaluators=names)


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
