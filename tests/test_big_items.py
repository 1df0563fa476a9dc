"""Big outputs and long traces (issue 33): an item whose runner returns a 5 MB one-line string
and emits 5,000 steps, stored by real `cobalt run`s, served by a real `cobalt serve`.

Its page shows the first 20,000 characters of the output with a download of the whole, and
the trace a hundred steps a page, runs of like steps grouped and collapsed; it stays under
1 MB. Compare, review and the run's items list cap what they show too.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from cobalt_app.page_values import SHOWN_CHARS
from tests import cli_zygote
from tests.conftest import cli_env, cobalt_run, logged_in, new_project, served
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS

BIG_OUTPUT = "".join(f"{i:07d}," for i in range(625_000))  # 5,000,000 characters, one line
MEGABYTE = 1_000_000
PASSWORD = "correct horse battery"

EXPERIMENT = """
import cobalt
from cobalt import Dataset, Evaluator, experiment

BIG = "".join(f"{i:07d}," for i in range(625_000))


def long_agent():
    # 1,200 model calls, 2,400 searches, then 1,400 steps alternating a call and a fetch.
    for i in range(5_000):
        llm = i < 1_200 or (i >= 3_600 and i % 2 == 0)
        name = "chat" if llm else ("search" if i < 3_600 else "fetch")
        with cobalt.span(name, kind="llm" if llm else "tool", input=f"<b>in {i}</b>") as step:
            step.output = f"out {i}"
    return BIG


@experiment(
    "big",
    Dataset(items=[{"id": "big", "expected": "short"}, {"id": "small", "expected": "short"}]),
    evaluators=[Evaluator(name="exact", type="exact-match", field="expected")],
    timeout=300,
)
def run(ctx):
    return long_agent() if ctx.item["id"] == "big" else "short"
"""


@dataclass
class Site:
    url: str
    runs: list[str]
    client: httpx.Client

    def item_url(self, run: str, index: int = 0) -> str:
        """The page of the run's item `index` (0 is the big one)."""
        page = self.client.get(f"/runs/{run}/?view=all").text
        links = re.findall(r'href="(/runs/[^"?]+/items/\d+/)[^"]*"', page)
        return list(dict.fromkeys(links))[index]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[Site]:
    project = new_project(tmp_path_factory, "big", {"experiments/big.cobalt.py": EXPERIMENT})
    # 5,000 steps and 5 MB each: minutes on a loaded machine
    runs = [cobalt_run(project, "experiments/big.cobalt.py", env={}, timeout=900) for _ in range(2)]
    created = cli_zygote.run(
        ["createuser", "ana", "--password-stdin"], project.path, cli_env(), input=f"{PASSWORD}\n"
    )
    assert created.returncode == 0, created.stdout + created.stderr
    with served(project) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield Site(url=url, runs=runs, client=client)


def test_the_item_page_shows_the_first_20_kb_of_a_5_mb_output_and_downloads_the_whole(site):
    item = site.item_url(site.runs[0])
    for headers in ({}, {"HX-Request": "true"}):  # its own page, and the panel over the run
        page = site.client.get(item, headers=headers)
        assert page.status_code == 200
        assert len(page.content) < MEGABYTE
        assert BIG_OUTPUT[:SHOWN_CHARS] in page.text
        assert BIG_OUTPUT[: SHOWN_CHARS + 8] not in page.text
        assert "The first 20,000 of 5,000,000 characters" in page.text
        assert 'id="item-json"' not in page.text  # no 5 MB copy in the page
    link = re.search(
        r'href="([^"]+/download/output)" download>Download the whole output', page.text
    )
    download = site.client.get(link.group(1))
    assert download.status_code == 200
    assert download.text == BIG_OUTPUT
    assert download.headers["content-type"] == "text/plain; charset=utf-8"
    assert download.headers["content-disposition"].startswith("attachment; filename=")
    assert download.headers["x-content-type-options"] == "nosniff"
    whole = site.client.get(re.search(r'href="([^"]+/download/item)"', page.text).group(1))
    assert whole.headers["content-type"] == "application/json"
    assert json.loads(whole.text)["output"] == BIG_OUTPUT


