"""The dashboard in headless Chromium against a real `cobalt serve`, after real `cobalt run`s.

Screenshots go to `test-artifacts/` at the repository root. Every page is checked for
console errors; an agent output `<script>alert(1)</script>` must show as text (a dialog
would fail the test).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import (
    REPO,
    Project,
    assert_static_files_are_hashed_compressed_and_cached,
    cli_env,
    cobalt_run,
    new_project,
    served,
)
from tests.helpers import axe_violations

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = REPO / "test-artifacts"
XSS = "<script>alert(1)</script>"
POLL_SECONDS = 2  # cobalt_app.views.POLL_SECONDS

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")

QA_EXPERIMENT = """
import os

from cobalt import Dataset, Evaluator, experiment

VERSION = os.environ.get("AGENT_VERSION", "1")
dataset = Dataset(
    items=[{"id": f"q{i:02d}", "input": f"question {i}", "expected": f"answer {i}"}
           for i in range(60)]
)


def agent(item):
    i = int(item["id"][1:])
    if i == 3:
        return "<script>alert(1)</script>"
    if i == 4 and VERSION == "2":
        raise RuntimeError("agent crashed on q04")
    if VERSION == "2" and i % 5 == 0:
        return "wrong"
    if VERSION == "1" and i % 7 == 0:
        return "wrong"
    return item["expected"]


def length(ctx):
    size = len(str(ctx.output))
    return {"score": min(1.0, size / 10), "reason": f"{size} characters"}


evaluators = [
    Evaluator(name="exact", type="exact-match", field="expected"),
    Evaluator(name="length", type="function", fn=length),
]


@experiment("qa", dataset, evaluators=evaluators, tags=[f"v{VERSION}"])
def run(ctx):
    return {"output": agent(ctx.item), "metadata": {"version": VERSION}}
"""

# Each item waits until the test creates its gate file: the test decides when the run moves.
SLOW_EXPERIMENT = """
import asyncio
import os
from pathlib import Path

from cobalt import Dataset, Evaluator, experiment

GATES = Path(os.environ["GATE_DIR"])


@experiment("slow", Dataset(items=[{"id": f"s{i}"} for i in range(3)]), concurrency=1,
            timeout=120, evaluators=[Evaluator(name="done", type="function", fn=lambda c: 1.0)])
async def run(ctx):
    while not (GATES / str(ctx.index)).exists():
        await asyncio.sleep(0.02)
    return f"finished {ctx.index}"
