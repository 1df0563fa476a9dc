"""What a run says of model calls that reported no usage (see cobalt_app/token_counts.py), and
of tokens that came with no model's name: one wording for the terminal summary, the run page and
the results file's summary."""

from __future__ import annotations

from typing import Any

METHODS = {
    "tiktoken": "counted from their text with tiktoken",
    "chars": "estimated from their text (~4 characters a token)",
    "unknown": "unknown (no text to count)",
}


def estimated_usage_note(summary: dict[str, Any]) -> str | None:
    """`tokens of 3 model calls (2 items) reported no usage: gpt-4o-mini: 3 calls counted from
    their text with tiktoken; so the cost is an estimate`, or None when every call reported."""
    entries = summary.get("estimatedUsage") or []
    if not entries:
        return None
    calls = sum(e["calls"] for e in entries)
    parts = [
        f"{e['model']}: {e['calls']} call{'s' * (e['calls'] != 1)} "
        f"{METHODS.get(e['method'], e['method'])}"
        for e in entries
    ]
    unknown = sum(e["calls"] for e in entries if e["method"] == "unknown")
    ending = "the cost leaves them out (unknown)" if unknown else "so the cost is an estimate"
    return (
        f"{calls} model call{'s' * (calls != 1)} reported no usage: "
        + "; ".join(parts)
        + f"; {ending}"
    )


def cost_text(summary: dict[str, Any]) -> str:
    """`$0.0123`, `~$0.0123` (estimated tokens), `$0.0123 + unknown`, or `unknown`: never a
    silent $0 for calls whose tokens nobody knows."""
    cost = summary.get("estimatedCost") or 0.0
    entries = summary.get("estimatedUsage") or []
    unknown = any(e["method"] == "unknown" for e in entries)
    if unknown:
        return f"${cost:.4f} + unknown" if cost else "unknown"
    return f"~${cost:.4f}" if entries else f"${cost:.4f}"


NO_MODEL = "(no model named)"  # in a summary's `unpricedModels`: tokens that named no model
NO_MODEL_NOTE = (
    "a model call named no model: its tokens count, but its cost is unknown (counted as $0). "
    "Name its model to price it: `gen_ai.request.model` on a service's span, `model` in the "
    "runner's metadata"
)


def unpriced_named(summary: dict[str, Any]) -> list[str]:
    """The summary's unpriced models that a price under [prices] would cover (not NO_MODEL)."""
    return [m for m in summary.get("unpricedModels") or [] if m != NO_MODEL]


def cost_line(summary: dict[str, Any]) -> str:
    """The run's cost as every door words it: `cost_text`, then what it leaves out —
    `$0.0123 + unpriced: m1, m2 + unknown (no model named)` (the run page shows the same)."""
    parts = [cost_text(summary)]
    named = unpriced_named(summary)
    if named:
        parts.append(f"unpriced: {', '.join(named)}")
    if NO_MODEL in (summary.get("unpricedModels") or []):
        parts.append("unknown (no model named)")
    return " + ".join(parts)


def no_model_note(summary: dict[str, Any]) -> str | None:
    """NO_MODEL_NOTE when some of the run's tokens named no model, else None."""
    return NO_MODEL_NOTE if NO_MODEL in (summary.get("unpricedModels") or []) else None
