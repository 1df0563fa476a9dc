"""Compare N runs: the per-item table's filter and sort apply to a chosen run's column or
to any of them ("changed in any"), and the side by side's j/k walk the same rows."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from tests.test_compare_page import kinds
from tests.test_pages import keys, make_run, pair_rows, target

db = pytest.mark.django_db


@pytest.fixture
def client() -> Client:
    return Client(HTTP_HOST="127.0.0.1")


def three_runs() -> tuple:
    """B lowers k001; B2 lowers k004 further, errors on k005 and lacks k002."""
    a = make_run(keys=keys(6), evaluators=("judge",))
    b = make_run(keys=keys(6), evaluators=("judge",), scores={"k001": {"judge": 0.2}})
    c = make_run(
        keys=[k for k in keys(6) if k != "k002"],
        evaluators=("judge",),
        scores={"k004": {"judge": 0.1}},
        errors={"k005": "RuntimeError: boom"},
    )
    return a, b, c


def row_keys(page: str) -> list[str]:
    return [key for key, _ in pair_rows(page)]


@db
def test_the_filter_and_sort_follow_the_column_asked_for(client, django_assert_num_queries):
    a, b, c = three_runs()
    url = f"/compare/?a={a.id}&b={b.id}&b={c.id}"
    by_b = client.get(f"{url}&change=regressed").content.decode()
    assert row_keys(by_b) == ["k001"]
    assert "filtered and sorted by B1" in by_b
    by_b2 = client.get(f"{url}&change=regressed&over=2").content.decode()
    assert row_keys(by_b2) == ["k005", "k004"]  # a new error falls furthest
    assert '<option value="2" selected>B2</option>' in by_b2
    row = re.search(r"<bdi>k005</bdi>.*?</tr>", by_b2, re.S)[0]
    assert "no change" in row and "new error" in row  # in B, then in B2
    # Three runs, recent runs, item numbers, two calibration label reads, the fields to group
    # by: the score tables are kept from the visits before, whichever column the filter
    # applies to.
    with django_assert_num_queries(8):
        anywhere = client.get(f"{url}&change=regressed&over=any").content.decode()
    assert row_keys(anywhere) == ["k005", "k004", "k001"]
    assert "filtered and sorted over every run" in anywhere
    # The counts are over every run too: two keys scored down somewhere.
    assert '<option value="score-down" >score down (2)</option>' in anywhere
    changed = client.get(f"{url}&change=changed&over=any&sort=key", **target("pairs"))
    assert row_keys(changed.content.decode()) == ["k001", "k004", "k005"]
    assert "regressed or improved (3)" in changed.content.decode()


@db
def test_a_key_the_first_b_lacks_still_shows_in_another_column(client):
    a, b, c = three_runs()
    b_missing = make_run(keys=[k for k in keys(6) if k != "k003"], evaluators=("judge",))
    page = client.get(
        f"/compare/?a={a.id}&b={b_missing.id}&b={c.id}&over=2&sort=key"
    ).content.decode()
    assert "k003" in [key for key, _ in kinds(page)] or "<bdi>k003</bdi>" in page
    row = re.search(r"<bdi>k003</bdi>.*?</tr>", page, re.S)[0]
    assert "not in B" in row and "no change" in row  # absent from B, unchanged in B2
    assert "k002" not in row_keys(page)  # B2 lacks it: not in B2's table
    assert 'class="pair-row change-none"' in page


@db
def test_j_and_k_in_the_side_by_side_walk_the_rows_over_every_run(client):
    a, b, c = three_runs()
    among = f"{b.id},{c.id}"
    listing = client.get(f"/compare/?a={a.id}&b={b.id}&b={c.id}&change=regressed&over=any")
    assert f"over=any&amp;among={b.id}%2C{c.id}" in listing.content.decode()
    side = client.get(
        f"/compare/item/?a={a.id}&b={b.id}&change=regressed&over=any&among={among}&key=k004"
    ).content.decode()
    assert 'data-step="prev"' in side and "key=k005" in side and "key=k001" in side
    back = f'href="/compare/?a={a.id}&amp;b={b.id}&amp;b={c.id}&amp;evaluator='
    assert back in side  # the breadcrumb leads back to all the columns
    # Over B alone, k004 did not regress: it has no neighbours there.
    alone = client.get(
        f"/compare/item/?a={a.id}&b={b.id}&change=regressed&key=k004"
    ).content.decode()
    assert 'data-step="' not in alone
