"""Dashboard pages in-process: what each page shows, htmx partials, escaping, query counts."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from django.test import Client
from django.utils import timezone

from cobalt import Dataset, Evaluator, experiment
from cobalt.experiments import collecting
from cobalt_app import results, score_tables, selectors, services
from cobalt_app.engine import ItemOutcome
from cobalt_app.evaluators import EvalOutcome
from cobalt_app.models import Run, RunScoreTable

pytestmark = pytest.mark.django_db

XSS = "<script>alert(1)</script>"
HTMX = {"HTTP_HX_REQUEST": "true"}


def target(name: str) -> dict[str, str]:
    return {**HTMX, "HTTP_HX_TARGET": name}


@pytest.fixture
def client() -> Client:
    return Client(HTTP_HOST="127.0.0.1")


def make_run(
    name: str = "qa",
    *,
    keys: list[str],
    outputs: dict[str, Any] | None = None,
    traces: dict[str, list[dict[str, Any]]] | None = None,
    scores: dict[str, dict[str, float | None]] | None = None,
    errors: dict[str, str] | None = None,
    evaluators: tuple[str, ...] = ("exact", "judge"),
    tags: tuple[str, ...] = (),
    finish: bool = True,
    done: int | None = None,
    created_at=None,
    runs: int = 1,
) -> Run:
    """A run written through the services, as the engine writes it."""
    items = [{"id": key, "input": f"question {key}", "expected": f"answer {key}"} for key in keys]
    with collecting() as found:
        experiment(
            name,
            Dataset(items=items),
            lambda ctx: None,
            evaluators=[Evaluator(name=n, type="function", fn=lambda ctx: 1.0) for n in evaluators],
            tags=list(tags),
            runs=runs,
        )
    run = services.run_create(
        experiment=found[0], settings={"runs": runs, "concurrency": 1, "timeout": 30}
    )
    if created_at is not None:
        Run.objects.filter(id=run.id).update(created_at=created_at)
    services.run_start(run.id)
    outputs, scores, errors = outputs or {}, scores or {}, errors or {}
    outcomes = []
    for snapshot in services.item_snapshots(run.id)[:done]:
        key = snapshot.item_key
        failed = key in errors
        verdicts = []
        # "key#1" overrides the scores of repetition 1 of that key.
        wanted = scores.get(f"{key}#{snapshot.run_index}", scores.get(key, {}))
        for n in evaluators:
            score = wanted.get(n, 1.0)
            if score is None:
                verdicts.append(EvalOutcome.failed(n, f"judge replied prose for {key}"))
            else:
                verdicts.append(EvalOutcome(n, score, reason=f"{n} says {key} <b>ok</b>"))
        outcomes.append(
            ItemOutcome(
                id=snapshot.id,
                item_index=snapshot.item_index,
                run_index=snapshot.run_index,
                item_key=key,
                status="error" if failed else "ok",
                output=None if failed else outputs.get(key, f"answer {key}"),
                metadata={} if failed else {"model": "m", "note": XSS},
                error=errors.get(key, ""),
                traceback=f"Traceback (most recent call last):\n  {errors[key]}" if failed else "",
                latency_ms=100.0 + snapshot.item_index,
                tokens=10 * snapshot.item_index,
                finished_at=timezone.now(),
                evaluations=[] if failed else verdicts,
                trace=(traces or {}).get(key, []),
            )
        )
    services.record_item_outcomes(run.id, outcomes)
    if finish:
        results.run_finalise(run.id)
    return Run.objects.get(id=run.id)


def keys(n: int) -> list[str]:
    return [f"k{i:03d}" for i in range(n)]


def row_keys(html: str) -> list[str]:
    return re.findall(r'<code class="key" title="item key"><bdi>([^<]+)</bdi></code>', html)


# Runs list ----------------------------------------------------------------------------------


def test_the_runs_list_shows_each_run_with_its_stored_scores(client, django_assert_num_queries):
    older = make_run(
        "qa",
        keys=keys(4),
        scores={"k000": {"exact": 0.0}},
        tags=("v1",),
        created_at=timezone.now() - timedelta(days=2),
    )
    newer = make_run("summariser", keys=keys(2), errors={"k001": "RuntimeError: boom"})
    with django_assert_num_queries(3):  # count, page of runs, tag names
        page = client.get("/").content.decode()
    assert page.index(newer.id) < page.index(older.id)
    # Averages coloured by the pass mark (0.5): 0.75 passes.
    assert (
        'score-chip score-pass"><span class="chip-name">exact</span> <span class="score-value">0.75'
        in page
    )
    assert 'class="tag">v1</span>' in page
    assert 'class="status status-completed">completed</span>' in page
    assert re.search(rf"{newer.id}.*?<td class=\"num bad\">1</td>", page, re.S)
    assert "2 runs" in page


def test_the_runs_list_filters_by_name_tag_status_and_date(client):
    old = make_run("qa", keys=keys(1), tags=("v1",), created_at=timezone.now() - timedelta(days=9))
    tagged = make_run("qa", keys=keys(1), tags=("v2",))
    other = make_run("router", keys=keys(1), finish=False)

    def ids(query: str) -> set[str]:
        page = client.get("/" + query).content.decode()
        return set(re.findall(r'class="run-link" href="/runs/(\w+)/"', page))

    assert ids("?name=QA") == {old.id, tagged.id}
    assert ids("?tag=v2") == {tagged.id}
    assert ids("?status=running") == {other.id}
    week_ago = (timezone.now() - timedelta(days=7)).date().isoformat()
    assert ids(f"?date_from={week_ago}") == {tagged.id, other.id}
    assert ids(f"?date_to={week_ago}") == {old.id}
    page = client.get("/?date_from=yesterday").content.decode()
    assert "date_from: Enter a valid date." in page
    assert ids("?sort=name") == {old.id, tagged.id, other.id}


def test_the_runs_list_sorts_paginates_and_swaps_only_its_table_for_htmx(client):
    for i in range(27):
        Run.objects.create(name=f"exp-{i:02d}", status="completed", estimated_cost=i / 100)
    first = client.get("/?sort=-cost").content.decode()
    assert first.index("exp-26") < first.index("exp-25")
    assert "exp-01" not in first and "Page 1 of 2" in first
    assert 'href="?sort=-cost&amp;page=2"' in first
    partial = client.get("/?sort=-cost&page=2", **HTMX)
    body = partial.content.decode()
    assert "<html" not in body and body.lstrip().startswith('<section id="runs"')
    assert "exp-01" in body and "exp-26" not in body
    assert "HX-Request" in partial["Vary"]


def test_the_runs_list_polls_the_status_of_running_runs_only(client):
    done = make_run("qa", keys=keys(2))
    running = make_run("qa", keys=keys(4), finish=False, done=1)
    page = client.get("/").content.decode()
    assert f'hx-get="/runs/{running.id}/status/" hx-trigger="every 3s"' in page
    assert f'hx-get="/runs/{done.id}/status/"' not in page
    cell = client.get(f"/runs/{running.id}/status/", **HTMX)
    assert cell.status_code == 200
    assert "status-running" in cell.content.decode() and "1/4" in cell.content.decode()
    services.record_item_outcomes(running.id, [])
    results.run_finalise(running.id)
    last = client.get(f"/runs/{running.id}/status/", **HTMX)
    assert last.status_code == 286 and "status-completed" in last.content.decode()
    assert "hx-trigger" not in last.content.decode()


def test_the_csv_export_writes_costs_as_decimals(client):
    run = make_run(keys=keys(1))
    run.items.update(cost=4.8899999999999996e-05)
    csv_text = b"".join(client.get(f"/runs/{run.id}/export.csv").streaming_content).decode()
    assert ",0.0000489," in csv_text and "e-05" not in csv_text


def test_an_empty_history_says_how_to_start(client):
    assert "Start one with <code>cobalt run</code>" in client.get("/").content.decode()


# Run detail ---------------------------------------------------------------------------------


def test_the_run_page_shows_summary_charts_and_escaped_items(client, django_assert_num_queries):
    run = make_run(
        keys=keys(3),
        outputs={"k001": XSS},
        scores={"k000": {"exact": 0.0, "judge": 0.25}, "k002": {"judge": None}},
        errors={},
    )
    # run, histogram, errors (grouped), the failing items' order (stored at finalisation),
    # rows, scores, flaky marks (runs of the same version, their observations), the fields to
    # filter by, previous run, labels, the labels its judges' calibration reads (none)
    with django_assert_num_queries(12):
        page = client.get(f"/runs/{run.id}/").content.decode()
    # The page opens on the failures, worst first: two evaluators failed k000, one k002.
    assert row_keys(page) == ["k000", "k002"]
    assert 'aria-current="page">Failures, worst first</a>' in page
    assert "judge: judge replied prose for k002" in page  # why it failed
    everything = client.get(f"/runs/{run.id}/?view=all").content.decode()
    assert row_keys(everything) == ["k000", "k001", "k002"]
    assert XSS not in everything
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in everything
    charts = json.loads(re.search(r'id="run-charts"[^>]*>(.*?)</script>', page, re.S).group(1))
    assert list(charts) == ["histogram"]  # the averages are the table's, not a chart's
    assert charts["histogram"]["series"][1] == {
        "label": "judge",
        "values": [0, 0, 1] + [0] * 6 + [1],
    }
    assert 'data-chart="histogram"' in page
    assert "hx-trigger" not in page.split('id="live"')[1].split(">")[0]  # finished: no polling
    assert f'href="/runs/{run.id}/export.csv"' in page
    assert re.search(
        r'score-error" data-verdict="error"><span title="evaluation error: judge', page
    )


def test_a_run_that_has_just_started_shows_its_empty_progress(client):
    run = make_run(keys=keys(2), finish=False, done=0)
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert "0 / 2 items" in page and 'class="status status-running"' in page


def test_a_running_run_polls_and_the_last_poll_stops_with_286(client, django_assert_num_queries):
    run = make_run(keys=keys(4), finish=False, done=1)
    page = client.get(f"/runs/{run.id}/").content.decode()
    live = page.split('id="live"')[1].split(">")[0]
    assert f'hx-get="/runs/{run.id}/"' in live and 'hx-trigger="every 2s"' in live
    assert "1 / 4 items" in page
    assert 'hx-trigger="cobalt-progress from:body"' in page
    # run, item counts, evaluation aggregates, traces not captured, histogram
    with django_assert_num_queries(5):
        poll = client.get(f"/runs/{run.id}/", **target("live"))
    assert poll.status_code == 200 and poll["HX-Trigger"] == "cobalt-progress"
    assert poll.content.decode().lstrip().startswith('<section id="live"')
    services.record_item_outcomes(run.id, [])
    results.run_finalise(run.id)
    last = client.get(f"/runs/{run.id}/", **target("live"))
    assert last.status_code == 286
    body = last.content.decode()
    assert "completed" in body and "hx-trigger" not in body.split(">")[0]


def test_live_updates_swap_the_rows_and_never_the_filter_form(client, django_assert_num_queries):
    run = make_run(keys=keys(4), finish=False, done=1)
    page = client.get(f"/runs/{run.id}/?view=all&min=0.2").content.decode()
    results_div = page.split('<div id="item-results"')[1].split(">")[0]
    assert 'hx-trigger="cobalt-progress from:body"' in results_div
    assert f'hx-get="/runs/{run.id}/?view=all&amp;min=0.2"' in results_div
    assert 'id="item-filters"' not in page.split('<div id="item-results"')[1]
    # run, count, page ids, rows, scores, flaky marks (same-version runs, observations)
    with django_assert_num_queries(7):
        rows = client.get(f"/runs/{run.id}/?view=all", **target("item-results")).content.decode()
    assert rows.lstrip().startswith('<div id="item-results"') and "<form" not in rows
    # One item done in the 10 s since the run started: a pace of 6.0 items a minute, whatever
    # time the requests above took (from a start of "now", over a second made it items/min).
    Run.objects.filter(id=run.id).update(started_at=timezone.now() - timedelta(seconds=10))
    poll = client.get(f"/runs/{run.id}/", **target("live")).content.decode()
    assert re.search(r'id="run-pace">· [56]\.\d items/min · ETA \d', poll), poll
    overview = client.get(f"/runs/{run.id}/", **target("overview")).content.decode()
    assert overview.lstrip().startswith('<section id="overview"')
    assert re.search(r'<td class="num">0\.50</td>\s*<td class="num">100%</td>', overview)


def test_scores_are_coloured_by_their_evaluators_pass_mark(client):
    run = make_run(
        keys=keys(3),
        scores={"k000": {"exact": 0.6, "judge": 0.6}, "k001": {"exact": 0.4, "judge": 0.4}},
    )
    config = dict(run.config)
    config["evaluators"][1]["pass_threshold"] = 0.7  # judge asks for 0.7; exact keeps 0.5
    Run.objects.filter(id=run.id).update(config=config)
    page = client.get(f"/runs/{run.id}/?view=all").content.decode()
    cells = re.findall(r'score-cell score-(\w+)" data-verdict="\w+">([\d.]+)</td>', page)
    assert cells == [
        ("pass", "0.60"),  # k000 exact ≥ 0.5
        ("fail", "0.60"),  # k000 judge < 0.7
        ("fail", "0.40"),
        ("fail", "0.40"),
        ("pass", "1.00"),
        ("pass", "1.00"),
    ]
    assert re.search(r"<td class=\"num\">0\.70</td>", page)  # the pass mark in the table
    failures = client.get(f"/runs/{run.id}/?evaluator=judge").content.decode()
    assert row_keys(failures) == ["k001", "k000"]  # judge's failures, lowest first
    exact = client.get(f"/runs/{run.id}/?evaluator=exact").content.decode()
    assert row_keys(exact) == ["k001"]


def test_failures_come_worst_first_across_pages(client, django_assert_num_queries):
    errors = {f"k{i:03d}": "RuntimeError: boom" for i in range(0, 60, 2)}  # 30 alike
    errors |= {"k060": "KeyError: 'a'", "k062": "KeyError: 'b'"}
    low = {f"k{i:03d}": {"judge": i / 1000} for i in range(1, 100, 2)}  # 50 below 0.5
    run = make_run(keys=keys(100), errors=errors, scores=low, evaluators=("judge",))
    first = client.get(f"/runs/{run.id}/", **target("items")).content.decode()
    # The 30 alike crashes are one row, before the two others (by index); then the lowest.
    assert first.count('class="item-row error-group') == 3
    assert "<summary>30 items</summary>" in first and first.count("RuntimeError: boom") == 1
    assert first.index("RuntimeError: boom") < first.index("KeyError: &#x27;a&#x27;")
    assert row_keys(first) == [f"k{i:03d}" for i in range(1, 95, 2)]  # 47 judged, lowest first
    assert "Failures 1–50 of 53" in first
    # run, errors, the failing items' order (stored at finalisation), rows, scores, flaky
    # marks (2), the fields to filter by
    with django_assert_num_queries(8):
        second = client.get(f"/runs/{run.id}/?page=2", **target("items")).content.decode()
    assert row_keys(second) == ["k095", "k097", "k099"]
    assert RunScoreTable.objects.get(run_id=run.id).failing == {"": 50, "judge": 50}
    # A run finalised before the counts were stored counts them, the same.
    RunScoreTable.objects.filter(run_id=run.id).delete()
    again = client.get(f"/runs/{run.id}/?page=2", **target("items")).content.decode()
    assert row_keys(again) == row_keys(second) and "Failures 51–53 of 53" in again


def test_repetitions_show_as_one_row_per_item_with_mean_stddev_and_passes(
    client, django_assert_num_queries
):
    run = make_run(keys=keys(2), runs=3, evaluators=("judge",), scores={"k000#1": {"judge": 0.0}})
    # run, count, page indexes, every repetition's row, scores, flaky marks (2), the fields
    # to filter by
    with django_assert_num_queries(8):
        page = client.get(f"/runs/{run.id}/?view=all", **target("items")).content.decode()
    assert row_keys(page) == ["k000", "k001"]
    assert re.search(r"score-pass repeated[^>]*>0\.67 <span class=\"sd\">± 0\.47</span>", page)
    assert '<span class="passes">2/3 pass</span>' in page
    assert '<span class="passes">3/3 pass</span>' in page
    assert page.count("<summary>3 repeats</summary>") == 2
    # Sorted or filtered too, one row per item (tests/test_repeat_pages.py).
    by_score = client.get(f"/runs/{run.id}/?sort=score:judge", **target("items")).content
    assert row_keys(by_score.decode()) == ["k000", "k001"]
    failures = client.get(f"/runs/{run.id}/", **target("items")).content.decode()
    assert row_keys(failures) == ["k000"] and "2 of 3 passed" in failures


def test_flaky_marks_come_from_one_version_only(client):
    first = make_run(keys=keys(2), tags=("v1",), scores={"k000": {"judge": 0.0}})
    second = make_run(keys=keys(2), tags=("v2",))
    page = client.get(f"/runs/{second.id}/?view=all").content.decode()
    assert "flaky-mark" not in page  # k000 changed with the version
    # Run again with two repetitions: how a run is executed does not make another version.
    again = make_run(keys=keys(2), tags=("v2",), runs=2, scores={"k001": {"judge": 0.0}})
    page = client.get(f"/runs/{again.id}/?view=all").content.decode()
    assert page.count('class="flaky-mark"') == 1  # k001 flipped within v2
    assert "same file, config, tags and commit" in page
    assert first.id


def test_costs_keep_their_significant_digits():
    from cobalt_app.templatetags.cobalt import cost

    assert cost(0.0000489) == "$0.0000489"
    assert cost(4.8899999999999996e-05) == "$0.0000489"
    assert cost(0.0123) == "$0.0123"
    assert cost(12345.678) == "$12,345.68"
    assert cost(0) == "$0.00" and cost(None) == "—"


def test_text_from_agents_is_isolated_for_bidirectional_text(client):
    flipped = "\u202eevil"  # RIGHT-TO-LEFT OVERRIDE: must not flip the rest of the row
    run = make_run(keys=keys(1), outputs={"k000": flipped})
    page = client.get(f"/runs/{run.id}/?view=all").content.decode()
    assert f'<td class="text output" dir="auto">{flipped}</td>' in page
    panel = client.get(f"/runs/{run.id}/items/{run.items.get().number}/").content.decode()
    assert f'id="item-output" dir="auto">{flipped}</pre>' in panel
    assert '<td class="reason" dir="auto">judge says k000' in panel
    assert '<pre class="input" dir="auto">' in panel and "<code><bdi>k000</bdi></code>" in panel


def test_the_items_table_sorts_by_score_with_unscored_items_last(client):
    run = make_run(
        keys=keys(5),
        scores={"k000": {"judge": 0.5}, "k001": {"judge": 0.9}, "k003": {"judge": 0.1}},
        errors={"k004": "RuntimeError: boom"},
    )
    scores_desc = row_keys(client.get(f"/runs/{run.id}/?sort=-score:judge").content.decode())
    assert scores_desc == ["k002", "k001", "k000", "k003", "k004"]
    scores_asc = row_keys(client.get(f"/runs/{run.id}/?sort=score:judge").content.decode())
    assert scores_asc == ["k003", "k000", "k001", "k002", "k004"]
    by_latency = row_keys(client.get(f"/runs/{run.id}/?sort=-latency").content.decode())
    assert by_latency == ["k004", "k003", "k002", "k001", "k000"]


def test_the_items_table_filters_by_status_and_score_range(client, django_assert_num_queries):
    run = make_run(
        keys=keys(6),
        scores={"k000": {"judge": 0.2}, "k001": {"judge": 0.4}, "k002": {"judge": 0.8}},
        errors={"k005": "ValueError: nope"},
    )
    errors = client.get(f"/runs/{run.id}/?status=error", **target("items")).content.decode()
    assert row_keys(errors) == ["k005"]
    # run, count, page ids, rows, scores, flaky marks (same-version runs, observations), the
    # fields to filter by
    with django_assert_num_queries(8):
        ranged = client.get(
            f"/runs/{run.id}/?evaluator=judge&min=0.3&max=0.8", **target("items")
        ).content.decode()
    assert ranged.lstrip().startswith('<section id="items"')
    assert row_keys(ranged) == ["k001", "k002"]
    both = client.get(f"/runs/{run.id}/?evaluator=judge&max=0.5&sort=-score:judge").content
    assert row_keys(both.decode()) == ["k001", "k000"]
    bad = client.get(f"/runs/{run.id}/?evaluator=nope&sort=score:ghost").content.decode()
    assert "this run has no evaluator &#x27;nope&#x27; (it has: exact, judge)" in bad
    assert "cannot sort by &#x27;score:ghost&#x27;" in bad


def test_the_items_table_paginates_on_the_server(client):
    run = make_run(keys=keys(120), evaluators=("judge",))
    page2 = client.get(f"/runs/{run.id}/?view=all&page=2", **target("items")).content.decode()
    assert row_keys(page2)[0] == "k050" and len(row_keys(page2)) == 50
    assert "Items 51–100 of 120" in page2
    assert 'hx-get="?view=all&amp;page=3"' in page2 and 'href="?view=all&amp;page=1"' in page2
    last = client.get(f"/runs/{run.id}/?view=all&page=99").content.decode()
    assert row_keys(last)[-1] == "k119" and "Page 3 of 3" in last


def test_a_short_run_id_redirects_and_an_unknown_one_is_404(client):
    run = make_run(keys=keys(1))
    assert client.get(f"/runs/{run.id[:6]}/")["Location"] == f"/runs/{run.id}/"
    missing = client.get("/runs/zzzzzzzz/")
    assert missing.status_code == 404
    page = missing.content.decode()  # a page of the dashboard, with its navigation
    assert '<section class="not-found" id="not-found">' in page
    assert "no run with id &#x27;zzzzzzzz&#x27;" in page
    assert 'href="/">runs page</a>' in page and 'class="topbar"' in page


# Item panel ---------------------------------------------------------------------------------


def test_the_item_panel_shows_reasons_metadata_and_the_traceback(client, django_assert_num_queries):
    run = make_run(keys=keys(2), outputs={"k000": XSS}, errors={"k001": "RuntimeError: boom"})
    ok_item, failed_item = run.items.order_by("item_index")
    # run, item and its trace, evaluations, how many items the run has (its neighbours are
    # the numbers beside its own)
    with django_assert_num_queries(4):
        panel = client.get(f"/runs/{run.id}/items/1/", **HTMX).content.decode()
    assert panel.lstrip().startswith('<dialog open class="item-panel floating"')
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in panel and XSS not in panel
    assert "judge says k000 &lt;b&gt;ok&lt;/b&gt;" in panel
    assert panel.count('<td class="num score-cell score-pass">1.00</td>') == 2
    assert "&quot;model&quot;: &quot;m&quot;" in panel
    assert '<pre class="expected" id="item-expected" dir="auto">answer k000</pre>' in panel
    assert 'data-step="prev"' not in panel
    assert f'data-step="next" rel="next" href="/runs/{run.id}/items/2/"' in panel
    assert '<span class="item-place" id="item-place">1 of 2 items</span>' in panel
    copied = json.loads(re.search(r'id="item-json"[^>]*>(.*?)</script>', panel, re.S)[1])
    assert copied["output"] == XSS and copied["evaluations"][0]["evaluator"] == "exact"
    page = client.get(f"/runs/{run.id}/items/{failed_item.number}/").content.decode()
    assert "<html" in page and "RuntimeError: boom" in page and "Traceback" in page
    assert '<pre class="output" id="item-output" dir="auto">—</pre>' in page  # not "null"
    assert f'data-step="prev" rel="prev" href="/runs/{run.id}/items/1/"' in page
    assert "the item did not produce an output" in page
    other = make_run(keys=keys(1))
    assert client.get(f"/runs/{other.id}/items/99/").status_code == 404


# Compare ------------------------------------------------------------------------------------


def pair_rows(html: str) -> list[tuple[str, str]]:
    """(key, change) of each row of the compare page's per-item table."""
    return re.findall(
        r'<tr class="pair-row change-\w+">\s*<td><code class="key"><bdi>([^<]+)</bdi></code></td>'
        r'\s*<td><span class="verdict verdict-(\w+)">',
        html,
    )


