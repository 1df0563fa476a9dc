"""Triage on a run's page: grouped errors, search, field filters and groups, item addresses by
number that walk the list they were opened from, the skip link and the keyboard help."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from cobalt import Dataset, Evaluator, experiment
from cobalt.experiments import collecting
from cobalt_app import results, services
from cobalt_app.engine import ItemOutcome
from cobalt_app.evaluators import EvalOutcome
from cobalt_app.models import Run

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
XSS = "<script>alert(1)</script>"


@pytest.fixture
def client() -> Client:
    return Client(HTTP_HOST="127.0.0.1")


def make_run(
    items: list[dict[str, Any]],
    *,
    scores: dict[str, dict[str, float | None]] | None = None,
    errors: dict[str, str] | None = None,
    outputs: dict[str, Any] | None = None,
    evaluators: tuple[str, ...] = ("exact", "judge"),
    runs: int = 1,
) -> Run:
    """A finished run written through the services, as the engine writes it."""
    with collecting() as found:
        experiment(
            "triage",
            Dataset(items=items),
            lambda ctx: None,
            evaluators=[Evaluator(name=n, type="function", fn=lambda ctx: 1.0) for n in evaluators],
            runs=runs,
        )
    run = services.run_create(
        experiment=found[0], settings={"runs": runs, "concurrency": 1, "timeout": 30}
    )
    services.run_start(run.id)
    scores, errors, outputs = scores or {}, errors or {}, outputs or {}
    outcomes = []
    for snapshot in services.item_snapshots(run.id):
        key = snapshot.item_key
        wanted = scores.get(f"{key}#{snapshot.run_index}", scores.get(key, {}))
        verdicts = [
            EvalOutcome.failed(n, f"judge replied prose for {key}")
            if wanted.get(n, 1.0) is None
            else EvalOutcome(n, wanted.get(n, 1.0), reason=f"{n} on {key}")
            for n in evaluators
        ]
        failed = key in errors
        outcomes.append(
            ItemOutcome(
                id=snapshot.id,
                item_index=snapshot.item_index,
                run_index=snapshot.run_index,
                item_key=key,
                status="error" if failed else "ok",
                output=None if failed else outputs.get(key, f"answer {key}"),
                metadata={} if failed else {"model": "m"},
                error=errors.get(key, ""),
                latency_ms=100.0,
                finished_at=timezone.now(),
                evaluations=[] if failed else verdicts,
            )
        )
    services.record_item_outcomes(run.id, outcomes)
    results.run_finalise(run.id)
    return Run.objects.get(id=run.id)


def support_items(n: int = 12) -> list[dict[str, Any]]:
    categories = ["refund", "shipping", "login"]
    return [
        {
            "id": f"t{i:02d}",
            "input": f"question {i}",
            "expected": f"answer {i}",
            "category": categories[i % 3],
            "metadata": {"tier": "gold" if i < 4 else "free"},
        }
        for i in range(n)
    ]


def row_keys(html: str) -> list[str]:
    return re.findall(r'<code class="key" title="item key"><bdi>([^<]+)</bdi></code>', html)


def row_links(html: str) -> list[str]:
    return re.findall(r'<a class="open-item" (?:id="first-failure" )?href="([^"]+)"', html)


# The failures view --------------------------------------------------------------------------


def test_identical_errors_are_one_row_with_the_error_once_then_the_most_failed_items(client):
    errors = {f"t{i:02d}": "TimeoutError: the agent hung" for i in (0, 3, 6)}
    errors["t09"] = "ValueError: bad <json>"
    scores = {"t01": {"judge": 0.2}, "t02": {"exact": 0.0, "judge": 0.1}, "t04": {"exact": None}}
    run = make_run(support_items(), errors=errors, scores=scores)
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert page.count('class="item-row error-group') == 2
    assert page.count("TimeoutError: the agent hung") == 1  # once, with its count
    # The error text opens the group's first item: its failing step is one click away.
    assert re.search(
        rf'<span class="group-count">3 × </span><a class="group-first" '
        rf'href="/runs/{run.id}/items/1/\?view=failures"[^>]*>TimeoutError: the agent hung</a>',
        page,
    )
    assert "ValueError: bad &lt;json&gt;" in page and "<json>" not in page
    assert page.index("TimeoutError") < page.index("ValueError")  # the larger group first
    # Judged failures: two evaluators failed t02; t04 (an evaluation error) and t01 one each.
    assert row_keys(page) == ["t02", "t04", "t01"]
    assert '<span class="failed-count">2 of 2 evaluators</span>' in page
    for number in (1, 4, 7):  # the group's items, each with its address
        assert f'href="/runs/{run.id}/items/{number}/?view=failures"' in page


# Search and fields --------------------------------------------------------------------------


def test_search_reads_input_output_expected_and_reasons_ignoring_case(
    client, django_assert_num_queries
):
    items = support_items()
    items[5]["input"] = 'Où est "mon" colis ?'
    run = make_run(
        items,
        outputs={"t07": "I cannot HELP with that"},
        scores={"t08": {"judge": 0.1}, "t07": {"judge": 0.3}},
    )
    url = f"/runs/{run.id}/?view=all&q="

    def found(text: str) -> list[str]:
        return row_keys(client.get(url + text).content.decode())

    assert found("cannot help") == ["t07"]  # output
    assert found("ANSWER 10") == ["t10"]  # expected output
    assert found("où est") == ["t05"] and found('"mon"') == ["t05"]  # non-ASCII, quotes
    assert found("judge on t08") == ["t08"]  # an evaluation's reason
    assert found("nothing like this") == []
    # run, the searched ids (read once: the queries after it do not search again, and they
    # are the page's count and order), rows, scores, flaky marks (2), the fields to filter by
    with django_assert_num_queries(7):
        page = client.get(url + "t0", **HTMX | {"HTTP_HX_TARGET": "items"}).content.decode()
    assert len(row_keys(page)) == 10
    # The finished run's found ids are kept: its next page (or the same again, or its
    # failures) does not search the run again.
    with django_assert_num_queries(6):
        again = client.get(url + "t0", **HTMX | {"HTTP_HX_TARGET": "items"}).content.decode()
    assert row_keys(again) == row_keys(page)
    failing = client.get(f"/runs/{run.id}/?q=t07").content.decode()  # the failures, searched
    assert row_keys(failing) == ["t07"]
    escaped = client.get(f"/runs/{run.id}/?q={XSS}").content.decode()
    assert XSS not in escaped and 'value="&lt;script&gt;alert(1)&lt;/script&gt;"' in escaped


def test_a_field_filter_and_groups_with_pass_rates_show_which_category_fails(
    client, django_assert_num_queries
):
    low = {f"t{i:02d}": {"exact": 0.0} for i in (0, 3, 6)}  # every refund fails exact
    run = make_run(support_items(), scores=low, errors={"t09": "boom"})
    page = client.get(f"/runs/{run.id}/").content.decode()
    offered = re.findall(
        r'<option value="([^"]+)"', page.split('name="key"')[1].split("</select>")[0]
    )
    assert offered == ["category", "metadata.tier", "result.model"]
    refunds = client.get(f"/runs/{run.id}/?view=all&key=category&value=refund").content.decode()
    assert row_keys(refunds) == ["t00", "t03", "t06", "t09"]
    gold = client.get(f"/runs/{run.id}/?view=all&key=metadata.tier&value=gold").content.decode()
    assert row_keys(gold) == ["t00", "t01", "t02", "t03"]
    # run, histogram, calibration labels, errors, the failing items' order, rows, scores,
    # flaky marks (2), the groups' item counts and their verdict counts, the fields, previous
    # run, labels
    with django_assert_num_queries(14):
        grouped = client.get(f"/runs/{run.id}/?group=category").content.decode()
    table = grouped.split('<table class="groups">')[1].split("</table>")[0]
    rows = re.findall(r'<tr>\s*<th scope="row">(.*?)</tr>', table, re.S)
    cells = [re.findall(r'<td class="num[^"]*"[^>]*>([^<]*)', row) for row in rows]
    names = [re.search(r">([^<]+)</a>", row).group(1) for row in rows]
    # refund: 4 items, 1 error, exact passes none of its 3 scored, judge all 3.
    assert dict(zip(names, cells, strict=True)) == {
        "refund": ["4", "1", "0%", "100%"],
        "shipping": ["4", "0", "100%", "100%"],
        "login": ["4", "0", "100%", "100%"],
    }
    assert 'href="?group=category&amp;key=category&amp;value=refund"' in table
    # The finished run's groups are kept: going back to them reads no group again.
    with django_assert_num_queries(12):
        again = client.get(f"/runs/{run.id}/?group=category").content.decode()
    assert again.split('<table class="groups">')[1].split("</table>")[0] == table


# Item addresses and navigation --------------------------------------------------------------


def test_items_are_addressed_by_number_and_old_ids_redirect(client):
    make_run(support_items(6))  # first: the next run's ids are all above its numbers (1–4)
    run = make_run(support_items(4), runs=2, scores={"t01#1": {"judge": 0.0}})
    second = run.items.get(item_index=1, run_index=1)
    page = client.get(f"/runs/{run.id}/items/2/?repeat=2").content.decode()
    assert '<h2 id="item-title">Item #2 · repeat 2 of 2</h2>' in page
    unknown = client.get(f"/runs/{run.id}/items/2/?repeat=9").content.decode()
    assert '<h2 id="item-title">Item #2 · repeat 2 of 2</h2>' in unknown  # on its worst repeat
    assert client.get(f"/runs/{run.id}/items/2/?repeat=0").status_code == 404
    # An id no item of the run has as a number: the item it was, by number (301).
    assert second.id > 4
    old = client.get(f"/runs/{run.id}/items/{second.id}/?view=all")
    assert old.status_code == 301
    assert old["Location"] == f"/runs/{run.id}/items/2/?repeat=2&view=all"
    old_download = client.get(f"/runs/{run.id}/items/{second.id}/download/output")
    assert old_download["Location"] == f"/runs/{run.id}/items/2/download/output?repeat=2"
    download = client.get(f"/runs/{run.id}/items/2/download/output?repeat=2")
    assert download.status_code == 200 and download.content == b"answer t01"
    assert client.get(f"/runs/{run.id}/items/99/").status_code == 404
    other = make_run(support_items(2))  # an old id of another run's item is not this run's
    assert client.get(f"/runs/{other.id}/items/{second.id}/").status_code == 404
    assert client.get(f"/runs/{other.id}/items/{second.id}/download/output").status_code == 404


def test_an_old_id_that_is_also_a_number_is_the_number(client):
    run = make_run(support_items(12))
    first = run.items.order_by("id").first()
    number = min(first.id, 12)
    page = client.get(f"/runs/{run.id}/items/{number}/").content.decode()
    assert f"Item #{number}</h2>" in page


def test_the_panel_walks_the_list_it_came_from(client, django_assert_num_queries):
    errors = {"t00": "boom", "t03": "boom"}
    scores = {"t01": {"judge": 0.2}, "t02": {"exact": 0.0, "judge": 0.1}, "t05": {"judge": 0.4}}
    run = make_run(support_items(), errors=errors, scores=scores)
    failures = client.get(f"/runs/{run.id}/").content.decode()
    assert "<summary>2 items</summary>" in failures  # the two "boom", grouped
    assert row_links(failures)[0] == f"/runs/{run.id}/items/3/?view=failures"
    # The failures: #1 and #4 (grouped), then #3 (two failed), #2 (0.2), #6 (0.4).
    # run, item, evaluations, errors, judged failures, neighbours
    with django_assert_num_queries(6):
        panel = client.get(f"/runs/{run.id}/items/2/?view=failures", **HTMX).content.decode()
    assert '<span class="item-place" id="item-place">4 of 5 failures</span>' in panel
    assert f'rel="prev" href="/runs/{run.id}/items/3/?view=failures"' in panel
    assert f'rel="next" href="/runs/{run.id}/items/6/?view=failures"' in panel
    # The next step reads the list kept for this finished run: run, item, evaluations,
    # neighbours.
    with django_assert_num_queries(4):
        step = client.get(f"/runs/{run.id}/items/6/?view=failures", **HTMX).content.decode()
    assert '<span class="item-place" id="item-place">5 of 5 failures</span>' in step
    # All refunds, searched: next and next failure differ.
    query = "view=all&amp;key=category&amp;value=refund"
    walk = client.get(f"/runs/{run.id}/items/1/?view=all&key=category&value=refund").content
    walk = walk.decode()
    assert "1 of 4 items with category = refund" in walk
    assert f'rel="next" href="/runs/{run.id}/items/4/?{query}"' in walk
    assert f'data-step="next-failure" href="/runs/{run.id}/items/4/?{query}"' in walk
    second = client.get(f"/runs/{run.id}/items/4/?view=all&key=category&value=refund").content
    assert 'data-step="next-failure"' not in second.decode()  # #7 and #10 passed
    # Without JavaScript the crumbs lead back to the same list.
    assert f'<a href="/runs/{run.id}/?{query}">triage' in walk
    # An item not in the list says so, and steps into the list.
    outside = client.get(f"/runs/{run.id}/items/8/?view=failures").content.decode()
    assert "not in this list of 5 failures" in outside
    assert f'rel="next" href="/runs/{run.id}/items/1/?view=failures"' in outside


# Keyboard -----------------------------------------------------------------------------------


def test_the_first_tab_skips_to_the_first_judged_failure_and_help_reads_without_script(client):
    run = make_run(support_items(4), errors={"t00": "boom"}, scores={"t02": {"judge": 0.0}})
    page = client.get(f"/runs/{run.id}/").content.decode()
    body = page.split("<body", 1)[1]
    first_link = re.search(r"<a [^>]*>", body).group(0)
    assert first_link == '<a class="skip-link" href="#first-failure">'
    assert "Skip to the first judged failure" in body
    assert f'id="first-failure" href="/runs/{run.id}/items/3/?view=failures"' in body
    assert '<a class="help-link" href="#keyboard-help" aria-keyshortcuts="?">' in body
    assert '<section id="keyboard-help"' in body and "<kbd>j</kbd>" in body
    everything = client.get(f"/runs/{run.id}/?view=all").content.decode()
    assert '<a class="skip-link" href="#main">Skip to the main content</a>' in everything
