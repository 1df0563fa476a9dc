"""The failures view groups errors whose texts differ only in numbers and ids (an order id in
each message): one row with a count, not 25 rows before the first judged failure."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.test_pages import keys, make_run

pytestmark = pytest.mark.django_db


def test_errors_that_differ_only_in_ids_are_one_row(client=None):
    client = Client(HTTP_HOST="127.0.0.1")
    errors = {f"k{i:03d}": f"TimeoutError: refund timed out for o{i:03d}" for i in (0, 8, 16)}
    errors |= {"k020": "KeyError: 'a'", "k021": "KeyError: 'b'"}
    run = make_run(keys=keys(24), errors=errors, evaluators=("judge",))
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert page.count('class="item-row error-group') == 3  # the timeouts, 'a', 'b'
    assert ">TimeoutError: refund timed out for o000</a>" in page  # opens #1
    assert '<span class="group-count">3 × </span><a class="group-first"' in page
    assert "(and alike: the texts differ in numbers or ids)" in page
    assert page.count("(and alike") == 1  # KeyError 'a' and 'b' differ in more than an id
    # A group's items are listed under it, in order.
    for number in (1, 9, 17):
        assert f'href="/runs/{run.id}/items/{number}/?view=failures"' in page


def test_without_judged_failures_the_skip_link_opens_the_first_error(client=None):
    client = Client(HTTP_HOST="127.0.0.1")
    errors = {f"k{i:03d}": f"TimeoutError: refund timed out for o{i:03d}" for i in (2, 8)}
    run = make_run(keys=keys(10), errors=errors, evaluators=("judge",))
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert 'href="#first-failure"' in page
    assert (
        f'<a class="group-first" id="first-failure" href="/runs/{run.id}/items/3/?view=failures"'
        in page
    )  # Tab, Enter, Enter: the first errored item, its failing step marked