def test_compare_lists_every_matched_item_worst_first_with_links_to_both_runs(
    client, django_assert_num_queries
):
    a = make_run(keys=keys(6), scores={"k001": {"exact": 0.0}, "k002": {"judge": 0.2}})
    # B holds the same items in another order plus one new item: matching is by key.
    b = make_run(
        keys=["k005", "k004", "k003", "k002", "k001", "k000", "k999"],
        scores={"k000": {"exact": 0.0}, "k003": {"judge": 0.5}, "k002": {"judge": 1.0}},
        errors={"k004": "RuntimeError: boom"},
    )
    # run A, run B, recent runs, the score table of each (stored at finalisation), item numbers,
    # the labels each run's judges' calibration reads (none: nothing more), the fields to
    # group by
    with django_assert_num_queries(9):
        page = client.get(f"/compare/?a={a.id}&b={b.id}").content.decode()
    assert "Items matched by key: 6 (only in A: 0, only in B: 1)" in page
    assert pair_rows(page) == [
        ("k004", "regressed"),  # errored in B: worst of all
        ("k000", "regressed"),  # exact 1 → 0
        ("k003", "regressed"),  # judge 1 → 0.5
        ("k005", "unchanged"),
        ("k002", "improved"),  # judge 0.2 → 1
        ("k001", "improved"),  # exact 0 → 1
    ]
    assert f'href="/runs/{a.id}/items/1/">in A</a>' in page  # k000 is A's item #1
    assert f'href="/runs/{b.id}/items/6/">in B</a>' in page  # and B's #6
    assert "different experiments" not in page
    charts = json.loads(re.search(r'id="compare-charts"[^>]*>(.*?)</script>', page, re.S)[1])
    assert charts["labels"] == ["exact", "judge"]
    assert "mcnemar" in page or "wilcoxon" in page

    # Filtered by evaluator and change, as an htmx swap of the table only.
    judge = client.get(
        f"/compare/?a={a.id}&b={b.id}&evaluator=judge&change=improved", **target("pairs")
    ).content.decode()
    assert judge.lstrip().startswith('<section id="pairs"')
    assert pair_rows(judge) == [("k002", "improved")]
    assert "judge A</th>" in judge and "exact A</th>" not in judge
    by_key = client.get(f"/compare/?a={a.id}&b={b.id}&sort=key").content.decode()
    assert [key for key, _ in pair_rows(by_key)] == sorted(keys(6))


