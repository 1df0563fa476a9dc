"""Traces you can read, in headless Chromium after a real `cobalt run` of a tool-using agent
(the OpenAI SDK against the fake provider) judged by a real LLM judge: on a 390 px phone the
item page never scrolls sideways, the tools offered are folded, the failing step is marked and
open, the judge's call opens under its score. Screenshots go to `test-artifacts/`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fake_provider import FakeProvider
from tests.test_browser import ARTIFACTS, CHROMIUM, browser  # noqa: F401 - fixture
from tests.trace_agents import WEATHER_EXPERIMENT, weather_site

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")

# The weather agent with a long tool description (a schema that would widen a phone's page)
# and an LLM judge.
EXPERIMENT = WEATHER_EXPERIMENT.replace(
    '"name": "get_weather",',
    '"name": "get_weather", "description": "https://example.com/' + "a" * 150 + '",',
).replace(
    'evaluators=[Evaluator(name="tools", type="tool-calls")]',
    'evaluators=[Evaluator(name="tools", type="tool-calls"), '
    'Evaluator(name="judge", prompt="Good? {{output}} [[score:0.9]]")]',
)
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def site(tmp_path_factory, fake_provider_server: FakeProvider) -> Iterator[tuple[str, str]]:
    with weather_site(tmp_path_factory, fake_provider_server, EXPERIMENT) as served:
        yield served


def overflow(tab) -> int:
    """How many pixels the page is wider than the screen (0: no sideways scrolling)."""
    return tab.evaluate("document.documentElement.scrollWidth - window.innerWidth")


def item_link(tab, url: str, run_id: str, number: int) -> str:
    tab.goto(f"{url}/runs/{run_id}/?view=all")
    return tab.get_by_role("link", name=f"#{number}", exact=True).get_attribute("href")


def test_an_item_with_a_trace_fits_a_phone_with_everything_open(site, browser):  # noqa: F811
    url, run_id = site
    context = browser.new_context(viewport=PHONE, color_scheme="dark")  # dark: a screenshot of it
    tab = context.new_page()
    try:
        for number in (1, 4):  # Paris, and Atlantis (failed in its tool)
            tab.goto(url + item_link(tab, url, run_id, number))
            assert overflow(tab) == 0
            tab.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
            assert overflow(tab) == 0, f"item #{number} is wider than the phone when opened"
            tab.screenshot(
                path=str(ARTIFACTS / f"trace-view-phone-dark-{number}.png"), full_page=True
            )
    finally:
        context.close()


def test_tools_are_folded_the_failing_step_is_open_and_the_judge_call_opens(site, browser):  # noqa: F811
    from playwright.sync_api import expect

    url, run_id = site
    context = browser.new_context(
        java_script_enabled=False, viewport={"width": 1280, "height": 900}
    )
    tab = context.new_page()
    try:
        tab.goto(url + item_link(tab, url, run_id, 4))  # Atlantis
        failed = tab.locator("li.step-failed")
        expect(failed).to_have_count(1)
        expect(failed.locator(".failed-here")).to_be_visible()  # open on load, no click
        expect(failed.locator("pre.error")).to_contain_text("no weather station in Atlantis")
        expect(failed.locator("pre.call")).to_have_text('get_weather(city="Atlantis")')
        expect(tab.locator("#trace-totals")).to_contain_text("failed at step 2")

        tab.goto(url + item_link(tab, url, run_id, 1))  # Paris
        first = tab.locator("#step-1")
        first.locator("summary").first.click()
        fold = first.locator("details.tools-defined")
        expect(fold.locator("summary")).to_have_text("1 tool defined")
        expect(fold.locator("pre.schema")).to_be_hidden()  # folded
        fold.locator("summary").click()
        expect(fold.locator("pre.schema")).to_be_visible()
        expect(first.locator(".message-user")).to_contain_text("Weather in Paris?")
        expect(first.locator(".message-assistant pre.call")).to_have_text(
            'get_weather(city="Paris")'
        )
        judge = tab.locator("table.verdicts details.judge-call")
        expect(judge).to_have_count(1)  # the llm judge's, not the tool-calls check's
        expect(judge.locator(".message-user")).to_be_hidden()
        judge.locator("summary").click()
        expect(judge.locator(".message-user")).to_contain_text("Good? tool said: sunny in Paris")
        expect(judge.locator(".message-assistant")).to_contain_text('"score": 0.9')
        tab.screenshot(path=str(ARTIFACTS / "trace-view-desktop.png"), full_page=True)
    finally:
        context.close()
