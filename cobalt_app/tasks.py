"""Celery tasks of team mode: ids in, the work in `worker_runtime` (the engine's functions).

`acks_late` with idempotent claims: a message delivered twice finds its item taken or done.
"""

from celery import shared_task

from cobalt_app import worker_runtime

TASK_OPTIONS = {"acks_late": True, "reject_on_worker_lost": True, "ignore_result": True}


@shared_task(name="cobalt.execute_item", **TASK_OPTIONS)
def execute_item(item_id: int) -> str:
    """Claim one item of a run, run the agent and the evaluators, record it."""
    return worker_runtime.current().execute(item_id)


@shared_task(name="cobalt.rejudge_item", **TASK_OPTIONS)
def rejudge_item(item_id: int) -> str:
    """Claim one item of a re-judge run and score its stored output again."""
    return worker_runtime.current().rejudge(item_id)