def test_compare_reads_score_tables_stored_at_finalisation_and_builds_missing_ones_once(
    client, django_assert_num_queries
):
    a = make_run(keys=keys(4), scores={"k001": {"judge": 0.2}})
    b = make_run(keys=keys(4), scores={"k002": {"judge": 0.3}})
    assert RunScoreTable.objects.filter(run_id__in=[a.id, b.id]).count() == 2
    stored = score_tables.load(Run.objects.get(id=b.id))
    assert stored.key_list(np.arange(4)) == keys(4)
    assert stored.column("judge").tolist() == [1.0, 1.0, 0.3, 1.0]
    # A run finalised before tables existed compares all the same, and keeps its table.
    RunScoreTable.objects.filter(run_id=a.id).delete()
    before = pair_rows(client.get(f"/compare/?a={a.id}&b={b.id}").content.decode())
    assert before[0] == ("k002", "regressed") and before[-1] == ("k001", "improved")
    assert RunScoreTable.objects.filter(run_id=a.id).exists()
    # No table to build or read any more: both are kept in this process (4, 2 label reads,
    # the fields to group by).
    with django_assert_num_queries(7):
        again = client.get(f"/compare/?a={a.id}&b={b.id}").content.decode()
    assert pair_rows(again) == before
    # A run still running is read fresh, never stored half-done.
    live = make_run(keys=keys(4), finish=False, done=2)
    assert not RunScoreTable.objects.filter(run_id=live.id).exists()
    diff = selectors.compare_runs(a, live)
    assert diff["matchedItems"] == 4 and diff["significance"]["judge"]["n"] == 2
    assert not RunScoreTable.objects.filter(run_id=live.id).exists()


