"""Reads shaped for the dashboard pages (and the API's trends): scores against pass marks, a
run's overview, trends. The runs they show come from `selectors`.

Lists read the summaries stored on runs at finalisation; only a run that is still running
is aggregated from its rows. The histogram, which touches every evaluation of a large run,
is stored at finalisation too (`run_figures`), counted only while a run runs. Every score is
shown against its evaluator's pass mark (`pass_threshold`, 0.5 by default):
`cobalt.verdict.score_verdict` names the colour (fail / borderline / pass), as it names the
verdict at every other door.
A run's items and the item panel are read in `page_items`, the compare page in
`page_compare`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Max, Min, Q, Sum
from django.utils import timezone

from cobalt import verdict
from cobalt.verdict import score_verdict
from cobalt_app import run_figures, trace_store
from cobalt_app.models import Evaluation, ItemResult, Run
from cobalt_app.selectors import experiment_runs

HISTOGRAM_BINS = run_figures.HISTOGRAM_BINS


# Scores against pass marks ------------------------------------------------------------------


def score_cells(run: Run) -> list[tuple[str, float | None, str]]:
    """(evaluator, average, verdict) from the stored summary, the verdict by the pass mark."""
    marks = pass_marks(run)
    return [
        (name, avg, score_verdict(avg, marks.get(name)))
        for name, avg in ((n, (v or {}).get("avg")) for n, v in _scores(run).items())
    ]


def pass_marks(run: Run) -> dict[str, float]:
    """Each evaluator of the run's pass mark (`cobalt.verdict.pass_marks`)."""
    return verdict.pass_marks((run.config or {}).get("evaluators", []))


