"""A run whose items ran several times: one row per item in every view, worst first, and the
item panel's tab per repeat (opening on the worst) with a passing repeat against a failing one."""

from __future__ import annotations

import re

import pytest

from cobalt_app.models import ItemResult, Run
from tests.test_pages import keys, make_run, row_keys, target

pytestmark = pytest.mark.django_db


@pytest.fixture
def client():
    from django.test import Client

    return Client(HTTP_HOST="127.0.0.1")


@pytest.fixture
def run() -> Run:
    """Four items, three repeats each: k000 passes every time, k001 fails every time, k002
    fails its second repeat only (with another answer), k003 crashes every time."""
    run = make_run(
        keys=keys(4),
        runs=3,
        evaluators=("judge",),
        scores={"k001": {"judge": 0.0}, "k002#1": {"judge": 0.2}},
        errors={"k003": "RuntimeError: boom"},
    )
    ItemResult.objects.filter(run=run, item_key="k002", run_index=1).update(
        output="a wrong answer k002"
    )
    return run


def passes(html: str) -> list[str]:
    return re.findall(r'class="repeat-passes passes-\w+"[^>]*>([^<]+)<', html)


def number(run: Run, key: str) -> int:
    return ItemResult.objects.filter(run=run, item_key=key).first().number


def test_the_failures_list_one_row_per_item_with_no_passing_repeat_first(
    client, run, django_assert_num_queries
):
    # run, failed repeats, failing verdicts, repeat counts, rows, scores, flaky marks (2),
    # the dataset's field names (to filter and group by)
    with django_assert_num_queries(9):
        page = client.get(f"/runs/{run.id}/", **target("items")).content.decode()
    assert row_keys(page) == ["k003", "k001", "k002"]  # a crash is worse than a low score
    assert passes(page) == ["0 of 3 passed", "0 of 3 passed", "2 of 3 passed"]
    assert "Items 1–3 of 3" in page
    # The row shows the worst repeat: k002's second one, and its link opens that repeat.
    k002 = page[page.index("k002") :]
    assert "judge: judge says k002 &lt;b&gt;ok&lt;/b&gt;" in k002
    assert f'href="/runs/{run.id}/items/{number(run, "k002")}/?repeat=2&amp;view=failures"' in page


def test_every_item_view_and_filter_shows_one_row_per_item(client, run, django_assert_num_queries):
    # run, count, page indexes, rows, scores, flaky (2), field names
    with django_assert_num_queries(8):
        everything = client.get(f"/runs/{run.id}/?view=all", **target("items")).content.decode()
    assert row_keys(everything) == ["k000", "k001", "k002", "k003"]
    assert passes(everything) == ["3 of 3 passed", "0 of 3 passed", "2 of 3 passed"] + [
        "0 of 3 passed"
    ]
    # run, matching item indexes, rows, scores, flaky (2), field names
    with django_assert_num_queries(7):
        low = client.get(
            f"/runs/{run.id}/?view=all&evaluator=judge&max=0.4", **target("items")
        ).content.decode()
    assert row_keys(low) == ["k001", "k002"] and "Items 1–2 of 2" in low
    by_score = client.get(f"/runs/{run.id}/?sort=score:judge", **target("items")).content
    assert row_keys(by_score.decode()) == ["k001", "k002", "k000", "k003"]
    newest = client.get(f"/runs/{run.id}/?sort=-index", **target("items")).content
    assert row_keys(newest.decode()) == ["k003", "k002", "k001", "k000"]
    crashed = client.get(f"/runs/{run.id}/?status=error", **target("items")).content.decode()
    assert row_keys(crashed) == ["k003"] and passes(crashed) == ["0 of 3 passed"]


