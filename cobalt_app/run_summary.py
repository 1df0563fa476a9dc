"""A run's summary: the statistics stored on the run at finalisation (so lists never
aggregate raw rows), with its errors, timeouts, evaluation errors, tokens, cost and what was
intercepted counted beside; the results file's header and the pages read it."""

from __future__ import annotations

from array import array
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from django.db import connection
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.utils import timezone

from cobalt import stats, usage_notes, verdict
from cobalt.run_settings import RunSettings
from cobalt_app import big_blocks, received, trace_store
from cobalt_app.intercepts import BUDGET_EXCEEDED
from cobalt_app.models import Evaluation, ItemResult, Run
from cobalt_app.selectors import scored_items

CHUNK = 2000  # rows read at a time


def compute_summary(run: Run) -> dict[str, Any]:
    """Statistics over scored evaluations; errors, timeouts and eval errors counted beside.

    Flat in the run's size but for 8 bytes a score and a latency: rows are read in chunks
    and the scores kept as arrays of floats (issue 41)."""
    big_blocks.given_back()  # the arrays of a big run's end given back once freed
    status_counts, latencies, agent_tokens, agent_cost = _item_totals(run)
    scored: set[str] = set()
    eval_errors: dict[str, int] = defaultdict(int)
    judge_tokens = 0
    judge_cost = 0.0
    cached = 0
    evaluations = _rows(EVALUATION_TOTALS_SQL.format(evaluation=Evaluation._meta.db_table), run.id)
    for evaluator, score, status, tokens, cost, was_cached in evaluations:
        if status == Evaluation.Status.OK and score is not None:
            scored.add(evaluator)
        else:
            eval_errors[evaluator] += 1
        judge_tokens += tokens or 0
        judge_cost += cost or 0.0
        cached += bool(was_cached)
    if (run.config or {}).get("conversation"):  # a simulated user's model calls are judge calls
        tokens, cost = simulator_usage(run)
        judge_tokens += tokens
        judge_cost += cost
    names = run.evaluator_names or sorted(scored | set(eval_errors))
    marks = verdict.pass_marks((run.config or {}).get("evaluators", []))
    from cobalt import significance  # numpy/scipy: loaded when first needed

    extra = significance.run_statistics(
        scored_items(run), names, runs=RunSettings.from_run_config(run.config).runs
    )
    per_evaluator = {
        name: {
            **stats.describe(
                extra["scores"][name], errors=eval_errors.get(name, 0), pass_mark=marks.get(name)
            ),
            "ci95": extra["ci95"][name],
            **({"passAtK": extra["passAtK"][name]} if name in extra["passAtK"] else {}),
        }
        for name in names
    }
    latency = stats.latency_stats(latencies)
    return {
        "totalItems": run.total_items,
        "totalDurationMs": run_duration_ms(run),
        "avgLatencyMs": latency["avg"],
        "latency": latency,
        "totalTokens": agent_tokens + judge_tokens,
        "agentTokens": agent_tokens,
        "judgeTokens": judge_tokens,
        "estimatedCost": agent_cost + judge_cost,
        "agentCost": agent_cost,
        "judgeCost": judge_cost,
        **cost_completeness(run),
        "cachedEvaluations": cached,
        "itemStatus": {
            s: status_counts.get(s, 0) for s in ("ok", "error", "timeout", "cancelled", "pending")
        },
        "errors": status_counts.get(ItemResult.Status.ERROR, 0),
        "timeouts": status_counts.get(ItemResult.Status.TIMEOUT, 0),
        "evaluationErrors": sum(eval_errors.values()),
        "traceNotCaptured": trace_store.not_captured(run.id),
        **received.service_spans(run),
        **intercept_summary(run),
        "scores": per_evaluator,
        **({"repetitions": extra["repetitions"]} if extra["repetitions"] else {}),
    }


def _item_totals(run: Run) -> tuple[dict[str, int], array, int, float]:
    """The run's items: how many of each status, the latencies of the finished ones (an array
    of floats), their tokens and cost."""
    status_counts: dict[str, int] = defaultdict(int)
    latencies = array("d")
    tokens = 0
    cost = 0.0
    rows = _rows(ITEM_TOTALS_SQL.format(item=ItemResult._meta.db_table), run.id)
    for status, latency, item_tokens, item_cost in rows:
        status_counts[status] += 1
        if status == ItemResult.Status.OK and latency is not None:
            latencies.append(latency)
        tokens += item_tokens or 0
        cost += item_cost or 0.0
    return status_counts, latencies, tokens, cost