def test_score_tables_join_runs_with_different_keys_as_the_key_sets_say():
    a = make_run(keys=["k1", "k3", "k5", "ü-7"], evaluators=("judge",))
    b = make_run(keys=["k0", "k3", "k4", "k5", "ü-7", "ü-8"], evaluators=("judge",))
    pairing = score_tables.pair(a, b)
    assert [pairing.key(i) for i in range(pairing.matched)] == ["k3", "k5", "ü-7"]
    assert pairing.a.key_list(pairing.only_a) == ["k1"]
    assert pairing.b.key_list(pairing.only_b) == ["k0", "k4", "ü-8"]
    diff = selectors.compare_runs(a, b)
    assert diff["onlyInA"] == ["k1"] and diff["onlyInB"] == ["k0", "k4", "ü-8"]
    assert diff["significance"]["judge"]["onlyInBKeys"] == ["k0", "k4", "ü-8"]


def test_compare_lists_the_largest_movers_with_ties_in_key_order():
    a = make_run(keys=keys(8), evaluators=("judge",))
    falls = {"k006": 0.0, "k001": 0.0, "k004": 0.0, "k002": 0.5, "k007": 0.9}
    b = make_run(
        keys=keys(8), evaluators=("judge",), scores={k: {"judge": v} for k, v in falls.items()}
    )
    diff = selectors.compare_runs(a, b, top=3)
    assert [(m["key"], m["delta"]) for m in diff["regressions"]] == [
        ("k001", -1.0),
        ("k004", -1.0),
        ("k006", -1.0),
    ]
    assert diff["evaluators"]["judge"]["regressed"] == 5
    assert [m["key"] for m in selectors.compare_runs(a, b, top=10)["regressions"]] == [
        "k001",
        "k004",
        "k006",
        "k002",
        "k007",
    ]


