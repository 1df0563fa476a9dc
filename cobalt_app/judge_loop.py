"""The alignment loop: where a judge and the reviewers disagree, and how far they agree.

`cobalt calibrate JUDGE [--run RUN]`, the MCP tool `cobalt_judge_disagreements` and the API read
`judge_report`: the run (given, else the latest finished run that has the judge), the
judge's calibration (`cobalt_app.calibration`: labels pooled over the runs with the same
judge key, κ with its interval, TPR/TNR lower bounds, the certificate), and
every disagreement with what a person or a coding agent needs to fix the prompt: the input,
the output, the judge's score and reason, the reviewer's label and note. Edit the prompt,
`cobalt rejudge RUN --evaluator JUDGE --labelled`, then calibrate the new run: κ moves.
"""

from __future__ import annotations

import json
from typing import Any

from cobalt.errors import CobaltError, NotFoundError
from cobalt_app import labels
from cobalt_app.calibration import evaluator_calibration
from cobalt_app.models import Evaluation, ItemResult, Label, Run
from cobalt_app.selectors import run_get

RECENT_RUNS = 200  # runs searched for a judge when no run is named
TEXT_SHOWN = 4_000  # characters of each input, output, reason and note


class JudgeNotFound(NotFoundError):
    """No run has an evaluator of that name; the message lists the known ones."""


class NoLabels(CobaltError):
    """The judge has no current labels on the run; the message says how to label."""

    field = "judge"


def judge_run(judge: str, run_id: str | None = None) -> Run:
    """The run to calibrate `judge` on: `run_id`, else the latest finished run that has it."""
    if run_id:
        run = run_get(run_id)
        if judge not in run.evaluator_names:
            raise JudgeNotFound(
                f"run {run.id} ({run.name}) has no evaluator {judge!r}; its evaluators: "
                f"{', '.join(run.evaluator_names) or 'none'}"
            )
        return run
    known: dict[str, None] = {}
    runs = Run.objects.filter(status=Run.Status.COMPLETED).order_by("-created_at")
    for run in runs[:RECENT_RUNS]:
        if judge in run.evaluator_names:
            return run
        known |= dict.fromkeys(run.evaluator_names)
    raise JudgeNotFound(
        f"no finished run has an evaluator named {judge!r}; "
        + (f"known judges: {', '.join(sorted(known))}" if known else "no finished runs yet")
    )


def how_to_label(run: Run, judge: str) -> str:
    return (
        f"no labels of {judge!r} on run {run.id} ({run.name}) yet: label items on the review "
        f"page (`cobalt dashboard`, run {run.id} → Review), or import a file with "
        f"`cobalt labels import FILE` (rows of run, itemKey, evaluator, verdict, note)"
    )


def judge_report(judge: str, run_id: str | None = None) -> dict[str, Any]:
    """The agreement of `judge` with the run's current labels, and every disagreement."""
    run = judge_run(judge, run_id)
    rows = labels.run_labels(run, evaluator=judge, stale=False)
    if not rows:
        raise NoLabels(how_to_label(run, judge))
    calibration = evaluator_calibration(run.id, judge)
    return {
        "judge": judge,
        "run": run.id,
        "experiment": run.name,
        "labels": len(rows),
        "judgeKey": calibration.judge_key,
        "runsPooled": calibration.runs,
        "agreement": calibration.agreement.as_dict(),
        "calibration": calibration.as_dict(),
        "disagreements": _details(run, judge, [row for row in rows if row.disagrees]),
    }


def _details(run: Run, judge: str, rows: list[labels.LabelRow]) -> list[dict[str, Any]]:
    ids = [row.item_id for row in rows]
    items = {
        i: (key, item, output)
        for i, key, item, output in ItemResult.objects.filter(id__in=ids).values_list(
            "id", "item_key", "input", "output"
        )
    }
    reasons = dict(
        Evaluation.objects.filter(item_id__in=ids, evaluator=judge).values_list("item_id", "reason")
    )
    found = []
    for row in rows:
        key, item, output = items[row.item_id]
        found.append(
            {
                "item": row.item_index + 1,
                "itemKey": key,
                "input": _cut((item or {}).get("input", item) if isinstance(item, dict) else item),
                "output": _cut(output),
                "judgeScore": row.judge_score,
                "judgeVerdict": str(row.judge_verdict),
                "judgeReason": _cut(reasons.get(row.item_id, "")),
                "label": row.label.verdict,
                "reviewer": row.label.reviewer,
                "note": _cut(row.label.note),
            }
        )
    return found


def _cut(value: Any) -> Any:
    """The value as it is when short; else its text (JSON for a structured output), cut."""
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return value if len(text) <= TEXT_SHOWN else text[: TEXT_SHOWN - 1] + "…"


def judge_versions(experiment: str, *, limit: int = 100) -> list[dict[str, Any]]:
    """κ per judge version (judge key) of an experiment, oldest version first: each version's
    runs (first and last), and its calibration pooled over them (read on its latest run).
    Versions nobody labelled are left out: there is nothing to show for them."""
    from cobalt_app.calibration import run_calibration, run_judge_key
    from cobalt_app.selectors import experiment_runs

    labelled = set(
        Label.objects.filter(experiment=experiment).values_list("evaluator", flat=True).distinct()
    )
    if not labelled:
        return []
    runs = experiment_runs(experiment, statuses=[Run.Status.COMPLETED])
    versions: dict[tuple[str, str], list[Run]] = {}
    for run in runs.defer("failure")[:limit]:  # newest first
        for name in run.evaluator_names:
            key = run_judge_key(run, name) if name in labelled else None
            if key:
                versions.setdefault((name, key), []).append(run)
    rows = []
    for (name, key), found in versions.items():
        calibration = run_calibration(found[0], [name])[name]
        if not calibration.agreement.n:
            continue
        rows.append(
            {
                "evaluator": name,
                "judgeKey": key,
                "runs": len(found),
                "first": found[-1],
                "latest": found[0],
                "kappa": calibration.kappa_text,
                "bounds": calibration.bounds_text,
                "calibrated": calibration.certificate.calibrated,
                "summary": calibration.certificate.summary,
            }
        )
    return sorted(rows, key=lambda row: (row["evaluator"], row["first"].created_at))