def test_the_item_panel_opens_on_the_worst_repeat_with_a_tab_per_repeat(
    client, run, django_assert_num_queries
):
    first = number(run, "k002")
    # run, item (and trace), evaluations, repeats, their evaluations, the compared outputs,
    # the worst repeat and its evaluations, previous, next
    with django_assert_num_queries(10):
        page = client.get(f"/runs/{run.id}/items/{first}/").content.decode()
    assert '<h2 id="item-title">Item #3 · repeat 2 of 3</h2>' in page
    assert '<strong id="repeat-label">repeat 2 of 3 · failed</strong>' in page
    tabs = re.findall(r'<a class="repeat-tab repeat-(\w+)" href="([^"]+)"([^>]*)>([^<]+)</a>', page)
    assert [(verdict, label) for verdict, _, _, label in tabs] == [
        ("pass", "repeat 1 of 3 · passed"),
        ("fail", "repeat 2 of 3 · failed"),
        ("pass", "repeat 3 of 3 · passed"),
    ]
    assert [href for _, href, _, _ in tabs] == [
        f"/runs/{run.id}/items/{first}/?repeat={n}" for n in (1, 2, 3)
    ]
    assert 'aria-current="page"' in tabs[1][2] and "aria-current" not in tabs[0][2]
    assert re.search(r'<pre class="output" id="item-output"[^>]*>a wrong answer k002</pre>', page)
    # The failing repeat against the first passing one: reasons, then the output's words.
    assert "between repeat 1 (passed) and repeat 2 (failed)" in page
    diff = re.search(r'<pre class="diff" id="repeat-output-diff"[^>]*>(.*?)</pre>', page, re.S)[1]
    assert diff == "<ins>a wrong </ins>answer k002"
    assert re.search(r"score-fail\">0.20</span> judge says k002", page)


def test_a_repeat_asked_for_opens_with_the_failing_one_to_compare(client, run):
    first = number(run, "k002")
    page = client.get(f"/runs/{run.id}/items/{first}/?repeat=3").content.decode()
    assert '<strong id="repeat-label">repeat 3 of 3 · passed</strong>' in page
    assert "between repeat 3 (passed) and repeat 2 (failed)" in page
    panel = client.get(f"/runs/{run.id}/items/{first}/?repeat=2", **target("panel"))
    html = panel.content.decode()
    assert html.lstrip().startswith("<dialog")  # the panel alone, over the run's page
    assert f'hx-get="/runs/{run.id}/items/{first}/?repeat=1"' in html
    # A crashed item: each tab says so, and there is no passing repeat to compare with.
    crashed = client.get(f"/runs/{run.id}/items/{number(run, 'k003')}/").content.decode()
    assert "repeat 1 of 3 · error" in crashed and 'id="repeat-diff"' not in crashed
    # An unknown repeat number opens the worst, as no number does.
    again = client.get(f"/runs/{run.id}/items/{first}/?repeat=9").content.decode()
    assert '<strong id="repeat-label">repeat 2 of 3 · failed</strong>' in again


def test_an_item_that_ran_once_has_no_tabs(client):
    single = make_run(keys=keys(2), evaluators=("judge",))
    page = client.get(f"/runs/{single.id}/items/{number(single, 'k001')}/").content.decode()
    assert "repeat-tabs" not in page and '<h2 id="item-title">Item #2</h2>' in page


def test_previous_and_next_step_from_item_to_item_not_from_repeat_to_repeat(client, run):
    page = client.get(f"/runs/{run.id}/items/{number(run, 'k002')}/?repeat=2").content.decode()
    assert f'rel="prev" href="/runs/{run.id}/items/{number(run, "k001")}/"' in page
    assert f'rel="next" href="/runs/{run.id}/items/{number(run, "k003")}/"' in page


def test_the_runs_list_and_the_run_page_count_items_and_repeats_apart(client, run):
    once = make_run("once", keys=keys(2))
    listed = client.get("/").content.decode()
    cells = dict(
        re.findall(r'href="/runs/(\w+)/".*?<td class="num"[^>]*>([^<]+)</td>', listed, re.S)
    )
    assert (cells[run.id], cells[once.id]) == ("4 × 3", "2")
    assert 'title="12 results: each item ran 3 times">4 × 3<' in listed
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert '<span id="progress-count">12 / 12 results: 4 items × 3</span>' in page
    assert '<dt>Items</dt><dd title="12 results: each item ran 3 times">4 × 3</dd>' in page
    single = client.get(f"/runs/{once.id}/").content.decode()
    assert '<span id="progress-count">2 / 2 items</span>' in single
    assert "<dt>Items</dt><dd>2</dd>" in single
