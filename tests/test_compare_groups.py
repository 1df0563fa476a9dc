"""Compare grouped by a dataset field: which category regressed? In-process (query counts
pinned, the rows filtered to a group, j/k within it, N runs), then in headless Chromium after
real `cobalt run`s of the support agent (desktop, a 390 px phone, dark mode, axe, no JS).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.test import Client

from cobalt_app import run_search
from cobalt_app.models import ItemResult, Run
from tests.test_browser import (  # noqa: F401 (browser: a fixture)
    CHROMIUM,
    browser,
    watched_tab,
)
from tests.test_compare_page import support  # noqa: F401 (a fixture)
from tests.test_pages import keys, make_run, pair_rows, target

db = pytest.mark.django_db
needs_chromium = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
SHOTS = Path("/work/shots")


@pytest.fixture
def client() -> Client:
    return Client(HTTP_HOST="127.0.0.1")


def category(i: int) -> str:
    return "refund" if i % 2 else "shipping" if i % 4 == 0 else "billing"


def categorised(run: Run) -> Run:
    """The run's dataset items with a `category` (20 refund, 10 shipping, 10 billing)."""
    for item in ItemResult.objects.filter(run=run):
        item.input = {**item.input, "category": category(item.item_index)}
        item.save(update_fields=["input"])
    return run


def refund_curt() -> tuple[Run, Run]:
    """A crashes on five shipping items; B crashes on none but fails `tone` on every refund."""
    names = keys(40)
    a = make_run(
        keys=names,
        evaluators=("resolved", "tone"),
        errors={names[i]: "RuntimeError: refund tool down" for i in range(0, 20, 4)},
    )
    b = make_run(
        keys=names,
        evaluators=("resolved", "tone"),
        scores={names[i]: {"tone": 0.0} for i in range(1, 40, 2)},
    )
    return categorised(a), categorised(b)


def group_rows(page: str) -> list[tuple[str, str]]:
    """(value, "regressed"/"improved"/"") of each row of the groups table."""
    rows = re.findall(r'<tr class="group-row([^"]*)">\s*<th scope="row">(.*?)</th>', page, re.S)
    return [
        (re.sub(r"<[^>]+>", "", cell).split(" ")[0], kind.replace(" group-", "").strip())
        for kind, cell in rows
    ]


@db
def test_grouping_by_category_says_which_category_regressed(client, django_assert_num_queries):
    a, b = refund_curt()
    url = f"/compare/?a={a.id}&b={b.id}&group=category"
    run_search.available()  # whether the database has an index (asked once per process)
    # the compare's nine, then per run: its search index (none), its items counted, each
    # item's category in key order (`group_counts`)
    with django_assert_num_queries(15):
        page = client.get(url).content.decode()
    assert '<option value="category" selected>category</option>' in page
    assert group_rows(page) == [("refund", "regressed"), ("billing", ""), ("shipping", "")]
    sentence = re.search(r'<p class="group-sentence" id="groups-regressed">(.*?)</p>', page)[1]
    text = re.sub(r"<[^>]+>", "", sentence)
    assert text == "Regressed: category = refund on tone in B (100% → 0%, p &lt; 0.001)."
    refund = re.search(r'<tr class="group-row group-regressed">.*?</tr>', page, re.S)[0]
    assert "−100 pp" in refund and "paired test over 20 items, p &lt; 0.001" in refund
    shipping = re.search(r"<bdi>shipping</bdi>.*?</tr>", page, re.S)[0]
    assert ">5 → 0</td>" in shipping and 'class="num bad"' not in shipping  # fewer errors
    assert "too few items" in shipping  # five of its items were scored in both runs
    # A second visit reuses the groups and the tests: the compare's own queries.
    with django_assert_num_queries(7):
        assert group_rows(client.get(url).content.decode())[0] == ("refund", "regressed")


@db
def test_a_group_links_to_its_rows_and_the_side_by_side_walks_them(client):
    a, b = refund_curt()
    page = client.get(f"/compare/?a={a.id}&b={b.id}&group=category").content.decode()
    link = f"?a={a.id}&amp;b={b.id}&amp;group=category&amp;value=refund#pairs"
    assert f'href="{link}"' in page
    rows = client.get(f"/compare/?a={a.id}&b={b.id}&group=category&value=refund&sort=key")
    listed = rows.content.decode()
    assert [key for key, _ in pair_rows(listed)] == [keys(40)[i] for i in range(1, 40, 2)]
    assert "in <code>category</code> = <strong><bdi>refund</bdi></strong>" in listed
    assert "value=refund" in re.search(r'class="side-link" href="([^"]+)"', listed)[1]
    # The change filter counts within the group.
    assert '<option value="score-down" >score down (20)</option>' in listed
    side = client.get(
        f"/compare/item/?a={a.id}&b={b.id}&sort=key&group=category&value=refund&key=k003"
    ).content.decode()
    assert "key=k001" in side and "key=k005" in side and "key=k004" not in side
    # htmx: the groups and the rows, swapped together.
    partial = client.get(
        f"/compare/?a={a.id}&b={b.id}&group=category&value=billing", **target("grouped")
    ).content.decode()
    assert partial.lstrip().startswith('<div id="grouped">') and "<html" not in partial
    assert len(pair_rows(partial)) == 10


