"""In headless Chromium against a real `cobalt serve`: a run with repetitions (one row per item,
a tab per repeat opening on the worst), what the pages weigh (gzip, Chart.js only where a chart
is drawn) and axe-core on the API docs and the repetition views."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import cobalt_run, new_project, served
from tests.helpers import axe_violations
from tests.test_browser import (  # noqa: F401 (browser: a fixture)
    CHROMIUM,
    browser,
    page,
    shot,
)

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")

# A router asked three times per item: r1 fails its second repeat only, r2 fails every one.
ROUTER_EXPERIMENT = """
from cobalt import Dataset, Evaluator, experiment

dataset = Dataset(
    items=[{"id": f"r{i}", "input": f"route {i}", "expected": f"team {i % 3}"} for i in range(6)]
)


def route(ctx):
    i = int(ctx.item["id"][1:])
    if i == 1 and ctx.run_index == 1:
        return "team 9"
    if i == 2:
        return "nobody"
    return ctx.item["expected"]


@experiment(
    "router",
    dataset,
    evaluators=[Evaluator(name="exact", type="exact-match", field="expected")],
    runs=3,
)
def run(ctx):
    return route(ctx)
"""


@dataclass
class Site:
    url: str
    run: str


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[Site]:
    project = new_project(
        tmp_path_factory, "weight", {"experiments/router.cobalt.py": ROUTER_EXPERIMENT}
    )
    run = cobalt_run(project, "experiments/router.cobalt.py", env={})
    with served(project) as url:
        yield Site(url=url, run=run)


def test_the_item_panel_opens_on_the_worst_repeat_with_a_tab_per_repeat(site, page):  # noqa: F811
    from playwright.sync_api import expect

    page.goto(f"{site.url}/runs/{site.run}/")
    rows = page.locator(".item-row")
    expect(rows).to_have_count(2)  # one row per item: r2 never passed, r1 once did not
    expect(rows.locator(".repeat-passes")).to_have_text(["0 of 3 passed", "2 of 3 passed"])
    rows.nth(1).get_by_role("link", name="#2", exact=True).click()
    panel = page.locator("#item-panel")
    expect(panel).to_have_attribute("data-modal", "true")
    expect(page.locator("#item-title")).to_have_text("Item #2 · repeat 2 of 3")
    expect(page.locator("#repeat-label")).to_have_text("repeat 2 of 3 · failed")
    tabs = page.locator("#repeat-tabs a")
    expect(tabs).to_have_text(
        ["repeat 1 of 3 · passed", "repeat 2 of 3 · failed", "repeat 3 of 3 · passed"]
    )
    expect(tabs.nth(1)).to_have_attribute("aria-current", "page")
    expect(page.locator("#item-output")).to_have_text("team 9")
    diff = page.locator("#repeat-output-diff")
    expect(diff.locator("del")).to_have_text("1")
    expect(diff.locator("ins")).to_have_text("9")
    shot(page, "30-repeat-tabs")

    tabs.nth(0).click()
    page.wait_for_url(re.compile(r"/items/\d+/\?repeat=1$"))
    expect(page.locator("#repeat-label")).to_have_text("repeat 1 of 3 · passed")
    expect(page.locator("#item-output")).to_have_text("team 1")
    expect(tabs.nth(0)).to_have_attribute("aria-current", "page")
    expect(panel).to_have_attribute("data-modal", "true")
    page.keyboard.press("Escape")  # back past both of the panel's URLs
    page.wait_for_url(f"**/runs/{site.run}/")
    expect(page.locator("#item-panel")).to_have_count(0)


def test_a_repeated_item_fits_a_phone(site, browser):  # noqa: F811
    context = browser.new_context(
        viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True
    )
    tab = context.new_page()
    try:
        listing = httpx.get(f"{site.url}/runs/{site.run}/").text
        item = html.unescape(re.search(r'href="(/runs/\w+/items/\d+/[^"#]*)"', listing)[1])
        for path in (f"/runs/{site.run}/", item):
            tab.goto(site.url + path)
            assert tab.evaluate("document.documentElement.scrollWidth") <= 390, path
        shot(tab, "31-mobile-repeat-tabs")
    finally:
        context.close()


def test_chart_js_loads_only_where_a_chart_is_drawn_and_pages_come_gzipped(site, page):  # noqa: F811
    fetched: list[str] = []
    page.on("request", lambda request: fetched.append(request.url))
    listing = httpx.get(f"{site.url}/runs/{site.run}/").text
    item = html.unescape(re.search(r'href="(/runs/\w+/items/\d+/[^"#]*)"', listing)[1])
    for path in ("/", item, "/sweeps/", "/traces/"):
        response = page.goto(site.url + path)
        assert response.header_value("content-encoding") == "gzip", path  # Chromium asks
        assert not [url for url in fetched if "chart.umd" in url], path
    page.goto(f"{site.url}/runs/{site.run}/")
    page.wait_for_selector("canvas[data-chart=histogram][data-drawn]")
    assert [url for url in fetched if "chart.umd" in url]
    plain = httpx.get(f"{site.url}/", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers and plain.text.startswith("<!doctype html>")
    packed = httpx.get(f"{site.url}/runs/{site.run}/", headers={"Accept-Encoding": "gzip"})
    assert packed.headers["content-encoding"] == "gzip" and "repeat-passes" in packed.text


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_finds_no_wcag_aa_violation_on_the_api_docs_and_repetition_views(
    site,
    browser,  # noqa: F811
    scheme,
):
    listing = httpx.get(f"{site.url}/runs/{site.run}/").text
    item = html.unescape(re.search(r'href="(/runs/\w+/items/\d+/[^"#]*)"', listing)[1])
    paths = (
        "/api/docs/",
        f"/runs/{site.run}/",
        f"/runs/{site.run}/?view=all",
        f"/runs/{site.run}/?view=all&evaluator=exact&max=0.5",
        item,
        item + "?repeat=1",
        "/trends/?experiment=router",
    )
    found = axe_violations(
        browser,
        site.url,
        paths,
        scheme=scheme,
        viewport={"width": 1360, "height": 900},
        ready={"/api/docs/": ".opblock-summary"},  # drawn by Swagger UI from the schema
    )
    assert found == {}
    phone = axe_violations(
        browser,
        site.url,
        paths,
        scheme=scheme,
        viewport={"width": 390, "height": 844},
        ready={"/api/docs/": ".opblock-summary"},
    )
    assert phone == {}