def test_compare_pages_through_every_matched_item(client):
    a = make_run(keys=keys(120), evaluators=("judge",))
    b = make_run(keys=keys(120), evaluators=("judge",), scores={"k119": {"judge": 0.0}})
    first = client.get(f"/compare/?a={a.id}&b={b.id}").content.decode()
    assert len(pair_rows(first)) == 50 and pair_rows(first)[0] == ("k119", "regressed")
    assert "Items 1–50 of 120" in first
    last = client.get(f"/compare/?a={a.id}&b={b.id}&page=3", **target("pairs")).content.decode()
    # k119 fell first, then the unchanged ones by key: page 3 holds k099 to k118.
    assert [key for key, _ in pair_rows(last)] == [f"k{i:03d}" for i in range(99, 119)]


def test_compare_averages_the_repetitions_of_an_item_before_taking_the_difference(client):
    a = make_run(keys=keys(2), runs=2, scores={"k000#1": {"judge": 0.0}}, evaluators=("judge",))
    b = make_run(keys=keys(2), runs=2, scores={"k001": {"judge": 0.5}}, evaluators=("judge",))
    page = client.get(f"/compare/?a={a.id}&b={b.id}").content.decode()
    assert pair_rows(page) == [("k001", "regressed"), ("k000", "improved")]  # two keys, not four
    assert re.search(r"<bdi>k000</bdi>.*?0\.50.*?1\.00.*?\+0\.50", page, re.S)
    assert re.search(r"<bdi>k001</bdi>.*?1\.00.*?0\.50.*?-0\.50", page, re.S)


