"""Dashboard pages in-process: what each page shows, htmx partials, escaping, query counts."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from cobalt import Dataset, Evaluator, experiment
from cobalt.experiment import collecting
from cobalt_app import results, services
from cobalt_app.engine import ItemOutcome
from cobalt_app.evaluators import EvalOutcome
from cobalt_app.models import Run

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
    outputs: dict[str, str] | None = None,
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
            )
        )
    services.record_item_outcomes(run.id, outcomes)
    if finish:
        results.run_finalise(run.id)
    return Run.objects.get(id=run.id)


def keys(n: int) -> list[str]:
    return [f"k{i:03d}" for i in range(n)]


def row_keys(html: str) -> list[str]:
    return re.findall(r'<code class="key" title="item key">([^<]+)</code>', html)


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
    assert "exact</span> 0.75" in page
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
    # run, histogram, count, page ids, rows, scores, flaky marks (cobalt_app.flaky), previous
    with django_assert_num_queries(8):
        page = client.get(f"/runs/{run.id}/").content.decode()
    assert XSS not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    charts = json.loads(re.search(r'id="run-charts"[^>]*>(.*?)</script>', page, re.S).group(1))
    assert charts["bars"]["labels"] == ["exact", "judge"]
    assert charts["bars"]["values"][0] == pytest.approx(2 / 3)
    assert charts["histogram"]["series"][1] == {
        "label": "judge",
        "values": [0, 0, 1] + [0] * 6 + [1],
    }
    assert 'data-chart="histogram"' in page
    assert "hx-trigger" not in page.split('id="live"')[1].split(">")[0]  # finished: no polling
    assert f'href="/runs/{run.id}/export.csv"' in page
    assert '<span class="bad" title="evaluation error">error</span>' in page


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
    with django_assert_num_queries(4):  # run, item counts, evaluation aggregates, histogram
        poll = client.get(f"/runs/{run.id}/", **target("live"))
    assert poll.status_code == 200 and poll["HX-Trigger"] == "cobalt-progress"
    assert poll.content.decode().lstrip().startswith('<section id="live"')
    services.record_item_outcomes(run.id, [])
    results.run_finalise(run.id)
    last = client.get(f"/runs/{run.id}/", **target("live"))
    assert last.status_code == 286
    body = last.content.decode()
    assert "completed" in body and "hx-trigger" not in body.split(">")[0]


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
    with django_assert_num_queries(6):  # run, count, page ids, rows, scores, flaky marks
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
    page2 = client.get(f"/runs/{run.id}/?page=2", **target("items")).content.decode()
    assert row_keys(page2)[0] == "k050" and len(row_keys(page2)) == 50
    assert "Items 51–100 of 120" in page2
    assert 'hx-get="?page=3"' in page2 and 'href="?page=1"' in page2
    last = client.get(f"/runs/{run.id}/?page=99").content.decode()
    assert row_keys(last)[-1] == "k119" and "Page 3 of 3" in last


def test_a_short_run_id_redirects_and_an_unknown_one_is_404(client):
    run = make_run(keys=keys(1))
    assert client.get(f"/runs/{run.id[:6]}/")["Location"] == f"/runs/{run.id}/"
    missing = client.get("/runs/zzzzzzzz/")
    assert missing.status_code == 404


# Item panel ---------------------------------------------------------------------------------


def test_the_item_panel_shows_reasons_metadata_and_the_traceback(client, django_assert_num_queries):
    run = make_run(keys=keys(2), outputs={"k000": XSS}, errors={"k001": "RuntimeError: boom"})
    ok_item, failed_item = run.items.order_by("item_index")
    with django_assert_num_queries(3):  # run, item (and its trace), evaluations
        panel = client.get(f"/runs/{run.id}/items/{ok_item.id}/", **HTMX).content.decode()
    assert panel.lstrip().startswith('<dialog open class="item-panel floating"')
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in panel and XSS not in panel
    assert "judge says k000 &lt;b&gt;ok&lt;/b&gt;" in panel
    assert "&quot;model&quot;: &quot;m&quot;" in panel
    page = client.get(f"/runs/{run.id}/items/{failed_item.id}/").content.decode()
    assert "<html" in page and "RuntimeError: boom" in page and "Traceback" in page
    assert "the item did not produce an output" in page
    other = make_run(keys=keys(1))
    assert client.get(f"/runs/{other.id}/items/{ok_item.id}/").status_code == 404


# Compare ------------------------------------------------------------------------------------


def test_compare_matches_items_by_key_and_lists_the_biggest_moves(
    client, django_assert_num_queries
):
    a = make_run(keys=keys(6), scores={"k001": {"exact": 0.0}, "k002": {"judge": 0.2}})
    # B holds the same items in another order plus one new item: matching is by key.
    b = make_run(
        keys=["k005", "k004", "k003", "k002", "k001", "k000", "k999"],
        scores={"k000": {"exact": 0.0}, "k003": {"judge": 0.5}, "k002": {"judge": 1.0}},
    )
    with django_assert_num_queries(5):  # run A, run B, recent runs, pairs, key counts
        page = client.get(f"/compare/?a={a.id}&b={b.id}").content.decode()
    assert "Items matched by key: 6 (only in A: 0, only in B: 1)" in page
    regressions = page.split("Regressed most")[1].split("Improved most")[0]
    improvements = page.split("Improved most")[1]
    assert re.findall(r"<code>(k\d+)</code>", regressions) == ["k000", "k003"]
    assert re.findall(r"<code>(k\d+)</code>", improvements)[:2] == ["k001", "k002"]
    charts = json.loads(re.search(r'id="compare-charts"[^>]*>(.*?)</script>', page, re.S)[1])
    assert charts["labels"] == ["exact", "judge"]
    assert "mcnemar" in page or "wilcoxon" in page


def test_compare_averages_the_repetitions_of_an_item_before_taking_the_difference(client):
    a = make_run(keys=keys(2), runs=2, scores={"k000#1": {"judge": 0.0}}, evaluators=("judge",))
    b = make_run(keys=keys(2), runs=2, scores={"k001": {"judge": 0.5}}, evaluators=("judge",))
    page = client.get(f"/compare/?a={a.id}&b={b.id}").content.decode()
    improved = page.split("Improved most")[1]
    regressed = page.split("Regressed most")[1].split("Improved most")[0]
    assert re.search(r"<code>k000</code>.*?0\.50.*?1\.00.*?\+0\.50", improved, re.S)
    assert re.search(r"<code>k001</code>.*?1\.00.*?0\.50.*?-0\.50", regressed, re.S)
    assert re.search(r"<td class=\"num\">2</td>", page)  # two keys paired, not four rows


def test_compare_shows_two_outputs_side_by_side(client):
    a = make_run(keys=keys(2), outputs={"k001": XSS})
    b = make_run(keys=keys(2), outputs={"k001": "a better answer"}, scores={"k001": {"judge": 0.1}})
    side = client.get(f"/compare/?a={a.id}&b={b.id}&key=k001", **target("side")).content
    side = side.decode()
    assert side.lstrip().startswith('<section id="side"')
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in side and "a better answer" in side
    assert "judge says k001" in side
    page = client.get(f"/compare/?a={a.id}&b={b.id}&key=k001").content.decode()
    assert "<html" in page and "a better answer" in page


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
    with django_assert_num_queries(3):  # experiment names, tag names, runs
        page = client.get("/trends/?experiment=qa").content.decode()
    charts = json.loads(re.search(r'id="trend-charts"[^>]*>(.*?)</script>', page, re.S)[1])
    assert charts["runs"] == [first.id, second.id, untagged.id]
    assert charts["urls"][0] == f"/runs/{first.id}/"
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
        page = client.get(path).content.decode()
        assert page.count('hx-headers=\'{"X-CSRFToken"') == 1
        scripts = re.findall(r"<script([^>]*)>", page)
        assert all("src=" in attrs or 'type="application/json"' in attrs for attrs in scripts)
        assert "cdn" not in page.lower()