# A summary's two passes over every row, with plain cursors: the ORM's iterator converted
# each value (a tenth of a summary's CPU). Items in the order the ORM read them (the model's),
# so that the latencies and costs are summed in the same order.
ITEM_TOTALS_SQL = (
    "SELECT status, latency_ms, tokens, cost FROM {item} WHERE run_id = %s "
    "ORDER BY item_index, run_index"
)
EVALUATION_TOTALS_SQL = (
    "SELECT evaluator, score, status, tokens, cost, cached FROM {evaluation} WHERE run_id = %s"
)


def _rows(sql: str, run_id: str) -> Iterator[tuple]:
    """The rows of `sql` for the run, EXPORT_CHUNK at a time (on PostgreSQL a server-side
    cursor: the client never holds them all)."""
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, [run_id])
        while chunk := cursor.fetchmany(CHUNK):
            yield from chunk


def intercept_summary(run: Run) -> dict[str, Any]:
    """`intercepted`: the steps stubbed, injected and replayed over the run's items (their
    metadata, `cobalt_app.intercepts.marks`); `budgetStopped`: items stopped by a budget.
    Nothing when there were none."""
    found: dict[str, Any] = {}
    counted: dict[str, int] = defaultdict(int)
    budget = Q(error__startswith=BUDGET_EXCEEDED)
    # One scan of the run's items for both (issue 41): a row without the key reads None.
    rows = (
        ItemResult.objects.filter(Q(metadata__has_key="intercepted") | budget, run=run)
        .annotate(stopped=ExpressionWrapper(budget, output_field=BooleanField()))
        .values_list("metadata__intercepted", "stopped")
    )
    stopped = 0
    for marks, was_stopped in rows:
        stopped += bool(was_stopped)
        for mark, n in (marks if isinstance(marks, dict) else {}).items():
            counted[str(mark)] += int(n) if isinstance(n, int) else 0
    if counted:
        found["intercepted"] = dict(sorted(counted.items()))
    if stopped:
        found["budgetStopped"] = stopped
    return found


def cost_completeness(run: Run) -> dict[str, Any]:
    """What the run's cost leaves out: models without a price (counted as $0, so the cost is
    a floor) and model calls that reported no usage (their tokens counted or estimated from
    their text, or unknown: see `token_counts`)."""
    unpriced = unpriced_models(run)
    estimated = trace_store.estimated_usage(run.id)
    return {
        "unpricedModels": unpriced,
        "estimatedUsage": estimated,
        "estimatedUsageNote": usage_notes.estimated_usage_note({"estimatedUsage": estimated}),
        "costComplete": not unpriced and not estimated,
    }


def run_duration_ms(run: Run) -> float | None:
    """From its start to its end (or now), plus what it ran before a `--resume`."""
    if not run.started_at:
        return None
    end = run.finished_at or timezone.now()
    prior = RunSettings.from_run_config(run.config).prior_duration_ms  # before a `--resume`
    return prior + (end - run.started_at).total_seconds() * 1000


def simulator_usage(run: Run) -> tuple[int, float]:
    """Tokens and cost of the simulated users of a conversation run."""
    tokens, cost = 0, 0.0
    rows = ItemResult.objects.filter(run=run).values_list("metadata", flat=True)
    for metadata in rows.iterator():
        info = (metadata or {}).get("conversation") or {}
        tokens += int(info.get("simulatorTokens") or 0)
        cost += float(info.get("simulatorCost") or 0.0)
    return tokens, cost


def unpriced_models(run: Run) -> list[str]:
    """The models of the run (agent's and evaluators') that spent tokens without a price.

    Only the distinct (model, cost) of items with tokens and no cost are read, in SQL: a
    priced run reads none, an unpriced one a row per model."""
    from cobalt_app.pricing import agent_unpriced

    found: set[str] = set(
        Evaluation.objects.filter(run=run)
        .exclude(unpriced_model="")
        .values_list("unpriced_model", flat=True)
        .distinct()
    )
    free = (
        ItemResult.objects.filter(run=run, tokens__gt=0, cost=0)
        .values_list("metadata__model", "metadata__cost")
        .distinct()
    )
    for model, reported_cost in free:
        name = agent_unpriced(model, reported_cost, tokens=1)  # tokens > 0: filtered above
        if name:
            found.add(name)
    return sorted(found)
