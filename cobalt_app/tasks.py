"""Celery tasks of team mode: ids in, the work in `worker_runtime` (the engine's functions).

`acks_late` with idempotent claims: a message delivered twice finds its items taken or done.
"""

from celery import shared_task

from cobalt_app import worker_runtime

TASK_OPTIONS = {"acks_late": True, "reject_on_worker_lost": True, "ignore_result": True}


@shared_task(name="cobalt.execute_items", **TASK_OPTIONS)
def execute_items(run_id: str, item_ids: list[int], then: int) -> str:
    """A lane of a run: claim these items, run the agent and the evaluators on each, record
    them; then claim the run's next pending items, `then` at a time, until none is left."""
    return worker_runtime.current().execute(run_id, item_ids, then)


@shared_task(name="cobalt.rejudge_items", **TASK_OPTIONS)
def rejudge_items(run_id: str, item_ids: list[int], then: int) -> str:
    """A lane of a re-judge run: score the stored outputs again, item after item."""
    return worker_runtime.current().rejudge(run_id, item_ids, then)
