"""What a finished run's pages would otherwise count on every visit, stored or found cheaply
(issue 41, pages at a million traced items): the run page's histogram stored at finalisation,
its error groups read through the status index, and Wilcoxon's test of a big compare ranked
from one sort."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from django.test import Client
from scipy import stats

from cobalt import significance
from cobalt_app import page_triage, run_figures
from cobalt_app.models import Run, RunFigures
from cobalt_app.score_tables import judged_failures
from tests.test_pages import keys, make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def client() -> Client:
    return Client(HTTP_HOST="127.0.0.1")


def histogram_of(page: str) -> dict[str, list[int]]:
    charts = json.loads(re.search(r'id="run-charts"[^>]*>(.*?)</script>', page, re.S).group(1))
    return {s["label"]: s["values"] for s in charts["histogram"]["series"]}


def test_a_finished_run_stores_its_histogram_and_its_page_reads_it(client):
    run = make_run(keys=keys(4), scores={"k000": {"exact": 0.0, "judge": 0.25}})
    stored = RunFigures.objects.get(run=run).histogram
    assert stored == run_figures.count_histogram(run.id, ["exact", "judge"])
    assert stored["judge"] == [0, 0, 1] + [0] * 6 + [3]
    # The page shows what was stored, not a count of the verdicts: a changed row shows.
    RunFigures.objects.filter(run=run).update(histogram={"exact": [4] + [0] * 9, "judge": [9] * 10})
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert histogram_of(page) == {"exact": [4] + [0] * 9, "judge": [9] * 10}


def test_a_run_finalised_before_the_table_has_its_histogram_counted_once(
    client, django_assert_num_queries
):
    run = make_run(keys=keys(3), scores={"k001": {"judge": 0.5}})
    RunFigures.objects.filter(run=run).delete()
    # Nothing failed, so the page reads no rows: 10 queries, and 2 more on the first visit
    # (the count and its row stored).
    with django_assert_num_queries(12):
        first = client.get(f"/runs/{run.id}/").content.decode()
    with django_assert_num_queries(10):
        again = client.get(f"/runs/{run.id}/").content.decode()
    assert histogram_of(first) == histogram_of(again)
    assert histogram_of(again)["judge"] == [0] * 5 + [1] + [0] * 3 + [2]


def test_a_running_run_counts_its_histogram_on_each_visit(client):
    run = make_run(keys=keys(3), finish=False, done=2)
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert histogram_of(page)["exact"] == [0] * 9 + [2]
    assert not RunFigures.objects.filter(run=run).exists()
    assert Run.objects.get(id=run.id).status == Run.Status.RUNNING


def test_error_groups_keep_the_items_in_index_order():
    run = make_run(keys=keys(6), errors={"k004": "boom", "k001": "boom", "k003": "other"})
    groups = page_triage.error_groups(run)
    assert [(g.error, [number for _, number, _ in g.items]) for g in groups] == [
        ("boom", [2, 5]),
        ("other", [4]),
    ]


@pytest.mark.parametrize("kind", ["ties", "continuous", "few values", "one sided"])
def test_wilcoxon_of_many_pairs_is_scipys_from_one_sort(kind):
    rng = np.random.default_rng(len(kind))
    n = significance.WILCOXON_SORTED_FROM + 1234
    differences = {
        "ties": np.round(rng.normal(0.01, 0.2, n), 3),
        "continuous": rng.normal(0.0, 1.0, n),
        "few values": rng.integers(-3, 4, n) / 10,
        "one sided": np.abs(np.round(rng.normal(0.0, 0.1, n), 2)),
    }[kind]
    expected = stats.wilcoxon(differences, zero_method="wilcox", alternative="two-sided").pvalue
    found = significance.wilcoxon(differences)
    assert found == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_each_evaluators_failures_are_stored_in_order_and_paged_from_it(
    client, django_assert_num_queries
):
    scores = {
        f"k{i:03d}": {"judge": 0.1 * (i % 5), "exact": 0.0 if i % 3 else 1.0} for i in range(9)
    }
    run = make_run(keys=keys(9), scores=scores, errors={"k007": "boom"})
    for name in ("judge", "exact"):
        expected = list(judged_failures(run, name).values_list("item_id", flat=True))
        assert run_figures.failing_order(run, name) == expected and expected
    # errors (grouped), the stored order, rows, scores — no ranking of the verdicts
    with django_assert_num_queries(4):
        stored = page_triage.failure_page(run, evaluator="judge", per_page=3, page=2)
    # Figures stored by an older Cobalt (a histogram, no orders): the first visit ranks every
    # evaluator's failures and stores them; the next ones read them.
    RunFigures.objects.filter(run=run).update(failing_at={}, failing_orders=b"")
    ranked = page_triage.failure_page(run, evaluator="judge", per_page=3, page=2)
    assert [row.key for row in stored.rows] == [row.key for row in ranked.rows]
    assert stored.total == ranked.total
    with django_assert_num_queries(4):
        again = page_triage.failure_page(run, evaluator="exact", per_page=3, page=2)
    assert again.total == len(judged_failures(run, "exact")) + 1  # and k007's error
    # No figures at all: the same, with the histogram counted once too.
    RunFigures.objects.filter(run=run).delete()
    assert run_figures.failing_order(run, "judge") == list(
        judged_failures(run, "judge").values_list("item_id", flat=True)
    )
    assert RunFigures.objects.get(run=run).histogram["judge"]
    with django_assert_num_queries(4):
        page_triage.failure_page(run, evaluator="judge", per_page=3, page=2)
    assert page_triage.failure_ids(run, "exact") == page_triage.failure_ids(run, "exact")