def test_a_trace_of_5000_steps_is_grouped_collapsed_and_paged(site):
    item = site.item_url(site.runs[0])
    page = site.client.get(item).text
    assert "5,000 steps: 1,900 model calls, 3,100 tool calls" in page
    assert "steps 1–100 below" in page
    assert "llm × 1,200" in page and "steps 1–100 on this page" in page
    assert re.search(r'<li class="step-group step-llm">\s*<details>', page)  # closed
    assert 'id="step-100"' in page and 'id="step-101"' not in page
    assert "&lt;b&gt;in 0&lt;/b&gt;" in page and "<b>in 0" not in page  # escaped
    next_link = re.search(r'<a rel="next" href="([^"]+)" hx-get="([^"]+)"', page)
    assert next_link.group(1) == f"{item}?page=2#item-trace"

    plain = site.client.get(next_link.group(1)).text  # without script: the whole page
    assert "<html" in plain and 'id="item-output"' in plain
    assert 'id="step-101"' in plain and 'id="step-100"' not in plain
    assert "steps 101–200 on this page" in plain

    htmx = {"HX-Request": "true", "HX-Target": "item-trace"}
    partial = site.client.get(next_link.group(2), headers=htmx).text
    assert partial.lstrip().startswith('<section id="item-trace"')
    assert 'id="step-101"' in partial and 'id="item-output"' not in partial

    searches = site.client.get(f"{item}?page=13").text  # steps 1,201–1,300
    assert "tool search × 2,400" in searches and "steps 1,201–1,300 on this page" in searches
    alternating = site.client.get(f"{item}?page=50").text  # steps 4,901–5,000
    assert "step-group" not in alternating and 'id="step-5000"' in alternating
    assert "Page 50 of 50" in alternating and "Next steps" not in alternating
    assert "Page 50 of 50" in site.client.get(f"{item}?page=99").text  # clamped


def test_a_download_follows_the_item_pages_access_rules(site):
    item = site.item_url(site.runs[0])
    remote = {"X-Forwarded-For": "203.0.113.9"}  # seen through a proxy: a login is needed
    for url in (item, f"{item}download/output", f"{item}download/step-1-input"):
        refused = site.client.get(url, headers=remote)
        assert refused.status_code == 302 and "/login/" in refused.headers["location"]
    step = site.client.get(f"{item}download/step-1-input")
    assert step.text == "<b>in 0</b>" and step.headers["content-type"].startswith("text/plain")
    for missing in ("step-5001-input", "secrets", "../output"):
        assert site.client.get(f"{item}download/{missing}").status_code == 404
    no_such_item = f"/runs/{site.runs[1]}/items/99999/"  # no item has that number there
    assert site.client.get(f"{no_such_item}download/output").status_code == 404


def test_compare_review_and_items_list_cap_what_they_show(site):
    a, b = site.runs
    compare = site.client.get(f"/compare/?a={a}&b={b}&key=big")
    assert compare.status_code == 200 and len(compare.content) < MEGABYTE
    assert BIG_OUTPUT[:SHOWN_CHARS] in compare.text
    assert compare.text.count("Download the whole output") == 2
    assert "The traces are long: the whole of each on its item's page" in compare.text
    item_id = site.item_url(a).rstrip("/").rsplit("/", 1)[1]
    with contextlib.closing(logged_in(site.url, "ana", PASSWORD)) as reviewer:
        review = reviewer.get(f"/runs/{a}/review/?evaluator=exact&item={item_id}")
    assert review.status_code == 200 and len(review.content) < MEGABYTE
    assert "Download the whole output" in review.text
    for url in (f"/runs/{a}/", f"/runs/{a}/?view=all"):
        listed = site.client.get(url)
        assert len(listed.content) < MEGABYTE and BIG_OUTPUT[:100] in listed.text


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
def test_chromium_opens_the_big_item_and_expands_a_group(site):
    from playwright.sync_api import sync_playwright

    item = site.item_url(site.runs[0])
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page()
            tab.on("pageerror", lambda e: problems.append(str(e)))
            tab.set_default_timeout(15_000)
            tab.goto(site.url + item, wait_until="load")
            assert tab.locator("#item-output").inner_text().startswith("0000000,0000001,")
            first_step = tab.locator("#step-1")
            assert not first_step.is_visible()
            tab.get_by_text("llm × 1,200").click()
            first_step.wait_for(state="visible")
            tab.locator("#item-trace a[rel=next]").click()  # through htmx: the trace only
            tab.locator("#step-101").wait_for(state="attached")
            assert tab.url == site.url + item  # swapped in place, not a new page
            assert tab.locator("#item-output").count() == 1
        finally:
            browser.close()
    assert problems == []