def test_compare_of_different_repetition_counts_pairs_every_repetition(client):
    a = make_run(keys=keys(1), evaluators=("judge",), outputs={"k000": "one answer"})
    b = make_run(keys=keys(1), runs=3, evaluators=("judge",), outputs={"k000": "two answers"})
    side = client.get(f"/compare/?a={a.id}&b={b.id}&key=k000", **target("side")).content.decode()
    assert "not in run A" not in side
    assert side.count("<h3>Repetition") == 3
    assert side.count("<del>one</del><ins>two</ins> <del>answer</del><ins>answers</ins>") == 3


def test_compare_explains_runs_of_different_experiments(client):
    a = make_run("qa", keys=keys(3))
    b = make_run("qa-v2", keys=["k001", "k002", "x"], scores={"k001": {"judge": 0.0}})
    page = client.get(f"/compare/?a={a.id}&b={b.id}").content.decode()
    assert "A and B are runs of different experiments" in page
    assert "the 2 keys found in both are compared item by item" in page
    assert pair_rows(page)[0] == ("k001", "regressed")
    other = make_run("elsewhere", keys=["z1", "z2"])
    none = client.get(f"/compare/?a={a.id}&b={other.id}").content.decode()
    assert "They have no item key in common" in none


def test_compare_shows_two_outputs_side_by_side(client):
    a = make_run(keys=keys(2), outputs={"k001": XSS})
    b = make_run(keys=keys(2), outputs={"k001": "a better answer"}, scores={"k001": {"judge": 0.1}})
    side = client.get(f"/compare/?a={a.id}&b={b.id}&key=k001", **target("side")).content
    side = side.decode()
    assert side.lstrip().startswith('<section id="side"')
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in side and "a better answer" in side
    assert "judge says k001" in side
    # The word diff is escaped like the outputs it compares.
    assert "<del>&lt;script&gt;alert(1)&lt;/script&gt;</del><ins>a better answer</ins>" in side
    page = client.get(f"/compare/?a={a.id}&b={b.id}&key=k001").content.decode()
    assert "<html" in page and "a better answer" in page