"""


@dataclass
class Site:
    project: Project
    url: str
    runs: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def cobalt(self, *args: str, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "cobalt_cli", *args],
            cwd=self.project.path,
            env=cli_env({**self.env, **kwargs.pop("env", {})}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **kwargs,
        )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[Site]:
    project = new_project(
        tmp_path_factory,
        "dashboard",
        {"experiments/qa.cobalt.py": QA_EXPERIMENT, "experiments/slow.cobalt.py": SLOW_EXPERIMENT},
    )
    gates = project.path / "gates"
    gates.mkdir()
    env = {"GATE_DIR": str(gates)}
    first = cobalt_run(project, "experiments/qa.cobalt.py", env={**env, "AGENT_VERSION": "1"})
    second = cobalt_run(project, "experiments/qa.cobalt.py", env={**env, "AGENT_VERSION": "2"})
    with served(project) as url:
        yield Site(project=project, url=url, runs=[first, second], env=env)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def watched_tab(context, problems: list[str]):
    """A new tab of `context` whose console errors, uncaught exceptions and JavaScript
    dialogs are appended to `problems`."""
    tab = context.new_page()
    tab.on(
        "console",
        lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
    )
    tab.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    tab.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    tab.set_default_timeout(15_000)
    return tab


@pytest.fixture
def page(browser):
    """A page that records console errors, uncaught exceptions and JavaScript dialogs."""
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    problems: list[str] = []
    tab = watched_tab(context, problems)
    yield tab
    context.close()
    assert problems == []


def shot(tab, name: str) -> None:
    tab.screenshot(path=str(ARTIFACTS / f"dashboard-{name}.png"), full_page=True)


def chart_labels(tab, kind: str) -> list[str]:
    tab.wait_for_selector(f"canvas[data-chart={kind}][data-drawn]")
    return tab.evaluate(
        "kind => Chart.getChart(document.querySelector(`canvas[data-chart=${kind}]`)).data.labels",
        kind,
    )


def test_from_the_list_into_a_run_and_its_item_panel(site, page):
    from playwright.sync_api import expect

    first, second = site.runs
    page.goto(site.url + "/")
    links = page.locator("a.run-link")
    expect(links).to_have_count(2)
    shot(page, "01-runs-list")

    links.first.click()  # newest first
    page.wait_for_url(f"**/runs/{second}/")
    assert len(chart_labels(page, "histogram")) == 10
    expect(page.locator("#progress-count")).to_have_text("60 / 60 items")
    shot(page, "02-run-detail")

    page.get_by_role("link", name="#4", exact=True).click()
    panel = page.locator("#item-panel")
    expect(panel).to_be_visible()
    expect(page.locator("#item-output")).to_have_text(XSS)  # shown as text, never run
    expect(page.locator("#item-expected")).to_have_text("answer 3")
    expect(panel).to_contain_text("25 characters")
    shot(page, "03-item-panel")
    expect(panel).to_have_attribute("data-modal", "true")  # reopened as a modal by cobalt.js
    page.keyboard.press("Escape")
    expect(panel).to_be_hidden()
    page.wait_for_url(f"**/runs/{second}/")  # closing the panel goes back to the run

    page.get_by_role("link", name="#5", exact=True).click()
    expect(page.locator("#item-panel pre.error")).to_have_text("RuntimeError: agent crashed on q04")
    expect(panel).to_have_attribute("data-modal", "true")
    page.keyboard.press("Escape")
    expect(panel).to_be_hidden()

    page.get_by_role("link", name="All items").click()
    page.wait_for_url("**?view=all")
    expect(page.locator(".item-row")).to_have_count(50)
    page.get_by_role("link", name="Next ›").click()
    page.wait_for_url("**page=2")
    expect(page.locator(".item-row")).to_have_count(10)
    expect(page.locator(".item-row").first).to_contain_text("q50")
    page.go_back()
    page.wait_for_url(f"**/runs/{second}/?view=all")
    expect(page.locator(".item-row")).to_have_count(50)


def test_the_run_page_opens_on_its_failures_worst_first_in_colour(site, browser):
    from playwright.sync_api import expect

    _, second = site.runs
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    tab = context.new_page()
    try:
        tab.goto(f"{site.url}/runs/{second}/")
        rows = tab.locator(".item-row")
        # v2 crashed on q04 and answered "wrong" or a script to q00, q03, q05, … (14 in all).
        expect(rows).to_have_count(14)
        expect(rows.first).to_contain_text("#5")
        expect(rows.first.locator("td.why")).to_have_text("RuntimeError: agent crashed on q04")
        expect(rows.nth(1).locator("td.why")).to_contain_text("exact:")
        assert rows.first.bounding_box()["y"] + 40 < 900  # above the fold at 1440×900

        fail = tab.locator(".item-row .score-cell.score-fail").first
        passed = tab.locator(".item-row .score-cell.score-pass").first
        expect(fail).to_have_text("0.00")  # the value is printed, not only coloured

        def colours(cell) -> tuple[str, str]:
            return cell.evaluate(
                "c => [getComputedStyle(c).color, getComputedStyle(c).backgroundColor]"
            )

        assert colours(fail) != colours(passed)
        assert colours(fail)[1] != "rgba(0, 0, 0, 0)" and colours(passed)[1] != "rgba(0, 0, 0, 0)"
        chip = tab.locator(".eval-chips a.score-chip", has_text="length")
        expect(chip).to_have_class(re.compile("score-pass"))
        shot(tab, "11-failures-first")

        # An evaluator's chip lists that evaluator's failures: `length` fails nowhere, so
        # only the crashed item is left.
        chip.click()
        tab.wait_for_url("**evaluator=length")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text("#5")
        tab.get_by_role("link", name="All items").click()
        expect(rows).to_have_count(50)
    finally:
        context.close()


def test_scores_read_fail_borderline_or_pass_on_one_scale_with_a_legend(site, page):
    from playwright.sync_api import expect

    _, second = site.runs
    page.goto(f"{site.url}/runs/{second}/?view=all")
    rows = page.locator(".item-row")
    # `length` scores "wrong" 0.50, right at its 0.5 pass mark: it passes, only just.
    wrong = rows.filter(has_text="#1").first  # q00 answered "wrong" in v2
    cells = {
        verdict: wrong.locator(f".score-cell.score-{verdict}").first
        for verdict in ("fail", "borderline")
    }
    cells["pass"] = rows.filter(has_text="#2").first.locator(".score-cell.score-pass").first
    expect(cells["fail"]).to_have_text("0.00")  # exact
    expect(cells["borderline"]).to_have_text("0.50")  # length, at the mark
    expect(cells["pass"]).to_have_text("1.00")

    def style(cell) -> tuple[str, str, str]:
        return tuple(
            cell.evaluate(
                "c => [getComputedStyle(c).color, getComputedStyle(c).backgroundColor,"
                " getComputedStyle(c, '::before').content]"
            )
        )

    fail, borderline, passed = (style(cells[v]) for v in ("fail", "borderline", "pass"))
    assert len({fail[:2], borderline[:2], passed[:2]}) == 3  # three colours
    assert "rgba(0, 0, 0, 0)" not in (fail[1], borderline[1], passed[1])
    # Beyond colour: a mark before fail and borderline values, none before a pass.
    assert (fail[2], borderline[2], passed[2]) == ('"✗ "', '"≈ "', "none")
    legend = page.locator(".score-legend")
    expect(legend).to_contain_text("borderline at or above it by less than 0.10")
    assert "by less than 0.10" in legend.get_attribute("title")


def test_flaky_marks_only_count_runs_of_the_same_version(site, page):
    from playwright.sync_api import expect

    _, second = site.runs
    # v1 and v2 differ (other tags, other answers): the verdicts that changed between them
    # say the agent changed, not that it is flaky.
    page.goto(f"{site.url}/runs/{second}/?view=all")
    expect(page.locator(".item-row")).to_have_count(50)
    expect(page.locator(".flaky-mark")).to_have_count(0)


def test_the_item_panel_has_its_own_url_with_back_forward_and_j_k(site, page):
    from playwright.sync_api import expect

    _, second = site.runs
    page.goto(f"{site.url}/runs/{second}/?view=all")
    page.get_by_role("link", name="#4", exact=True).click()
    page.wait_for_url(re.compile(r"/runs/\w+/items/\d+/\?view=all$"))
    item_url = page.url
    panel = page.locator("#item-panel")
    expect(page.locator("#item-output")).to_have_text(XSS)
    expect(panel).to_have_attribute("data-modal", "true")  # settled: its links are live
    page.keyboard.press("j")  # the next item
    expect(page.locator("#item-panel pre.error")).to_have_text("RuntimeError: agent crashed on q04")
    assert page.url != item_url
    expect(panel).to_have_attribute("data-modal", "true")
    page.keyboard.press("k")  # back to #4
    expect(page.locator("#item-output")).to_have_text(XSS)
    page.wait_for_url(item_url)
    expect(panel).to_have_attribute("data-modal", "true")
    page.keyboard.press("Escape")  # closing goes back past the three item URLs
    page.wait_for_url(f"**/runs/{second}/?view=all")
    expect(page.locator("#item-panel")).to_have_count(0)
    page.go_forward()
    page.wait_for_url(item_url)
    expect(page.locator("#item-output")).to_have_text(XSS)
    page.go_back()
    page.wait_for_url(f"**/runs/{second}/?view=all")
    expect(page.locator("#item-panel")).to_have_count(0)


def test_static_files_have_hashed_names_and_are_served_compressed_and_cached_long(site):
    assert_static_files_are_hashed_compressed_and_cached(site.url)


def test_compare_two_runs_item_by_item_with_a_diff(site, page):
    from playwright.sync_api import expect

    first, second = site.runs
    page.goto(site.url + "/")
    page.get_by_label(f"Compare {first} as A").check()
    page.get_by_label(f"Compare {second} as B").check()
    page.get_by_role("button", name="Compare A with B").click()
    page.wait_for_url(re.compile(r"/compare/\?"))
    assert sorted(page.url.split("?")[1].split("&")) == [f"a={first}", f"b={second}"]
    assert chart_labels(page, "compare") == ["exact", "length"]
    # 10 items regressed and 7 improved on `exact`: McNemar's test finds no significant change.
    expect(page.locator("table.deltas")).to_contain_text("no significant change")
    rows = page.locator("tr.pair-row")
    expect(rows).to_have_count(50)  # every matched item, 50 a page
    expect(page.locator("#pairs .pager")).to_contain_text("Items 1–50 of 60")
    expect(rows.first).to_contain_text("q04")  # crashed in B: the worst change
    expect(rows.first).to_contain_text("B error")
    shot(page, "04-compare")

    page.get_by_label("Change").select_option("regressed")
    page.wait_for_url("**change=regressed**")
    expect(rows).to_have_count(11)  # q04 and the ten answers that went wrong
    expect(page.locator("tr.pair-row.change-regressed")).to_have_count(11)

    rows.nth(1).get_by_role("link", name="diff").click()
    side = page.locator("#side")
    expect(side).to_contain_text("side by side")
    # Falls of -1 first, the larger fall of `length` breaking the tie: q10 before q05.
    expect(side.locator("pre.output").nth(0)).to_have_text("answer 10")
    expect(side.locator("pre.output").nth(1)).to_have_text("wrong")
    expect(side.locator("pre.diff del")).to_have_text("answer 10")
    expect(side.locator("pre.diff ins")).to_have_text("wrong")
    shot(page, "05-compare-side-by-side")

    href = rows.nth(1).get_by_role("link", name="in B").get_attribute("href")
    page.goto(site.url + href)
    expect(page.locator("#item-output")).to_have_text("wrong")


def test_compare_picks_survive_a_filter_that_hides_the_picked_run(site, page):
    from playwright.sync_api import expect

    first, second = site.runs
    page.goto(site.url + "/")
    page.get_by_label(f"Compare {first} as A").check()
    page.get_by_label("Tag").select_option("v2")  # the list now shows only the v2 run
    expect(page.get_by_label(f"Compare {first} as A")).to_have_count(0)
    page.get_by_label(f"Compare {second} as B").check()
    expect(page.locator("#compare-picks")).to_have_text(f"A: {first} · B: {second}")
    page.get_by_role("button", name="Compare A with B").click()
    page.wait_for_url(re.compile(r"/compare/\?"))
    assert sorted(page.url.split("?")[1].split("&")) == [f"a={first}", f"b={second}"]


def test_picking_two_trend_points_opens_their_compare(site, page):
    from playwright.sync_api import expect

    first, second = site.runs
    page.goto(site.url + "/trends/?experiment=qa")
    assert len(chart_labels(page, "trends")) == 2
    # Straight lines between runs: no smoothing invents values between two of them.
    assert page.evaluate(
        "Chart.getChart(document.querySelector('canvas[data-chart=trends]')).data.datasets"
        ".every(d => d.tension === 0)"
    )

    def click_point(selector: str, index: int) -> None:
        canvas = page.locator(selector)
        canvas.scroll_into_view_if_needed()
        page.wait_for_selector(selector + "[data-drawn]")
        box = canvas.bounding_box()
        x, y = page.evaluate(
            """([selector, index]) => { const point = Chart.getChart(document.querySelector(
                 selector)).getDatasetMeta(0).data[index]; return [point.x, point.y]; }""",
            [selector, index],
        )
        page.mouse.click(box["x"] + x, box["y"] + y)

    # Error rate, cost and latency beside the scores: v2 crashed on one item of 60.
    errors = page.evaluate(
        "Chart.getChart(document.querySelector('canvas[data-metric=errorRate]'))"
        ".data.datasets[0].data"
    )
    assert errors == [0, 1 / 60]
    shot(page, "06-trends")
    click_point("canvas[data-chart=trends]:not([data-metric])", 1)  # the newer run first
    expect(page.locator("#trend-pick")).to_contain_text(f"Picked run {second}")
    expect(page.locator("#trend-pick a")).to_have_attribute("href", f"/runs/{second}/")
    click_point("canvas[data-metric=errorRate]", 0)  # on another chart: the same runs
    page.wait_for_url(re.compile(r"/compare/\?"))
    assert page.url.endswith(f"/compare/?a={first}&b={second}")  # the older run is A


def test_a_running_run_updates_itself_and_stops_polling_when_done(site, page):
    from playwright.sync_api import expect

    gates = Path(site.env["GATE_DIR"])
    runner = site.cobalt("run", "experiments/slow.cobalt.py")
    try:
        run_id = None
        deadline = time.monotonic() + 60
        while run_id is None and time.monotonic() < deadline:
            listing = httpx.get(site.url + "/?status=running&name=slow").text
            found = re.search(r'class="run-link" href="/runs/(\w+)/"', listing)
            run_id = found.group(1) if found else None
        assert run_id, "the slow run never showed up as running"

        polls: list[int] = []
        page.on(
            "response",
            lambda r: (
                polls.append(r.status) if r.request.headers.get("hx-target") == "live" else None
            ),
        )
        page.goto(f"{site.url}/runs/{run_id}/?view=all")
        expect(page.locator("#run-status")).to_have_text("running")
        expect(page.locator("#progress-count")).to_have_text("0 / 3 items")
        # A value typed into the filter form, not yet submitted, survives the live updates.
        typed = page.locator("#item-filters input[name=min]")
        typed.click()
        typed.type("0.3")

        (gates / "0").touch()
        expect(page.locator("#progress-count")).to_have_text("1 / 3 items")
        expect(page.locator(".item-row").first.locator(".status")).to_have_text("ok")
        expect(page.locator("#run-pace")).to_contain_text("ETA")
        expect(typed).to_have_value("0.3")
        expect(typed).to_be_focused()
        shot(page, "07-live-running")

        (gates / "1").touch()
        (gates / "2").touch()
        expect(page.locator("#run-status")).to_have_text("completed", timeout=30_000)
        assert runner.wait(timeout=60) == 0, runner.stderr.read()
        expect(page.locator(".item-row .status")).to_have_text(["ok", "ok", "ok"])
        expect(typed).to_have_value("0.3")
        assert polls[-1] == 286 and all(status == 200 for status in polls[:-1])
        # Polling has stopped: nothing more is asked for over more than two intervals.
        # (A wait is the only way to observe that nothing happens.)
        seen = len(polls)
        page.wait_for_timeout(POLL_SECONDS * 2500)
        assert len(polls) == seen
        assert page.locator("#live").get_attribute("hx-trigger") is None
        shot(page, "08-live-finished")
    finally:
        for index in range(3):
            (gates / str(index)).touch()
        if runner.poll() is None:
            runner.terminate()
            runner.wait(timeout=30)


def test_the_pages_work_without_javascript(site, browser):
    from playwright.sync_api import expect

    _, second = site.runs
    context = browser.new_context(
        java_script_enabled=False, viewport={"width": 1360, "height": 900}
    )
    tab = context.new_page()
    try:
        tab.goto(site.url + "/?name=qa")
        tab.locator("a.run-link").first.click()
        tab.wait_for_url(f"**/runs/{second}/")
        expect(tab.locator(".item-row")).to_have_count(14)  # the failures first
        tab.get_by_role("link", name="All items").click()
        tab.wait_for_url(f"**/runs/{second}/?view=all")
        expect(tab.locator(".item-row")).to_have_count(50)
        expect(tab.locator("table.scores")).to_contain_text("exact")
        tab.get_by_role("link", name="Next ›").click()
        tab.wait_for_url("**?view=all&page=2")
        expect(tab.locator(".item-row").first).to_contain_text("q50")
        tab.go_back()
        tab.get_by_role("link", name="#4", exact=True).click()
        tab.wait_for_url("**/items/*/?view=all")
        expect(tab.locator("#item-output")).to_have_text(XSS)
        shot(tab, "09-item-page-without-javascript")
    finally:
        context.close()


def test_a_sort_clicked_while_a_filter_is_pending_keeps_both(site, page):
    from playwright.sync_api import expect

    first, second = site.runs
    # Every settled swap is recorded: the URL, the sorted column and the runs shown.
    page.add_init_script(
        """document.addEventListener("htmx:afterSettle", () => {
             const sorted = document.querySelector("#runs th[aria-sort=ascending]");
             (window.settled = window.settled || []).push({
               url: location.search, name: document.querySelector("#filter-name").value,
               sorted: sorted ? sorted.textContent.trim() : null,
               runs: [...document.querySelectorAll("a.run-link")].map(a => a.textContent)});
           });"""
    )
    page.goto(site.url + "/?sort=-created")
    page.locator("#filter-name").fill("qa")
    page.get_by_role("link", name="Errors").click()  # before the typed filter was sent
    expect(page).to_have_url(re.compile(r"sort=errors"))
    expect(page).to_have_url(re.compile(r"name=qa"))
    expect(page.locator("th[aria-sort=ascending]")).to_have_text(re.compile("^Errors"))
    expect(page.locator("a.run-link")).to_have_count(2)
    ids = page.locator("a.run-link + code.id").all_text_contents()
    assert ids == [first, second]  # no errors, then one
    states = page.evaluate("window.settled")
    assert states, "no swap was recorded"
    for state in states:  # no swap ever showed one request's URL over another's table
        params = dict(p.split("=", 1) for p in state["url"].lstrip("?").split("&") if p)
        assert params.get("name", "") == state["name"] == "qa", state
        assert all(name == "qa" for name in state["runs"]), state
        assert state["sorted"] is None or state["sorted"].startswith("Errors"), state


def test_dark_mode_follows_the_system_and_the_toggle_remembers(site, browser):
    from playwright.sync_api import expect

    _, second = site.runs
    context = browser.new_context(color_scheme="dark", viewport={"width": 1360, "height": 900})
    tab = context.new_page()

    def background() -> str:
        return tab.evaluate("getComputedStyle(document.documentElement).backgroundColor")

    def luminance(rgb: str) -> float:
        red, green, blue = (int(v) for v in re.findall(r"\d+", rgb)[:3])
        return 0.2126 * red + 0.7152 * green + 0.0722 * blue

    try:
        tab.goto(f"{site.url}/runs/{second}/")
        assert luminance(background()) < 60
        fail = tab.locator(".item-row .score-cell.score-fail").first
        passed = tab.locator(".item-row .score-cell.score-pass").first
        assert fail.evaluate("c => getComputedStyle(c).backgroundColor") != passed.evaluate(
            "c => getComputedStyle(c).backgroundColor"
        )
        shot(tab, "12-dark")
        tab.locator("#theme-toggle").click()
        expect(tab.locator("html")).to_have_attribute("data-theme", "light")
        assert luminance(background()) > 200
        tab.reload()
        expect(tab.locator("html")).to_have_attribute("data-theme", "light")
        assert luminance(background()) > 200
    finally:
        context.close()


SCREENS = {
    "desktop": {"viewport": {"width": 1440, "height": 900}},
    "mobile": {
        "viewport": {"width": 390, "height": 844},
        "device_scale_factor": 2,
        "is_mobile": True,
    },
    "dark": {"viewport": {"width": 1440, "height": 900}, "color_scheme": "dark"},
}


@pytest.mark.parametrize("screen", SCREENS)
def test_screenshots_of_the_runs_list_a_run_and_a_compare(site, browser, screen):
    first, second = site.runs
    pages = {
        "runs": "/",
        "run": f"/runs/{second}/",
        # q05: v1 answered it, v2 said "wrong": a regression with a diff.
        "compare": f"/compare/?a={first}&b={second}&key=q05",
    }
    context = browser.new_context(**SCREENS[screen])
    tab = context.new_page()
    try:
        for name, path in pages.items():
            tab.goto(site.url + path)
            tab.wait_for_load_state("networkidle")
            width = tab.evaluate("document.documentElement.scrollWidth")
            assert width <= SCREENS[screen]["viewport"]["width"], (path, width)
            target = ARTIFACTS / f"dashboard-23-{screen}-{name}.png"
            tab.screenshot(path=str(target), full_page=True)
            assert target.stat().st_size > 10_000
    finally:
        context.close()


def test_no_page_is_wider_than_a_phone(site, browser):
    first, second = site.runs
    context = browser.new_context(
        viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True
    )
    tab = context.new_page()
    item = re.search(
        r'href="(/runs/\w+/items/\d+/[^"]*)"', httpx.get(f"{site.url}/runs/{second}/").text
    ).group(1)
    pages = {
        "runs": "/",
        "run": f"/runs/{second}/",
        "items": f"/runs/{second}/?view=all",
        "item": item,
        "compare": f"/compare/?a={first}&b={second}&key=q05",
        "trends": "/trends/?experiment=qa",
        "404": "/runs/nope/",
    }
    try:
        for name, path in pages.items():
            tab.goto(site.url + path)
            width = tab.evaluate("document.documentElement.scrollWidth")
            shot(tab, f"13-mobile-{name}")
            assert width <= 390, f"{name} is {width}px wide at 390"
    finally:
        context.close()


def test_an_unknown_page_is_a_styled_404_with_navigation(site, browser):
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1360, "height": 900})
    tab = context.new_page()  # not the `page` fixture: a 404 is logged in the console
    try:
        response = tab.goto(site.url + "/runs/zzzzzzzz/")
        assert response.status == 404
        expect(tab.locator("#not-found h1")).to_have_text("Not found")
        expect(tab.locator("#not-found")).to_contain_text("no run with id 'zzzzzzzz'")
        shot(tab, "14-not-found")
        tab.get_by_role("link", name="runs page").click()
        tab.wait_for_url(site.url + "/")
    finally:
        context.close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_finds_no_wcag_aa_violation_on_any_page(site, browser, scheme):
    first, second = site.runs
    item = re.search(
        r'href="(/runs/\w+/items/\d+/[^"]*)"', httpx.get(f"{site.url}/runs/{second}/").text
    ).group(1)
    paths = (
        "/",
        f"/runs/{second}/",
        f"/runs/{second}/?view=all",
        item,
        f"/compare/?a={first}&b={second}&key=q05",
        "/trends/?experiment=qa",
        "/runs/nope/",
    )
    viewport = {"width": 1360, "height": 900}
    assert axe_violations(browser, site.url, paths, scheme=scheme, viewport=viewport) == {}
    # On a phone the wide tables scroll inside their box: each such box must take focus.
    phone = (
        *paths,
        f"/runs/{second}/?view=all&q=answer&key=result.version&value=2",
        f"/runs/{second}/?group=result.version",
        f"/runs/{second}/review/",
        "/login/",
    )
    viewport = {"width": 390, "height": 844}
    assert axe_violations(browser, site.url, phone, scheme=scheme, viewport=viewport) == {}


def test_run_ui_opens_the_run_page_starting_or_reusing_a_dashboard(
    site, tmp_path, tmp_path_factory
):
    opened = tmp_path / "opened.txt"
    browser_command = tmp_path / "record-browser"
    browser_command.write_text(f'#!/bin/sh\necho "$1" >> {opened}\n')
    browser_command.chmod(0o755)
    env = {"BROWSER": str(browser_command)}

    # A project with no dashboard (the site's project has one, which `--ui` would find and
    # reuse on whatever port it listens): `--ui` starts one and opens the run there.
    alone = Site(
        project=new_project(tmp_path_factory, "ui", {"experiments/qa.cobalt.py": QA_EXPERIMENT}),
        url="",
        runs=[],
        env=site.env,
    )
    alone.project.write("cobalt.toml", 'test_dir = "experiments"\n[dashboard]\nport = 0\n')
    ui = alone.cobalt("run", "experiments/qa.cobalt.py", "--ui", env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not (opened.exists() and opened.read_text().strip()) and time.monotonic() < deadline:
            assert ui.poll() is None, ui.stderr.read()
            time.sleep(0.05)
        url = opened.read_text().strip()
        run_id = re.search(r"/runs/(\w+)/$", url).group(1)
        # The dashboard was just started beside a run on a loaded machine: its first page can
        # take more than httpx's 5 s default.
        reply = httpx.get(url, timeout=60)
        assert reply.status_code == 200 and f'<code class="id">{run_id}</code>' in reply.text
        ui.terminate()  # passed on to the dashboard it started
        assert ui.wait(timeout=30) == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(url)
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)

    # A dashboard of this project already listens on the configured port: it is reused.
    port = site.url.rsplit(":", 1)[1]
    site.project.write("cobalt.toml", f'test_dir = "experiments"\n[dashboard]\nport = {port}\n')
    opened.unlink()
    try:
        again = site.cobalt("run", "experiments/qa.cobalt.py", "--ui", env=env)
        out, errors = again.communicate(timeout=120)
    finally:
        site.project.write("cobalt.toml", 'test_dir = "experiments"\n')
    assert again.returncode == 0, errors
    assert f"Dashboard: {site.url}/runs/" in out
    assert opened.read_text().strip().startswith(f"{site.url}/runs/")


def test_serve_explains_a_port_that_is_taken(site):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = site.cobalt("serve", "--port", str(port))
        out, errors = refused.communicate(timeout=60)
    assert refused.returncode == 2
    assert f"port {port} on 127.0.0.1 is already in use; pick another with --port" in errors


CHAT_EXPERIMENT = """
from cobalt import Dataset, Evaluator, experiment

