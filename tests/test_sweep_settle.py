"""A sweep is analysed when its last run ends (`sweeps.settle`, from `lifecycle.finalise`),
never on a page view: the page, the API and `summary()` only read. A sweep still running is
shown as far as it got, computed for the request and not stored."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from cobalt import Dataset, Evaluator, load_config
from cobalt_app import sweeps
from cobalt_app.models import ItemResult, Run, Sweep
from cobalt_app.runs import lifecycle
from tests.helpers import define, execute

EVEN = Evaluator(name="even", type="function", fn=lambda c: float(int(c.output) % 2 == 0))


def grid(name: str = "grid", items: int = 8):
    return define(
        name,
        Dataset(items=[{"id": f"g{i}", "n": i} for i in range(items)]),
        lambda ctx: str(ctx.item["n"] * ctx.variant["k"]),
        evaluators=[EVEN],
        variants={"k": [1, 2, 3]},
    )


def page(sweep_id: str, **headers: str) -> str:
    response = Client(HTTP_HOST="127.0.0.1").get(f"/sweeps/{sweep_id}/", **headers)
    assert response.status_code == 200
    return response.content.decode()


def writes(queries: CaptureQueriesContext) -> list[str]:
    return [
        q["sql"] for q in queries.captured_queries if not q["sql"].lstrip().startswith("SELECT")
    ]


@pytest.fixture
def settled(project, transactional_db):
    runs = execute(project, grid())
    return project, runs, Sweep.objects.get()


def test_the_last_runs_finalisation_stores_the_analysis_and_its_file(settled):
    project, runs, sweep = settled
    stored = sweep.summary
    assert stored["complete"] and stored["basis"] == sweeps.basis(sweeps.variant_runs(sweep))
    assert stored["ranking"][0] == "k=2" and sweep.analysed_at is not None
    (written,) = (project.path / ".cobalt" / "results").glob("*_sweep_*.json")
    assert json.loads(written.read_text())["sweep"]["basis"] == stored["basis"]
    # Settling again changes nothing: the stored analysis is the one for these runs.
    assert sweeps.settle([sweep.id], load_config(project.path)) == [stored]
    assert Sweep.objects.get().analysed_at == sweep.analysed_at


def test_a_variant_without_a_finished_run_leaves_the_sweep_unsettled(settled):
    project, runs, sweep = settled
    Sweep.objects.filter(id=sweep.id).update(summary={}, analysed_at=None)
    Run.objects.filter(id=runs[2].id).update(status=Run.Status.RUNNING, finished_at=None)
    assert sweeps.settle([sweep.id], load_config(project.path)) == []
    Run.objects.filter(id=runs[2].id).delete()
    assert sweeps.settle([sweep.id], load_config(project.path)) == []
    assert Sweep.objects.get().summary == {}


def test_the_page_of_a_running_sweep_shows_it_so_far_and_writes_nothing(
    settled, django_assert_num_queries
):
    project, runs, sweep = settled
    before = Sweep.objects.get()
    last = runs[2]
    Run.objects.filter(id=last.id).update(status=Run.Status.RUNNING, finished_at=None)
    ItemResult.objects.filter(run_id=last.id, item_index__gte=4).update(status="pending")
    with CaptureQueriesContext(connection) as queries:
        html = page(sweep.id)
    # the sweep, its runs, the running run's table (items, scores), each run's first outputs
    assert writes(queries) == [] and len(queries) == 7
    assert "Still running (2 of 3 variants finished); so far: Best: k=2" in html
    assert "not completed: k=3" in html
    after = Sweep.objects.get()
    assert (after.summary, after.analysed_at) == (before.summary, before.analysed_at)
    # the sweep, its runs, the running run's table (items, scores) — the finished runs'
    # tables are kept in memory — and each run's first outputs (is a key ignored?)
    with django_assert_num_queries(7):
        sweeps.summary(Sweep.objects.get())

    # Its last item recorded, the run is finalised: now, and only now, the sweep is settled.
    ItemResult.objects.filter(run_id=last.id, status="pending").update(status="ok")
    lifecycle.finalise(last.id, status=Run.Status.COMPLETED, config=load_config(project.path))
    settled_now = Sweep.objects.get()
    assert settled_now.analysed_at > before.analysed_at and settled_now.summary["complete"]
    assert "Still running" not in settled_now.summary["verdict"]


def test_the_page_of_a_settled_sweep_reads_its_stored_analysis_in_a_few_queries(
    settled, django_assert_num_queries
):
    project, runs, sweep = settled
    page(sweep.id)  # the runs' score tables are kept in memory after the first read
    with CaptureQueriesContext(connection) as queries:
        html = page(sweep.id)
    assert (
        writes(queries) == []
        and len(queries) == 2
        and "Best: k=2" in html
        and "Still running" not in html
    )
    with django_assert_num_queries(2):  # the sweep, its runs
        Client(HTTP_HOST="127.0.0.1").get(f"/sweeps/{sweep.id}/", HTTP_HX_REQUEST="true")
    with django_assert_num_queries(2):
        Client(HTTP_HOST="127.0.0.1").get(f"/api/sweeps/{sweep.id}/")


def test_an_analysis_stored_before_analyses_named_their_runs_is_read_while_current(
    settled, django_assert_num_queries
):
    project, runs, sweep = settled
    older = {k: v for k, v in sweep.summary.items() if k != "basis"}
    Sweep.objects.filter(id=sweep.id).update(summary=older)
    stored = Sweep.objects.get()
    with django_assert_num_queries(1):  # its runs
        assert sweeps.summary(stored) == older
    Run.objects.filter(id=runs[0].id).update(finished_at=stored.analysed_at.replace(year=2100))
    assert sweeps.summary(stored)["basis"]  # a run ended after it: computed again