def step(name: str, kind: str, start: float, output: str, **more: Any) -> dict[str, Any]:
    return {
        "name": name,
        "kind": kind,
        "startMs": start,
        "durationMs": 5.0,
        "output": output,
        "parent": None,
        "status": "ok",
        **more,
    }


def test_compare_diffs_two_conversations_and_two_traces_escaped(client):
    said = [{"role": "user", "content": "Where is my parcel?"}]
    a = make_run(
        keys=keys(2),
        outputs={"k001": [*said, {"role": "assistant", "content": "It left on Monday."}]},
        traces={"k001": [step("lookup", "tool", 0.0, XSS), step("chat", "llm", 9.0, "Monday")]},
    )
    b = make_run(
        keys=keys(2),
        outputs={"k001": [*said, {"role": "assistant", "content": "It arrives on Friday."}]},
        traces={
            "k001": [
                step("lookup", "tool", 3.0, XSS),  # another start time: not a difference
                step("refund", "tool", 4.0, "", status="error", error="HTTP 500"),
                step("chat", "llm", 12.0, "Friday"),
            ]
        },
    )
    side = client.get(f"/compare/?a={a.id}&b={b.id}&key=k001", **target("side")).content
    side = side.decode()
    output = re.search(r'<pre class="diff" id="output-diff"[^>]*>(.*?)</pre>', side, re.S)[1]
    # The transcripts are diffed as the judges read them, turn by turn, not as JSON.
    assert "Diff of the transcripts, A → B" in side
    assert output.startswith("user: Where is my parcel?\nassistant: It ")
    assert "<del>left</del><ins>arrives</ins> on <del>Monday</del><ins>Friday</ins>." in output
    trace = re.search(r'<pre class="diff" id="trace-diff"[^>]*>(.*?)</pre>', side, re.S)[1]
    assert trace.startswith("[tool] lookup output=&lt;script&gt;alert(1)&lt;/script&gt;\n")
    assert "\n<ins>[tool] refund error=HTTP 500\n</ins>[llm] chat" in trace  # a new step
    assert "output=<del>Monday</del><ins>Friday</ins>" in trace
    assert XSS not in side
    # An item with no trace in either run shows no trace section at all.
    plain = client.get(f"/compare/?a={a.id}&b={b.id}&key=k000", **target("side")).content
    assert b"trace-diff" not in plain and b"Diff of the outputs" in plain