def polite(ctx):
    return 0.0 if "rude" in ctx.output else 1.0

@experiment(
    "support-chat",
    Dataset(items=[{"id": "refund", "turns": ["hi", "<b>refund</b> please", "bye"]}]),
    conversation=True,
    evaluators=[Evaluator(name="polite", type="function", fn=polite, per_turn=True)],
)
def run(ctx):
    if ctx.turn == 2:
        return "a rude <script>alert(2)</script> reply"
    return f"hello, turn {ctx.turn}"
"""


def test_a_conversation_shows_as_a_chat_with_scores_per_turn(site, page):
    # Last in this file: it adds a run to the site's project.
    from playwright.sync_api import expect

    site.project.write("experiments/chats/chat.cobalt.py", CHAT_EXPERIMENT)
    run_id = cobalt_run(site.project, "experiments/chats/chat.cobalt.py", env=site.env)
    page.goto(f"{site.url}/runs/{run_id}/?view=all")
    page.get_by_role("link", name="#1", exact=True).click()
    chat = page.locator("#item-conversation")
    expect(chat.locator("li")).to_have_count(6)
    expect(chat.locator("li.chat-user").nth(1).locator(".chat-text")).to_have_text(
        "<b>refund</b> please"
    )  # shown as text, never as markup
    replies = chat.locator("li.chat-assistant")
    expect(replies.nth(1).locator(".chat-text")).to_have_text(
        "a rude <script>alert(2)</script> reply"
    )
    expect(replies.nth(0).locator(".chat-score")).to_have_text("polite 1.00")
    expect(replies.nth(1).locator(".chat-score")).to_have_text("polite 0.00")
    expect(page.locator("table.verdicts")).to_contain_text("worst: turn 2 (0.00)")
    shot(page, "10-conversation")
