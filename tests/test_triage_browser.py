"""Triage in headless Chromium against a real `cobalt serve` (the fixtures of test_browser):
keyboard only, the first judged failure is three keys from page load; the item panel walks the
list it was opened from; `?` shows the shortcuts; search and grouping by a field."""

from __future__ import annotations

import re

from tests.test_browser import browser, page, shot, site  # noqa: F401  (fixtures)


def test_keyboard_only_the_first_judged_failure_is_three_keys_from_page_load(site, page):  # noqa: F811
    from playwright.sync_api import expect

    _, second = site.runs
    page.goto(f"{site.url}/runs/{second}/")
    first = page.locator(".item-row:not(.error-group) a.open-item").first
    number = first.inner_text()  # the first judged failure, below the crashed item
    page.keyboard.press("Tab")
    expect(page.locator("a.skip-link")).to_be_focused()
    expect(page.locator("a.skip-link")).to_have_text("Skip to the first judged failure")
    expect(page.locator("a.skip-link")).to_be_in_viewport()  # seen when focused
    page.keyboard.press("Enter")
    expect(first).to_be_focused()
    page.keyboard.press("Enter")  # three keys
    expect(page.locator("#item-title")).to_have_text(f"Item {number}")
    # Second in the failures list: the crashed item's group comes first.
    expect(page.locator("#item-place")).to_have_text("2 of 14 failures")
    shot(page, "triage-01-first-failure-by-keyboard")


def test_the_skip_link_works_without_javascript(site, browser):  # noqa: F811
    from playwright.sync_api import expect

    _, second = site.runs
    context = browser.new_context(java_script_enabled=False)
    tab = context.new_page()
    try:
        tab.goto(f"{site.url}/runs/{second}/")
        tab.keyboard.press("Tab")
        tab.keyboard.press("Enter")
        expect(tab.locator("#first-failure")).to_be_focused()
        tab.keyboard.press("Enter")
        tab.wait_for_url(re.compile(r"/items/\d+/\?view=failures$"))
        expect(tab.locator("#item-place")).to_have_text("2 of 14 failures")
        tab.get_by_role("link", name="Next ›").click()  # the list, without script
        expect(tab.locator("#item-place")).to_have_text("3 of 14 failures")
        tab.get_by_role("link", name="Shortcuts ?").click()
        expect(tab.locator("#keyboard-help")).to_be_in_viewport()
    finally:
        context.close()


def test_j_and_k_walk_the_failures_the_panel_was_opened_from(site, page):  # noqa: F811
    from playwright.sync_api import expect

    _, second = site.runs
    page.goto(f"{site.url}/runs/{second}/")
    numbers = page.locator(".item-row a.open-item").all_inner_texts()
    page.locator(".item-row a.open-item").nth(1).click()
    panel = page.locator("#item-panel")
    expect(panel).to_have_attribute("data-modal", "true")
    expect(page.locator("#item-place")).to_have_text("2 of 14 failures")
    page.keyboard.press("j")  # the next failure, not the next item by number
    expect(page.locator("#item-title")).to_have_text(f"Item {numbers[2]}")
    expect(page.locator("#item-place")).to_have_text("3 of 14 failures")
    assert page.url.endswith("?view=failures")
    expect(panel).to_have_attribute("data-modal", "true")
    page.keyboard.press("k")
    expect(page.locator("#item-title")).to_have_text(f"Item {numbers[1]}")
    page.reload()  # the list is in the address: a reload keeps it
    expect(page.locator("#item-place")).to_have_text("2 of 14 failures")


def test_help_sheet_search_and_groups(site, page):  # noqa: F811
    from playwright.sync_api import expect

    _, second = site.runs
    page.goto(f"{site.url}/runs/{second}/?view=all")
    page.keyboard.press("?")
    sheet = page.locator("dialog.help-sheet")
    expect(sheet).to_be_visible()
    expect(sheet).to_contain_text("next failure in that list")
    shot(page, "triage-02-help")
    page.keyboard.press("Escape")
    expect(sheet).to_be_hidden()
    expect(page.locator("#keyboard-help")).to_have_count(1)  # back in the page

    page.keyboard.press("/")
    search = page.locator("#item-filters input[name=q]")
    expect(search).to_be_focused()
    search.fill("answer 1")
    search.press("Enter")
    page.wait_for_url(re.compile(r"q=answer(\+|%20)1"))
    # "answer 1", "answer 10"…"answer 19" expected; q01's output is "answer 1" too.
    expect(page.locator(".item-row")).to_have_count(11)
    page.locator(".item-row a.open-item").nth(1).click()
    expect(page.locator("#item-place")).to_contain_text("2 of 11 items matching “answer 1”")
    page.keyboard.press("n")  # the next failure among them: q15 answered "wrong"
    expect(page.locator("#item-title")).to_have_text("Item #16")

    page.goto(f"{site.url}/runs/{second}/?group=result.version")
    groups = page.locator("table.groups")
    expect(groups).to_contain_text("result.version")
    # Version 2's 59 answers, and the crashed item that reported nothing (its error counted).
    rows = groups.locator("tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.first.locator("td").first).to_have_text("59")
    expect(rows.nth(1)).to_contain_text("(none)")
    expect(rows.nth(1).locator("td").nth(1)).to_have_text("1")
    shot(page, "triage-03-groups")
