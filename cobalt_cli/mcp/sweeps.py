"""`cobalt_sweep`: which variant of a sweep is best and why — the ranking, the paired tests
against the best (Holm-corrected), the Pareto front, and the sentence that says it."""

from __future__ import annotations

from typing import Any

from mcp.types import CallToolResult

from cobalt_cli.mcp.project import Project
from cobalt_cli.mcp.reads import result

SWEEPS_LISTED = 10


def cobalt_sweep_tool(
    project: Project, *, sweep_id: str | None = None, experiment: str | None = None
) -> CallToolResult:
    from cobalt_app import sweeps

    if sweep_id:
        sweep = sweeps.sweep_get(sweep_id.strip())
    else:
        found = sweeps.sweep_list(1, name=experiment)
        if not found:
            named = f" of {experiment!r}" if experiment else ""
            return result(
                f"No sweep{named} yet: declare experiment(..., variants={{...}}) and run it.",
                {"sweeps": []},
            )
        sweep = found[0]
    data = sweeps.summary(sweep)
    lines = [f"Sweep {data['name']} ({data['id']}), {len(data['variants'])} variants:"]
    lines.append(data["verdict"])
    for row in data["variants"]:
        lines.append("  " + variant_line(row))
    if not data.get("complete", True):
        lines.append(f"Unfinished: resume with `cobalt run --resume {data['id']}`.")
    recent = [
        {"id": s.id, "name": s.name, "created": s.created_at.isoformat()}
        for s in sweeps.sweep_list(SWEEPS_LISTED)
    ]
    return result("\n".join(lines), {**data, "recentSweeps": recent})


def variant_line(row: dict[str, Any]) -> str:
    test = row.get("vsBest") or {}
    verdict = "best" if row["isBest"] else test.get("verdict", "not enough data")
    if test.get("pHolm") is not None:
        verdict += f" (Δ {test['delta']:+.3f}, Holm p {test['pHolm']:.3g})"
    score = "—" if row["meanScore"] is None else f"{row['meanScore']:.3f}"
    text = (
        f"#{row['rank']} {row['label']}: mean {score}, cost ${row['cost']:.4f}, "
        f"p50 {row['latencyP50'] or 0:.0f} ms, errors {row['errors']} → {verdict}"
    )
    if row["pareto"]:
        text += " [Pareto]"
    if row["meanScore"] is None and row.get("firstError"):
        text += f"; first error: {row['firstError']}"
    return text
