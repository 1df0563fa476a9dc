"""What a run says of model calls that reported no usage (see cobalt_app/token_counts.py):
one wording for the terminal summary, the run page and the results file's summary."""

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
