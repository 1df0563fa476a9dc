"""The reads every door shares: an experiment's history, the newest run of each experiment,
a run's failed items, low scores and evaluation errors, each one query."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from cobalt_app import selectors
from cobalt_app.models import Run
from tests.test_pages import keys, make_run

pytestmark = pytest.mark.django_db


def ago(minutes: int):
    return timezone.now() - timedelta(minutes=minutes)


def test_an_experiments_history_answers_the_baseline_the_previous_run_and_watch(
    django_assert_num_queries,
):
    oldest = make_run("qa", keys=keys(1), created_at=ago(30))
    failed = make_run("qa", keys=keys(1), created_at=ago(20))
    Run.objects.filter(id=failed.id).update(status=Run.Status.FAILED)
    rejudged = make_run("qa", keys=keys(1), created_at=ago(10))
    Run.objects.filter(id=rejudged.id).update(parent=oldest)
    running = make_run("qa", keys=keys(1), finish=False, created_at=ago(5))
    make_run("other", keys=keys(1), created_at=ago(1))

    with django_assert_num_queries(1):
        everything = [run.id for run in selectors.experiment_runs("qa")]
    assert everything == [running.id, rejudged.id, failed.id, oldest.id]
    finished = selectors.experiment_runs("qa", statuses=Run.FINISHED, rejudged=False)
    assert [run.id for run in finished] == [failed.id, oldest.id]  # what watch compares
    assert selectors.latest_run("qa").id == rejudged.id  # the newest completed: a baseline
    assert selectors.latest_run("qa", exclude=rejudged.id).id == oldest.id
    assert selectors.previous_run(running).id == rejudged.id  # whatever its status
    assert selectors.previous_run(oldest) is None


def test_the_newest_finished_run_of_each_experiment_is_one_query(django_assert_num_queries):
    make_run("qa", keys=keys(1), created_at=ago(30))
    newest_qa = make_run("qa", keys=keys(1), created_at=ago(20))
    make_run("qa", keys=keys(1), finish=False, created_at=ago(1))  # still running
    other = make_run("other", keys=keys(1), created_at=ago(10))

    with django_assert_num_queries(1):
        latest = [(run.name, run.id) for run in selectors.latest_runs()]
    assert latest == [("other", other.id), ("qa", newest_qa.id)]
    assert [run.id for run in selectors.latest_runs(limit=1)] == [other.id]


def test_failed_items_are_one_read_for_the_page_the_reporter_and_the_mcp_summary(
    django_assert_num_queries,
):
    errors = {"k004": "ValueError: four", "k001": "RuntimeError: one"}
    run = make_run(keys=keys(6), errors=errors, evaluators=("judge",))
    selectors.run_items(run).filter(item_key="k003").update(status="timeout", traceback="")

    with django_assert_num_queries(1):
        failed = [(i.item_key, i.status, i.error) for i in selectors.failed_items(run)]
    assert failed == [
        ("k001", "error", "RuntimeError: one"),
        ("k003", "timeout", ""),
        ("k004", "error", "ValueError: four"),
    ]
    traced = selectors.failed_items(run, statuses=["error"], traced=True)
    assert [(i.item_index, i.traceback.splitlines()[-1]) for i in traced] == [
        (1, "  RuntimeError: one"),
        (4, "  ValueError: four"),
    ]


def test_low_scores_and_evaluation_errors_read_in_item_order(django_assert_num_queries):
    scores = {
        "k002": {"exact": 0.2, "judge": None},
        "k000": {"exact": 0.1, "judge": 0.9},
        "k001": {"judge": None},
    }
    run = make_run(keys=keys(3), scores=scores, runs=2)

    with django_assert_num_queries(1):
        low = selectors.low_scores(run, 0.5)
    assert low == {"exact": (2, [0, 2])}  # each item once, whatever its repetitions
    assert selectors.low_scores(run, 0.5, shown=1) == {"exact": (2, [0])}
    with django_assert_num_queries(1):
        first = selectors.evaluation_errors(run).first()
    assert first == ("judge", "judge replied prose for k001")
