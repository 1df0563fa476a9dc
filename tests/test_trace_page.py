"""The item panel's timeline in headless Chromium, after a real `cobalt run` of an agent with
no Cobalt code (an OpenAI SDK tool loop against the fake provider), with and without
JavaScript. Screenshots go to `test-artifacts/trace-*.png`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fake_provider import FakeProvider
from tests.test_browser import ARTIFACTS, CHROMIUM, browser, page  # noqa: F401 - fixtures
from tests.trace_agents import WEATHER_EXPERIMENT, weather_site

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")


@pytest.fixture(scope="module")
def site(tmp_path_factory, fake_provider_server: FakeProvider) -> Iterator[tuple[str, str]]:
    with weather_site(tmp_path_factory, fake_provider_server, WEATHER_EXPERIMENT) as served:
        yield served


def test_the_item_panel_shows_the_agents_steps_as_a_timeline(site, page):  # noqa: F811
    from playwright.sync_api import expect

    url, run_id = site
    page.goto(f"{url}/runs/{run_id}/?view=all")
    page.get_by_role("link", name="#1", exact=True).click()  # Paris
    panel = page.locator("#item-panel")
    expect(panel).to_be_visible()
    expect(panel.locator("#trace-summary")).to_have_text("3 steps: 2 model calls, 1 tool call")
    steps = panel.locator("ol.timeline > li")
    expect(steps).to_have_count(3)
    expect(steps.nth(0)).to_contain_text("ChatCompletion")
    expect(steps.nth(0)).to_contain_text("gpt-4o-mini")
    expect(steps.nth(0)).to_contain_text("tok")
    tool = steps.nth(1)
    expect(tool).to_contain_text("get_weather")
    expect(tool.locator("pre.output")).to_be_hidden()
    tool.locator("summary").click()
    expect(tool.locator("pre.call")).to_have_text('get_weather(city="Paris")')
    expect(tool.locator("pre.output")).to_have_text("sunny in Paris")
    expect(panel.locator(".verdicts")).to_contain_text("1 tool call(s) match the 1 expected")
    page.screenshot(path=str(ARTIFACTS / "trace-timeline.png"), full_page=True)


def test_the_timeline_reads_without_javascript(site, browser):  # noqa: F811 - fixture
    from playwright.sync_api import expect

    url, run_id = site
    context = browser.new_context(
        java_script_enabled=False, viewport={"width": 1360, "height": 900}
    )
    tab = context.new_page()
    try:
        tab.goto(f"{url}/runs/{run_id}/?view=all")
        tab.get_by_role("link", name="#4", exact=True).click()  # Atlantis: failed in its tool
        tab.wait_for_url("**/items/*/?view=all")
        steps = tab.locator("ol.timeline > li")
        expect(steps).to_have_count(2)
        expect(tab.locator("pre.error").first).to_contain_text("no weather station in Atlantis")
        first = steps.nth(0)
        first.locator("summary").first.click()  # <details> opens natively
        expect(first.locator(".message-assistant pre.call")).to_have_text(
            'get_weather(city="Atlantis")'
        )
        tab.screenshot(
            path=str(ARTIFACTS / "trace-timeline-without-javascript.png"), full_page=True
        )
    finally:
        context.close()
