"""Is B better than A? The compare page's verdict strip, change classes, N runs and the side
by side of one item — in-process (query counts pinned), then in headless Chromium after real
`cobalt run`s of a tool-using agent (the strip in one screen, the slide-over, j/k, no JS, axe).
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import Client

from cobalt_app import results
from cobalt_app.models import Evaluation, Run
from tests.conftest import cobalt_run, new_project, served
from tests.helpers import axe_violations
from tests.test_browser import (  # noqa: F401 (browser: a fixture)
    ARTIFACTS,
    CHROMIUM,
    browser,
    watched_tab,
)
from tests.test_pages import XSS, keys, make_run, pair_rows, step, target

db = pytest.mark.django_db
needs_chromium = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")


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


@db
def test_the_strip_says_b_fixes_errors_but_loses_on_tone_with_significance(
    client, django_assert_num_queries
):
    a, b = fixed_and_curt()
    # runs A and B, recent runs, two score tables, item ids, two calibration label reads, the
    # fields offered to group by
    with django_assert_num_queries(9):
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


@db
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


@db
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


@db
def test_a_baseline_against_several_runs_shows_each_as_columns(client, django_assert_num_queries):
    a, b = fixed_and_curt()
    c = make_run(keys=keys(30), evaluators=("resolved", "tone"))
    # three runs, recent runs, three score tables, item ids, two calibration label reads, the
    # fields offered to group by
    with django_assert_num_queries(11):
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


@db
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


@db
def test_a_second_visit_reuses_what_was_worked_out_and_a_run_judged_again_compares_afresh(
    client, django_assert_num_queries
):
    a = make_run(keys=keys(6), evaluators=("judge",))
    b = make_run(keys=keys(6), evaluators=("judge",), scores={"k002": {"judge": 0.2}})
    url = f"/compare/?a={a.id}&b={b.id}"
    first = client.get(url).content.decode()
    assert kinds(first)[0] == ("k002", "score down")
    # Two runs, recent runs, item ids, two label reads, the fields to group by: no score table
    # read again.
    with django_assert_num_queries(7):
        again = client.get(url).content.decode()
    assert kinds(again) == kinds(first)
    side = client.get(f"/compare/item/?a={a.id}&b={b.id}&sort=key&key=k002").content.decode()
    assert "sort=key&amp;key=k001" in side and "sort=key&amp;key=k003" in side  # j and k
    # Judged again, B is finalised anew (its finished_at moves): its new scores show.
    Evaluation.objects.filter(run_id=b.id, item__item_key="k002").update(score=1.0)
    Evaluation.objects.filter(run_id=b.id, item__item_key="k004").update(score=0.1)
    Run.objects.filter(id=b.id).update(finished_at=None)
    results.run_finalise(b.id)
    assert kinds(client.get(url).content.decode())[0] == ("k004", "score down")


@db
def test_a_key_filtered_out_has_no_neighbours(client):
    a, b = traced_runs()
    page = client.get(f"/compare/item/?a={a.id}&b={b.id}&change=score-up&key=k001").content.decode()
    assert 'data-step="' not in page and "judge says k001" in page


# In Chromium, after real runs ---------------------------------------------------------------

SUPPORT_AGENT = """
import os

import cobalt
from cobalt import Dataset, Evaluator, experiment

VERSION = os.environ.get("AGENT_VERSION", "1")
dataset = Dataset(
    items=[{"id": f"o{i:02d}", "input": f"Where is order o{i:02d}? I want a refund.",
            "category": "refund" if i % 2 else "shipping" if i % 4 == 0 else "billing"}
           for i in range(40)]
)


@cobalt.tool
def lookup_order(order_id: str) -> dict:
    return {"order": order_id, "status": "in transit" if int(order_id[1:]) % 3 else "delivered"}


@cobalt.tool
def refund(order_id: str) -> str:
    i = int(order_id[1:])
    if (VERSION == "1" and i % 8 == 0) or (VERSION == "2" and i == 0):
        raise RuntimeError(f"refund service timed out for {order_id}")
    return f"refund issued for {order_id}"


def resolved(ctx):
    done = "refund issued" in str(ctx.output)
    return {"score": 1.0 if done else 0.0, "reason": "refunded" if done else "no refund"}


