"""Stored summaries count each evaluator's pass rate at its own pass mark (`cobalt.verdict`).

Summaries stored before counted every pass rate at 0.5. Only the evaluators that declare
another `pass_threshold` need work: their `passRate` is counted again from the stored
evaluations (one aggregate query per such evaluator) and `passMark` is set beside it. Every
other summary already counts 0.5, its evaluators' mark, and reads as `passMark` 0.5 without
it. Score tables' `failing` counts were counted at each evaluator's mark already.
"""

from django.db import migrations
from django.db.models import Count, Q

from cobalt.verdict import DEFAULT_PASS_THRESHOLD, pass_marks


def recount_pass_rates(apps, schema_editor):
    Run = apps.get_model("cobalt_app", "Run")
    Evaluation = apps.get_model("cobalt_app", "Evaluation")
    runs = Run.objects.exclude(summary={}).only("id", "config", "summary")
    for run in runs.iterator(chunk_size=200):
        marks = pass_marks((run.config or {}).get("evaluators", []))
        scores = (run.summary or {}).get("scores") or {}
        changed = False
        for name, mark in marks.items():
            values = scores.get(name)
            if mark == DEFAULT_PASS_THRESHOLD or not isinstance(values, dict):
                continue
            scored = Q(status="ok", score__isnull=False)
            counted = Evaluation.objects.filter(run_id=run.id, evaluator=name).aggregate(
                count=Count("id", filter=scored),
                passed=Count("id", filter=scored & Q(score__gte=mark)),
            )
            values["passRate"] = counted["passed"] / counted["count"] if counted["count"] else None
            values["passMark"] = mark
            changed = True
        if changed:
            Run.objects.filter(id=run.id).update(summary=run.summary)


class Migration(migrations.Migration):
    dependencies = [
        ("cobalt_app", "0007_labels"),
    ]

    operations = [
        migrations.RunPython(recount_pass_rates, migrations.RunPython.noop, elidable=True),
    ]
