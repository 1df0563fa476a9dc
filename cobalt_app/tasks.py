"""Celery tasks of team mode: ids in, the work in `worker_runtime` (the lane of `runs.lane`).

`team` sends them by name (`team.RUN_LANE`) after commit; only workers import this module.
`acks_late` with idempotent claims: a message delivered twice finds its items taken or done.
"""

from celery import shared_task

from cobalt_app import worker_runtime
from cobalt_app.team import RUN_LANE

TASK_OPTIONS = {"acks_late": True, "reject_on_worker_lost": True, "ignore_result": True}


@shared_task(name=RUN_LANE, **TASK_OPTIONS)
def run_lane(run_id: str, item_ids: list[int], then: int) -> str:
    """A lane of a run: claim these items, execute (or, for a re-judge, re-score) each and
    record them; then claim the run's next pending items, `then` at a time, for a bounded
    time, and enqueue the lane's continuation if items are left."""
    return worker_runtime.current().lane(run_id, item_ids, then)