def tone(ctx):
    polite = "thank you" in str(ctx.output).lower()
    return {"score": 1.0 if polite else 0.0,
            "reason": "thanks the customer" if polite else "curt: no thanks, no status"}


@experiment("support", dataset, tags=[f"v{VERSION}"], evaluators=[
    Evaluator(name="resolved", type="function", fn=resolved),
    Evaluator(name="tone", type="function", fn=tone),
])
def run(ctx):
    order_id = ctx.item["id"]
    order = lookup_order(order_id)
    done = refund(order_id)
    with cobalt.span("draft reply", kind="llm", input=ctx.item["input"]) as step:
        if VERSION == "2" and int(order_id[1:]) % 2:
            step.output = f"{done}."
        else:
            step.output = (f"Thank you for waiting. Your order is {order['status']} and the "
                           f"{done}.")
    return step.output
"""


@pytest.fixture(scope="module")
def support(tmp_path_factory) -> Iterator[tuple[str, list[str]]]:
    """Three versions of a tool-using support agent: v2 fixes most refund errors but is curt
    on half the orders (its tone fails); v3 fixes both."""
    project = new_project(
        tmp_path_factory, "compare", {"experiments/support.cobalt.py": SUPPORT_AGENT}
    )
    runs = [
        cobalt_run(project, "experiments/support.cobalt.py", env={"AGENT_VERSION": version})
        for version in ("1", "2", "3")
    ]
    with served(project) as url:
        yield url, runs


@needs_chromium
def test_in_one_screen_the_strip_says_b_fixes_errors_and_loses_on_tone(support, browser):  # noqa: F811
    from playwright.sync_api import expect

    url, (v1, v2, v3) = support
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    problems: list[str] = []
    tab = watched_tab(context, problems)
    tab.set_default_timeout(60_000)  # a loaded machine: the first compare imports scipy
    try:
        tab.goto(f"{url}/compare/?a={v1}&b={v2}")
        sentence = tab.locator("#verdict .verdict-sentence")
        expect(sentence).to_contain_text("B wins on errors and timeouts (5 → 1)")
        expect(sentence).to_contain_text("loses on tone (pass rate 100% → 49%, significant")
        box = tab.locator("#verdict").bounding_box()
        assert box["y"] + box["height"] <= 800, box  # above the fold
        tab.screenshot(path=str(ARTIFACTS / "compare-verdict-desktop.png"))

        # The side by side slides over with its own URL; j and k walk the compare rows.
        rows = tab.locator("tr.pair-row")
        first_key = rows.first.locator("code.key").inner_text()
        rows.first.get_by_role("link", name="diff", exact=True).click()
        tab.wait_for_url(re.compile(r"/compare/item/\?.*key=" + first_key))
        panel = tab.locator("dialog#side")
        expect(panel).to_have_attribute("data-modal", "true")
        expect(panel.locator("h2")).to_contain_text(first_key)
        expect(panel.locator("#trace-steps")).to_contain_text("draft reply")
        expect(panel.locator("#trace-steps")).to_contain_text("changed")
        opened = tab.url
        tab.screenshot(path=str(ARTIFACTS / "compare-side-by-side-desktop.png"))
        tab.keyboard.press("j")
        second_key = rows.nth(1).locator("code.key").inner_text()
        tab.wait_for_url(re.compile(r"key=" + second_key + "$"))
        expect(panel.locator("h2")).to_contain_text(second_key)
        expect(panel).to_have_attribute("data-modal", "true")
        tab.keyboard.press("k")
        tab.wait_for_url(opened)
        expect(panel.locator("h2")).to_contain_text(first_key)
        expect(panel).to_have_attribute("data-modal", "true")
        tab.keyboard.press("Escape")  # back past the panel's URLs to the compare page
        tab.wait_for_url(f"{url}/compare/?a={v1}&b={v2}")
        expect(tab.locator("dialog#side")).to_have_count(0)

        # A baseline against two runs: a column each.
        tab.goto(f"{url}/compare/?a={v1}&b={v2}&b={v3}")
        expect(tab.locator("#verdict-b1")).to_contain_text("B1 wins on errors and timeouts")
        expect(tab.locator("#verdict-b2")).to_contain_text("B2 wins on errors and timeouts (5 → 0)")
        expect(tab.locator("#verdict-b2")).not_to_contain_text("loses on tone")
        box = tab.locator("#verdict").bounding_box()
        assert box["y"] + box["height"] <= 800, box
        tab.screenshot(path=str(ARTIFACTS / "compare-three-runs-desktop.png"))
    finally:
        context.close()
    assert problems == []


@needs_chromium
@pytest.mark.parametrize("screen", ["phone", "dark"])
def test_the_strip_on_a_phone_and_in_dark(support, browser, screen):  # noqa: F811
    url, (v1, v2, _) = support
    options = (
        {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 2, "is_mobile": True}
        if screen == "phone"
        else {"viewport": {"width": 1280, "height": 800}, "color_scheme": "dark"}
    )
    context = browser.new_context(**options)
    tab = context.new_page()
    tab.set_default_timeout(60_000)
    try:
        for name, path in (
            ("compare", f"/compare/?a={v1}&b={v2}"),
            ("side", f"/compare/item/?a={v1}&b={v2}&key=o01"),
        ):
            tab.goto(url + path)
            width = tab.evaluate("document.documentElement.scrollWidth")
            assert width <= options["viewport"]["width"], (path, width)
            tab.screenshot(path=str(ARTIFACTS / f"compare-{name}-{screen}.png"))
    finally:
        context.close()


@needs_chromium
def test_compare_and_its_side_by_side_work_without_javascript(support, browser):  # noqa: F811
    from playwright.sync_api import expect

    url, (v1, v2, _) = support
    context = browser.new_context(
        java_script_enabled=False, viewport={"width": 1280, "height": 800}
    )
    tab = context.new_page()
    tab.set_default_timeout(60_000)
    try:
        tab.goto(f"{url}/compare/?a={v1}&b={v2}")
        expect(tab.locator("#verdict")).to_contain_text("B wins on errors and timeouts (5 → 1)")
        tab.locator("tr.pair-row").first.get_by_role("link", name="diff", exact=True).click()
        tab.wait_for_url(re.compile(r"/compare/item/\?"))
        expect(tab.locator("dialog#side")).to_be_visible()
        expect(tab.locator("#side .side-reasons")).to_contain_text("tone")
        tab.get_by_role("link", name="Next ›").click()
        tab.wait_for_url(re.compile(r"/compare/item/\?"))
        expect(tab.locator("dialog#side")).to_be_visible()
    finally:
        context.close()


@needs_chromium
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_finds_no_violation_on_the_compare_pages(support, browser, scheme):  # noqa: F811
    url, (v1, v2, v3) = support
    paths = (
        f"/compare/?a={v1}&b={v2}",
        f"/compare/?a={v1}&b={v2}&b={v3}",
        f"/compare/item/?a={v1}&b={v2}&key=o01",
        f"/compare/?a={v1}&b={v2}&change=score-down",
    )
    viewport = {"width": 1280, "height": 800}
    assert axe_violations(browser, url, paths, scheme=scheme, viewport=viewport) == {}
    # On a phone, with the group table and an item whose refund step failed ("failed here",
    # on its tint) too.
    phone = (*paths, f"/compare/?a={v1}&b={v2}&group=category", f"/runs/{v1}/items/1/")
    viewport = {"width": 390, "height": 844}
    assert axe_violations(browser, url, phone, scheme=scheme, viewport=viewport) == {}


def test_latency_tokens_and_cost_count_only_past_their_thresholds():
    from cobalt_app.compare_strip import notable, sentence

    assert not notable("latencyP50", 15.0, 7.0)  # −53%, but 8 ms: jitter
    assert notable("latencyP95", 1_000.0, 1_200.0, 50) and not notable(
        "latencyP95", 1_000, 1_040, 50
    )
    assert not notable("latencyP95", 100.0, 1_000.0, 5)  # 5 items: one cold start, not a trend
    assert notable("cost", 0.10, 0.12) and not notable("cost", 0.10, 0.104)
    assert notable("tokens", 0, 10) and notable("errors", 3, 4)
    assert sentence("B", [], [], []) == "B neither wins nor loses."
    assert sentence("B2", [], ["cost (+20%)"], ["judge"]) == (
        "B2 loses on cost (+20%); no significant change on judge."
    )