@db
def test_several_runs_each_get_their_columns_and_tests(client):
    a, b = refund_curt()
    c = categorised(make_run(keys=keys(40), evaluators=("resolved", "tone")))
    page = client.get(f"/compare/?a={a.id}&b={b.id}&b={c.id}&group=category").content.decode()
    assert '<th scope="col" class="num">tone B2</th>' in page
    assert "Errors A → B1 → B2" in page
    refund = re.search(r'<tr class="group-row group-regressed">.*?</tr>', page, re.S)[0]
    assert "tone in B1 (100% → 0%" in page and "tone in B2" not in page
    assert refund.count("±0 pp") == 3  # resolved in B1 and B2, tone in B2


# In Chromium, after real runs ---------------------------------------------------------------


@needs_chromium
@pytest.mark.parametrize("screen", ["desktop", "phone", "dark"])
def test_a_person_grouping_by_category_sees_which_regressed(support, browser, screen):  # noqa: F811
    from playwright.sync_api import expect

    from tests.helpers import axe_violations

    url, (v1, v2, _) = support
    viewport = (
        {"width": 390, "height": 844} if screen == "phone" else {"width": 1280, "height": 800}
    )
    options = {"viewport": viewport, "color_scheme": "dark" if screen == "dark" else "light"}
    if screen == "phone":
        options |= {"device_scale_factor": 2, "is_mobile": True}
    context = browser.new_context(**options)
    problems: list[str] = []
    tab = watched_tab(context, problems)
    tab.set_default_timeout(60_000)
    try:
        tab.goto(f"{url}/compare/?a={v1}&b={v2}")
        tab.get_by_label("Group by").select_option("category")
        tab.wait_for_url(re.compile(r"group=category"))
        sentence = tab.locator("#groups-regressed")
        expect(sentence).to_contain_text("Regressed: category = refund on tone in B")
        expect(tab.locator("tr.group-regressed")).to_have_count(1)
        expect(tab.locator("tr.group-regressed th")).to_contain_text("refund")
        width = tab.evaluate("document.documentElement.scrollWidth")
        assert width <= viewport["width"], width
        # The verdict strip fits whole, its Δ column too: nothing of it scrolls sideways.
        strip = tab.locator("#verdict .table-wrap")
        assert strip.evaluate("e => e.scrollWidth <= e.clientWidth"), screen
        tab.locator("#compare-groups").scroll_into_view_if_needed()
        SHOTS.mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(SHOTS / f"h3-compare-groups-{screen}.png"))
        tab.locator("tr.group-regressed th a").click()
        tab.wait_for_url(re.compile(r"value=refund"))
        expect(tab.locator("#pairs h2")).to_contain_text("in category = refund")
        expect(tab.locator("tr.pair-row")).to_have_count(20)
        grouped = tab.url
    finally:
        context.close()
    assert problems == []
    path = grouped.removeprefix(url)
    scheme = "dark" if screen == "dark" else "light"
    assert axe_violations(browser, url, [path], scheme=scheme, viewport=viewport) == {}


@needs_chromium
def test_grouping_works_without_javascript(support, browser):  # noqa: F811
    from playwright.sync_api import expect

    url, (v1, v2, _) = support
    context = browser.new_context(java_script_enabled=False)
    tab = context.new_page()
    tab.set_default_timeout(60_000)
    try:
        tab.goto(f"{url}/compare/?a={v1}&b={v2}")
        tab.get_by_label("Group by").select_option("category")
        tab.get_by_role("button", name="Group").click()
        tab.wait_for_url(re.compile(r"group=category"))
        expect(tab.locator("#groups-regressed")).to_contain_text("category = refund")
        tab.locator("tr.group-regressed th a").click()
        tab.wait_for_url(re.compile(r"value=refund"))
        expect(tab.locator("tr.pair-row")).to_have_count(20)
    finally:
        context.close()
