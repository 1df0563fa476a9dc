"""Celery tasks of team mode: ids in, the work in `worker_runtime` (the engine's functions).

`acks_late` with idempotent claims: a message delivered twice finds its items taken or done.
"""

from celery import shared_task

from cobalt_app import worker_runtime

TASK_OPTIONS = {"acks_late": True, "reject_on_worker_lost": True, "ignore_result": True}


@shared_task(name="cobalt.execute_items", **TASK_OPTIONS)
def execute_items(item_ids: list[int]) -> str:
    """Claim items of a run, run the agent and the evaluators on each, record them."""
    return worker_runtime.current().execute(item_ids)


@shared_task(name="cobalt.rejudge_items", **TASK_OPTIONS)
def rejudge_items(item_ids: list[int]) -> str:
    """Claim items of a re-judge run and score their stored outputs again."""
    return worker_runtime.current().rejudge(item_ids)
