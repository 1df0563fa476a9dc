"""Is B better than A? The verdict strip of a compare: per run its items, errors and
timeouts, each evaluator's pass rate, p50/p95 latency, tokens and cost, each with its change
from the baseline, and one sentence saying where the run wins and where it loses.

Everything comes from what is already computed: the runs' summaries stored at finalisation
(pass rates by the one verdict rule, `cobalt.verdict.pass_rate`) and the paired tests of
`selectors.compare_runs` (an evaluator is a win or a loss only when its test says so). The
page, the REST API and the MCP tool call `verdict_strip`; it reads no request and no rows.
"""

from __future__ import annotations

from typing import Any

from cobalt.significance import IMPROVED, REGRESSED, format_p
from cobalt_app.models import Run

# Latency, tokens and cost have no paired test here: a change smaller than this share of the
# baseline's value is neither a win nor a loss (a rerun of the same agent moves them this much),
# nor is a latency change under LATENCY_FLOOR_MS (scheduling jitter on a fast agent).
RELATIVE_CHANGE = 0.05
LATENCY_FLOOR_MS = 100.0
# A percentile of fewer items is one slow call (a cold start), not the agent's latency.
LATENCY_MIN_ITEMS = 20
# (key in `run_figures`, how the sentence names it), lower is better for each.
COSTS = (
    ("latencyP50", "p50 latency"),
    ("latencyP95", "p95 latency"),
    ("tokens", "tokens"),
    ("cost", "cost"),
)


def notable(key: str, before: float | None, after: float | None, items: int | None = None) -> bool:
    """Whether a run's latency, tokens or cost (`key`) moved enough to be a win or a loss
    (`items`: the fewer of the two runs' items); any change of errors or timeouts is."""
    if before is None or after is None or before == after:
        return False
    if key in ("errors", "timeouts"):
        return True
    if key.startswith("latency") and (
        abs(after - before) < LATENCY_FLOOR_MS or (items or 0) < LATENCY_MIN_ITEMS
    ):
        return False
    change = _relative(after, before)
    return change is None or abs(change) >= RELATIVE_CHANGE


def run_figures(run: Run) -> dict[str, Any]:
    """One run's column of the strip, from its stored summary."""
    summary = run.summary or {}
    latency = summary.get("latency") or {}
    scores = summary.get("scores") or {}
    return {
        "id": run.id,
        "name": run.name,
        "items": run.total_items,
        "errors": summary.get("errors", run.error_count),
        "timeouts": summary.get("timeouts", run.timeout_count),
        "latencyP50": latency.get("p50"),
        "latencyP95": latency.get("p95"),
        "tokens": summary.get("totalTokens", run.total_tokens),
        "cost": summary.get("estimatedCost", run.estimated_cost),
        "passRates": {name: (values or {}).get("passRate") for name, values in scores.items()},
    }


def verdict_strip(base: Run, others: list[tuple[Run, dict[str, Any]]]) -> dict[str, Any]:
    """The strip of `base` against each other run; `others` pairs each run with its
    `selectors.compare_runs(base, run)` (whose paired tests name the significant changes)."""
    baseline = run_figures(base)
    figures = [run_figures(run) for run, _ in others]
    names = list(
        dict.fromkeys(
            [
                *baseline["passRates"],
                *(name for f in figures for name in f["passRates"]),
                *(name for _, diff in others for name in diff["evaluators"]),
            ]
        )
    )
    columns = []
    for n, (figure, (_, diff)) in enumerate(zip(figures, others, strict=True)):
        label = "B" if len(others) == 1 else f"B{n + 1}"
        columns.append(_column(baseline, figure, diff, label, names))
    return {"baseline": baseline, "evaluators": names, "runs": columns}


def _column(
    base: dict[str, Any], run: dict[str, Any], diff: dict[str, Any], label: str, names: list[str]
) -> dict[str, Any]:
    evaluators = []
    for name in names:
        test = diff["significance"].get(name) or {}
        before, after = base["passRates"].get(name), run["passRates"].get(name)
        evaluators.append(
            {
                "name": name,
                "passRateA": before,
                "passRateB": after,
                "delta": _minus(after, before),
                "verdict": test.get("verdict"),
                "pValue": test.get("pValue"),
                "test": test.get("test"),
            }
        )
    deltas = {
        key: _minus(run[key], base[key])
        for key in ("items", "errors", "timeouts", "latencyP50", "latencyP95", "tokens", "cost")
    }
    wins, losses, unchanged = _wins_and_losses(base, run, evaluators)
    return {
        **run,
        "label": label,
        "deltas": deltas,
        "evaluators": evaluators,
        "wins": wins,
        "losses": losses,
        "sentence": sentence(label, wins, losses, unchanged),
    }


def _wins_and_losses(
    base: dict[str, Any], run: dict[str, Any], evaluators: list[dict[str, Any]]
) -> tuple[list[str], list[str], list[str]]:
    """Phrases for where the run wins and loses, and the evaluators with no significant change."""
    wins: list[str] = []
    losses: list[str] = []
    unchanged: list[str] = []
    failed_a = (base["errors"] or 0) + (base["timeouts"] or 0)
    failed_b = (run["errors"] or 0) + (run["timeouts"] or 0)
    if failed_a != failed_b:
        (wins if failed_b < failed_a else losses).append(
            f"errors and timeouts ({failed_a:,} → {failed_b:,})"
        )
    for e in evaluators:
        if e["verdict"] not in (IMPROVED, REGRESSED):
            if e["verdict"] is not None:
                unchanged.append(e["name"])
            continue
        rates = ""
        if e["passRateA"] is not None and e["passRateB"] is not None:
            rates = f"pass rate {e['passRateA']:.0%} → {e['passRateB']:.0%}, "
        phrase = f"{e['name']} ({rates}significant, {format_p(e['pValue'])})"
        (wins if e["verdict"] == IMPROVED else losses).append(phrase)
    for key, named in COSTS:
        if notable(key, base[key], run[key], min(base["items"] or 0, run["items"] or 0)):
            change = _relative(run[key], base[key])
            shown = "new" if change is None else f"{change:+.0%}".replace("-", "−")
            (wins if run[key] < base[key] else losses).append(f"{named} ({shown})")
    return wins, losses, unchanged


def sentence(label: str, wins: list[str], losses: list[str], unchanged: list[str]) -> str:
    """`B wins on …; it loses on …; no significant change on …`, in plain words."""
    parts = []
    if wins:
        parts.append(f"{label} wins on {_listed(wins)}")
    if losses:
        parts.append(f"{'it' if wins else label} loses on {_listed(losses)}")
    if not parts:
        parts.append(f"{label} neither wins nor loses")
    if unchanged:
        parts.append(f"no significant change on {_listed(unchanged)}")
    return "; ".join(parts) + "."


def _listed(phrases: list[str]) -> str:
    if len(phrases) == 1:
        return phrases[0]
    return ", ".join(phrases[:-1]) + " and " + phrases[-1]


def _minus(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


def _relative(after: float | None, before: float | None) -> float | None:
    """The change as a share of the baseline; None without both (or with a zero baseline)."""
    if after is None or before is None or not before:
        return None
    return (after - before) / before