def test_compare_explains_a_bad_run_id(client):
    page = client.get("/compare/?a=nope&b=nada").content.decode()
    assert "no run with id &#x27;nope&#x27;" in page
    assert "Run A (baseline)" in client.get("/compare/").content.decode()


# Trends -------------------------------------------------------------------------------------


def test_trends_plot_each_evaluator_over_runs_of_an_experiment(client, django_assert_num_queries):
    now = timezone.now()
    first = make_run(
        keys=keys(2),
        scores={"k000": {"judge": 0.0}},
        tags=("nightly",),
        created_at=now - timedelta(days=2),
    )
    second = make_run(keys=keys(2), tags=("nightly",), created_at=now - timedelta(days=1))
    make_run("other", keys=keys(1))
    untagged = make_run(keys=keys(2), scores={"k001": {"exact": 0.5}})
    # experiment names, tag names, runs, the judges with labels (none: no κ per judge version)
    with django_assert_num_queries(4):
        page = client.get("/trends/?experiment=qa").content.decode()
    charts = json.loads(re.search(r'id="trend-charts"[^>]*>(.*?)</script>', page, re.S)[1])
    assert charts["runs"] == [first.id, second.id, untagged.id]
    assert charts["urls"][0] == f"/runs/{first.id}/"
    # 25 Nov 2026 09:18 · nightly: the date, and the first tag
    assert charts["labels"][0] == first.created_at.strftime("%d %b %Y %H:%M") + " · nightly"
    assert charts["labels"][2] == untagged.created_at.strftime("%d %b %Y %H:%M")
    judge = next(s for s in charts["series"] if s["label"] == "judge")
    assert judge["values"] == [0.5, 1.0, 1.0]
    tagged = client.get("/trends/?experiment=qa&tag=nightly", **HTMX).content.decode()
    assert tagged.lstrip().startswith('<section id="trend"')
    assert untagged.id not in tagged and first.id in tagged
    latest = client.get("/trends/").content.decode()
    assert 'value="qa" selected' in latest  # opens on the most recent run's experiment


# Other --------------------------------------------------------------------------------------


def test_healthz_names_the_project_without_revealing_its_path(client):
    reply = client.get("/healthz/").json()
    assert reply["status"] == "ok" and len(reply["project"]) == 16 and "/" not in reply["project"]


def test_pages_carry_the_csrf_token_for_htmx_once_and_no_inline_scripts(client):
    run = make_run(keys=keys(2))
    for path in ("/", f"/runs/{run.id}/", f"/compare/?a={run.id}&b={run.id}", "/trends/"):
        response = client.get(path)
        policy = response["Content-Security-Policy"]
        assert "script-src 'self';" in policy and "frame-ancestors 'none'" in policy
        page = response.content.decode()
        assert page.count('hx-headers=\'{"X-CSRFToken"') == 1
        scripts = re.findall(r"<script([^>]*)>", page)
        assert all("src=" in attrs or 'type="application/json"' in attrs for attrs in scripts)
        assert not re.search(r"https?://[^\"']*cdn", page.lower())


def test_a_conversation_reads_as_its_turns_in_the_lists():
    from cobalt_app.page_items import output_text

    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    assert output_text(turns) == "user: Hi · assistant: Hello"
    assert output_text([{"role": "user"}]) == '[{"role": "user"}]'  # not a conversation: JSON
    assert output_text([]) == "[]" and output_text({"a": 1}) == '{"a": 1}'


def test_runs_of_one_minute_are_told_apart_on_a_trend_by_their_second():
    from cobalt_app.models import Run
    from cobalt_app.page_selectors import run_labels

    at = datetime(2026, 11, 27, 17, 25, 6, tzinfo=UTC)
    runs = [
        Run(created_at=at, tags=["v1"]),
        Run(created_at=at + timedelta(seconds=10), tags=["v2"]),
        Run(created_at=at + timedelta(hours=1)),
    ]
    assert run_labels(runs) == [
        "27 Nov 2026 17:25:06 · v1",
        "27 Nov 2026 17:25:16 · v2",
        "27 Nov 2026 18:25",
    ]
