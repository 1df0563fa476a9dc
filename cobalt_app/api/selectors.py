"""Reads shaped for the API: trends from stored run summaries, the experiment catalogue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cobalt.config import Config
from cobalt.errors import NotFoundError
from cobalt_app import launcher, page_selectors, selectors
from cobalt_app.models import JudgeCall, Run
from cobalt_app.results import iso, iter_item_entries

TREND_FIELDS = ("avg", "min", "max", "p50", "p95", "p99", "stddev", "passRate", "count", "errors")


def trend_series(
    *,
    experiment: str | None = None,
    tag: str | None = None,
    evaluator: str | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Per experiment, its latest completed runs oldest first, with each evaluator's statistics
    as stored in the run's summary at finalisation (never aggregated from item rows)."""
    names = [experiment] if experiment else selectors.experiment_names()
    series = []
    for name in names:
        trend = page_selectors.trend(name, tag=tag or "", limit=limit)
        if not trend.runs and not experiment:
            continue
        evaluators = [evaluator] if evaluator else trend.evaluators
        points = []
        for run in trend.runs:
            summary = run.summary or {}
            scores = summary.get("scores") or {}
            points.append(
                {
                    "runId": run.id,
                    "timestamp": iso(run.created_at),
                    "tags": run.tags,
                    "totalItems": summary.get("totalItems", 0),
                    "errors": summary.get("errors", 0),
                    "estimatedCost": summary.get("estimatedCost", 0.0),
                    "avgLatencyMs": summary.get("avgLatencyMs"),
                    "scores": {
                        n: {k: (scores.get(n) or {}).get(k) for k in TREND_FIELDS}
                        for n in evaluators
                        if n in scores
                    },
                }
            )
        series.append({"experiment": name, "evaluators": evaluators, "points": points})
    return series


def experiment_catalogue(config: Config) -> dict[str, Any]:
    """Every experiment file under the test directory and the experiments it registers."""
    experiments, failed, files = launcher.load_experiments(config)
    by_file: dict[Path, list[dict[str, Any]]] = {Path(path): [] for path in files}
    for experiment in experiments:
        by_file.setdefault(Path(str(experiment.file)), []).append(
            {
                "name": experiment.name,
                "tags": experiment.tags,
                "evaluators": [e.name for e in experiment.evaluators],
                "datasetSize": len(experiment.dataset),
                "runs": experiment.runs,
                "concurrency": experiment.concurrency,
                "timeout": experiment.timeout,
            }
        )
    errors = {Path(loaded.path): loaded.error for loaded in failed}
    return {
        "testDir": relative(config.test_dir, config.project_dir),
        "files": [
            {
                "file": relative(path, config.project_dir),
                "experiments": found,
                "error": errors.get(path),
            }
            for path, found in by_file.items()
        ],
    }


def relative(path: Path, root: Path) -> str:
    """Relative to the project, by the name it has there (a link leading out keeps its own)."""
    for candidate in (path, path.resolve()):
        try:
            return candidate.relative_to(root.resolve()).as_posix()
        except ValueError:
            continue
    return str(path)


def item_detail(run: Run, item_id: int) -> dict[str, Any]:
    """One item of the run as the items list gives it, each LLM-judged evaluation with the
    judge's own call (`judgeCall`: what it was sent and answered, capped, redacted)."""
    entry = next(iter_item_entries(run, ids=[item_id], with_id=True), None)
    if entry is None:
        raise NotFoundError(f"run {run.id} has no item {item_id}")
    calls = dict(JudgeCall.objects.filter(item_id=item_id).values_list("evaluator", "data"))
    for name, evaluation in entry["evaluations"].items():
        if name in calls:
            evaluation["judgeCall"] = calls[name]
    return entry
