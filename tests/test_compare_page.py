"""Is B better than A? The compare page's verdict strip, change classes, N runs and the side
by side of one item — in-process (query counts pinned), then in headless Chromium after real
`cobalt run`s of a tool-using agent (the strip in one screen, the slide-over, j/k, no JS, axe).
"""

from __future__ import annotations

import html
import re

import pytest
from django.test import Client

from tests.test_pages import XSS, keys, make_run, pair_rows, step, target

pytestmark = pytest.mark.django_db


@pytest.fixture
def client() -> Client:
    return Client(HTTP_HOST="127.0.0.1")


def strip_text(page: str) -> str:
    section = re.search(r"<section id=\"verdict\".*?</section>", page, re.S)[0]
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", section)))


def kinds(html: str) -> list[tuple[str, str]]:
    """(key, class) of each row of the per-item table."""
    return re.findall(
        r'<code class="key"><bdi>([^<]+)</bdi></code></td>\s*<td><span class="verdict[^"]*">'
        r'\w+</span> <span class="kind kind-[\w-]+">([^<]+)</span>',
        html,
    )


def fixed_and_curt() -> tuple:
    """A with five crashed items; B crashes on one only but is curt on 20 of 30 (tone fails)."""
    a = make_run(
        keys=keys(30),
        evaluators=("resolved", "tone"),
        errors={f"k00{i}": "RuntimeError: refund tool down" for i in range(5)},
    )
    b = make_run(
        keys=keys(30),
        evaluators=("resolved", "tone"),
        errors={"k000": "RuntimeError: refund tool down"},
        scores={key: {"tone": 0.0} for key in keys(30)[10:]},
    )
    return a, b


def test_the_strip_says_b_fixes_errors_but_loses_on_tone_with_significance(
    client, django_assert_num_queries
):
    a, b = fixed_and_curt()
    # runs A and B, recent runs, two score tables, item ids, two calibration label reads
    with django_assert_num_queries(8):
        page = client.get(f"/compare/?a={a.id}&b={b.id}").content.decode()
    text = strip_text(page)
    assert (
        "B wins on errors and timeouts (5 → 1); it loses on tone (pass rate 100% → 31%, "
        "significant, p < 0.001); no significant change on resolved." in text
    )
    assert re.search(r"Errors 5 1 −4", text)
    assert re.search(r"tone pass rate 100% 31% −69 pp regressed", text)
    # The strip comes before the evaluator table.
    assert page.index('id="verdict"') < page.index('class="deltas"')


def test_the_api_and_the_strip_share_one_function(client):
    a, b = fixed_and_curt()
    body = client.get(f"/api/compare/?a={a.id}&b={b.id}").json()
    column = body["strip"]["runs"][0]
    assert body["strip"]["baseline"]["errors"] == 5 and column["errors"] == 1
    assert column["deltas"]["errors"] == -4
    assert column["wins"] == ["errors and timeouts (5 → 1)"]
    tone = next(e for e in column["evaluators"] if e["name"] == "tone")
    assert tone["verdict"] == "regressed" and tone["passRateA"] == 1.0
    assert column["sentence"].startswith("B wins on errors and timeouts (5 → 1); it loses on tone")


def classes_runs() -> tuple:
    """Three repetitions a side; one key of each change class."""
    a = make_run(
        keys=keys(7),
        runs=3,
        evaluators=("judge",),
        errors={"k000": "boom", "k006": "boom"},
        scores={"k002": {"judge": 0.5}, "k004#1": {"judge": 0.0}},
    )
    b = make_run(
        keys=keys(7),
        runs=3,
        evaluators=("judge",),
        errors={"k001": "boom", "k006": "boom"},
        scores={"k003": {"judge": 0.2}},
    )
    return a, b


def test_each_item_has_a_change_class_and_noise_is_greyed(client):
    a, b = classes_runs()
    page = client.get(f"/compare/?a={a.id}&b={b.id}&sort=key").content.decode()
    assert kinds(page) == [
        ("k000", "fixed error"),
        ("k001", "new error"),
        ("k002", "score up"),
        ("k003", "score down"),
        ("k004", "within noise"),  # 0.67 → 1.00: inside A's own spread (0 to 1) over repeats
        ("k005", "no change"),
        ("k006", "error in both"),
    ]
    # The direction stays beside the class: k004 did rise, within its noise.
    assert ("k004", "improved") in pair_rows(page)
    k004 = re.search(r"<bdi>k004</bdi>.*?</tr>", page, re.S)[0]
    assert 'class="num delta noise"' in k004 and "+0.33" in k004
    assert '<option value="noise" >within noise (1)</option>' in page

    only = client.get(f"/compare/?a={a.id}&b={b.id}&change=noise", **target("pairs"))
    assert kinds(only.content.decode()) == [("k004", "within noise")]
    fixed = client.get(f"/compare/?a={a.id}&b={b.id}&change=fixed-error").content.decode()
    assert kinds(fixed) == [("k000", "fixed error")]
    # Old links by direction still filter.
    assert [
        k
        for k, _ in pair_rows(
            client.get(f"/compare/?a={a.id}&b={b.id}&change=regressed").content.decode()
        )
    ] == ["k001", "k003"]