def _scores(run: Run) -> dict[str, dict[str, Any]]:
    return (run.summary or {}).get("scores") or {}


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
    def pace(self) -> dict[str, float | None]:
        """Items finished per second since the run started, and the time left at that pace."""
        run = self.run
        if not run.started_at or not run.finished_items:
            return {"throughput": None, "eta_ms": None}
        elapsed = ((run.finished_at or timezone.now()) - run.started_at).total_seconds()
        throughput = run.finished_items / max(elapsed, 1e-3)
        remaining = max(0, run.total_items - run.finished_items)
        return {"throughput": throughput, "eta_ms": 1000 * remaining / throughput}

    @property
    def chart_data(self) -> dict[str, Any]:
        return {
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
    marks = pass_marks(run)
    evaluators = []
    for name in names:
        values = summary.get("scores", {}).get(name) or {}
        mark = marks.get(name, verdict.DEFAULT_PASS_THRESHOLD)
        evaluators.append(
            {
                "name": name,
                **values,
                "mark": mark,
                "verdict": score_verdict(values.get("avg"), mark),
            }
        )
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
        .annotate(
            n=Count("id"),
            tokens=Sum("tokens"),
            cost=Sum("cost"),
            latency=Sum("latency_ms"),
            timed=Count("latency_ms"),
        )
    )
    status_counts = {row["status"]: row["n"] for row in items}
    timed = sum(row["timed"] for row in items)
    latency_total = sum(row["latency"] or 0.0 for row in items)
    agent_tokens = sum(row["tokens"] or 0 for row in items)
    agent_cost = sum(row["cost"] or 0.0 for row in items)
    per_evaluator: dict[str, dict[str, Any]] = {}
    judge_tokens, judge_cost = 0, 0.0
    passing = Q(pk__in=[])
    for name, mark in pass_marks(run).items():
        passing |= Q(evaluator=name, score__gte=mark)
    rows = (
        Evaluation.objects.filter(run=run)
        .values("evaluator")
        .annotate(
            count=Count("id", filter=Q(status=Evaluation.Status.OK, score__isnull=False)),
            passed=Count("id", filter=Q(status=Evaluation.Status.OK) & passing),
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
            "passRate": row["passed"] / count if count else None,
        }
        judge_tokens += row["tokens"] or 0
        judge_cost += row["cost"] or 0.0
    duration = None
    if run.started_at:
        duration = ((run.finished_at or timezone.now()) - run.started_at).total_seconds() * 1000
    return {
        "totalItems": run.total_items,
        "totalDurationMs": duration,
        "avgLatencyMs": latency_total / timed if timed else None,
        "latency": {},
        "totalTokens": agent_tokens + judge_tokens,
        "estimatedCost": agent_cost + judge_cost,
        "itemStatus": status_counts,
        "errors": status_counts.get(ItemResult.Status.ERROR, 0),
        "timeouts": status_counts.get(ItemResult.Status.TIMEOUT, 0),
        "evaluationErrors": sum(e["errors"] for e in per_evaluator.values()),
        "traceNotCaptured": trace_store.not_captured(run.id),
        "scores": per_evaluator,
    }


def score_histogram(run: Run, evaluators: list[str] | None = None) -> dict[str, list[int]]:
    """Scores per evaluator in ten bins over [0, 1]: stored for a finished run, counted for
    a running one (`run_figures.histogram`)."""
    return run_figures.histogram(run, list(evaluators or []))


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
        return [
            {"run": run, "scores": self.averages(run), **run_measures(run)} for run in self.runs
        ]

    @property
    def chart_data(self) -> dict[str, Any]:
        """The x axis (each run's date and id), the score lines, and the error rate, cost and
        latency lines drawn beside them (`metrics`, one chart each)."""
        columns = list(zip(*(self.averages(run) for run in self.runs), strict=True))
        measures = [run_measures(run) for run in self.runs]

        def line(label: str, key: str) -> dict[str, Any]:
            return {"label": label, "values": [m[key] for m in measures]}

        return {
            "labels": run_labels(self.runs),
            "runs": [run.id for run in self.runs],
            "series": [
                {"label": name, "values": list(columns[i]) if columns else []}
                for i, name in enumerate(self.evaluators)
            ],
            "metrics": {
                "errorRate": [line("errors and timeouts", "errorRate")],
                "cost": [line("cost (USD)", "cost")],
                "latency": [line("p50", "latencyP50"), line("p95", "latencyP95")],
            },
        }


def run_labels(runs: list[Run]) -> list[str]:
    """Each run's point on a trend's x axis: its date, with seconds when another run started in
    the same minute (runs a minute apart read alike otherwise), and its first tag (`v2`)."""
    minutes = Counter(run.created_at.strftime("%d %b %Y %H:%M") for run in runs)

    def label(run: Run) -> str:
        minute = run.created_at.strftime("%d %b %Y %H:%M")
        when = run.created_at.strftime("%d %b %Y %H:%M:%S") if minutes[minute] > 1 else minute
        return f"{when} · {run.tags[0]}" if run.tags else when

    return [label(run) for run in runs]


def run_measures(run: Run) -> dict[str, float | None]:
    """A finished run's share of items that errored or timed out, its cost (agent and judges),
    and its p50 and p95 latency (ms), from the stored counts and summary."""
    latency = (run.summary or {}).get("latency") or {}
    failed = run.error_count + run.timeout_count
    return {
        "errorRate": failed / run.total_items if run.total_items else None,
        "cost": run.estimated_cost,
        "latencyP50": latency.get("p50"),
        "latencyP95": latency.get("p95"),
    }


def trend(experiment: str, *, tag: str = "", limit: int = 100) -> Trend:
    """The latest finished runs of an experiment (optionally with a tag), oldest first."""
    runs = experiment_runs(experiment, statuses=[Run.Status.COMPLETED], tag=tag)
    latest = list(runs.defer("config", "failure")[:limit])
    latest.reverse()
    names = list(dict.fromkeys(name for run in latest for name in _scores(run)))
    return Trend(experiment=experiment, tag=tag, runs=latest, evaluators=names)