def test_a_baseline_against_several_runs_shows_each_as_columns(client, django_assert_num_queries):
    a, b = fixed_and_curt()
    c = make_run(keys=keys(30), evaluators=("resolved", "tone"))
    # three runs, recent runs, three score tables, item ids, two calibration label reads
    with django_assert_num_queries(10):
        page = client.get(f"/compare/?a={a.id}&b={b.id}&b={c.id}").content.decode()
    same = client.get(f"/compare/?runs={a.id},{b.id},{c.id}").content.decode()
    assert pair_rows(page) == pair_rows(same) and len(pair_rows(page)) == 30
    text = strip_text(page)
    assert "B1 wins on errors and timeouts (5 → 1); it loses on tone" in text
    assert (
        "B2 wins on errors and timeouts (5 → 0); no significant change on resolved and tone" in text
    )
    assert f"B2 <code>{c.id}</code></th>" in page  # its column in the per-item table
    row = re.search(r"<bdi>k003</bdi>.*?</tr>", page, re.S)[0]
    assert row.count("fixed error") == 2  # in B and in B2
    assert f"b={c.id}&amp;key=k003" in row  # its own side by side
    # Each other run has its own paired tests.
    assert page.count('<table class="deltas">') == 2
    too_many = client.get(f"/compare/?a={a.id}" + f"&b={b.id}" * 6).content.decode()
    assert "compare a baseline with at most 5 runs at once" in too_many


def traced_runs() -> tuple:
    said = "Your refund is on its way."
    a = make_run(
        keys=keys(3),
        outputs={"k001": "It left on Monday."},
        traces={"k001": [step("lookup", "tool", 0.0, XSS), step("chat", "llm", 9.0, "Monday")]},
        scores={"k002": {"judge": 0.3}},
    )
    b = make_run(
        keys=keys(3),
        outputs={"k001": "It arrives on Friday.", "k002": said},
        traces={
            "k001": [
                step("lookup", "tool", 3.0, XSS),
                step("refund", "tool", 4.0, "", status="error", error="HTTP 500"),
                step("chat", "llm", 12.0, "Friday"),
            ]
        },
        scores={"k001": {"judge": 0.1}},
    )
    return a, b


def test_the_side_by_side_has_its_own_page_reasons_first_then_diffs(
    client, django_assert_num_queries
):
    a, b = traced_runs()
    url = f"/compare/item/?a={a.id}&b={b.id}&sort=key&key=k001"
    # runs A and B, the two score tables (for the neighbours), the items with their traces,
    # their evaluations
    with django_assert_num_queries(6):
        page = client.get(url).content.decode()
    assert "<html" in page and '<dialog open class="item-panel side-panel "' in page
    reasons = page.index("judge says k001")
    output = page.index('id="output-diff"')
    steps = page.index('id="trace-steps"')
    assert reasons < output < steps
    table = re.search(r'<table class="trace-steps".*?</table>', page, re.S)[0]
    cells = re.findall(r'<span class="kind kind-step-[\w-]+">([^<]+)</span>', table)
    assert cells == ["same", "only in B", "changed"]
    assert "output=<del>Monday</del><ins>Friday</ins>" in table
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in table and XSS not in page
    assert "startMs" not in table and "3.0" not in table  # timings left out
    # j/k: the neighbours in the table's sort, carrying it.
    assert f'data-step="prev" rel="prev" href="/compare/item/?a={a.id}&amp;b={b.id}' in page
    assert "sort=key&amp;key=k000" in page and "sort=key&amp;key=k002" in page
    panel = client.get(url, **target("side-host")).content.decode()
    assert panel.lstrip().startswith('<dialog open class="item-panel side-panel floating"')
    assert 'hx-target="#side-host"' in panel and "<html" not in panel
    # The compare page's rows open it.
    listing = client.get(f"/compare/?a={a.id}&b={b.id}").content.decode()
    assert f'href="/compare/item/?a={a.id}&amp;b={b.id}&amp;evaluator=&amp;change=' in listing
    assert client.get(f"/compare/item/?a={a.id}&b=nope&key=k001").status_code == 404
    assert client.get(f"/compare/item/?a={a.id}").status_code == 400


def test_a_key_filtered_out_has_no_neighbours(client):
    a, b = traced_runs()
    page = client.get(f"/compare/item/?a={a.id}&b={b.id}&change=score-up&key=k001").content.decode()
    assert 'data-step="' not in page and "judge says k001" in page
