"""Review mode in headless Chromium against a real `cobalt serve` on PostgreSQL, after a real
`cobalt run`: a reviewer labels from the keyboard, two reviewers label the same run at once
and neither loses a label, the same reviewer's stale tab is refused, and it all works with
JavaScript off. Screenshots go to `test-artifacts/review-*.png`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from tests import cli_zygote
from tests.conftest import Project, cli_env
from tests.test_browser import ARTIFACTS, CHROMIUM, browser, watched_tab

__all__ = ["browser"]  # the fixture, used by name below

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PASSWORD = "a long enough password"
ITEMS = 16
XSS = "<script>alert(1)</script>"

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")

# Six of the judge's scores fail (below 0.5) and two are borderline (0.5 to 0.6): they lead
# the queue.
EXPERIMENT = """
from cobalt import Dataset, Evaluator, experiment

SCORES = [0.9, 0.1, 0.55, 0.3, 1.0, 0.8, 0.0, 0.95, 0.7, 1.0, 0.52, 0.85, 0.2, 0.4, 0.9, 0.45]
dataset = Dataset(
    items=[{"id": f"r{i:02d}", "input": f"question {i}", "expected": f"answer {i}"}
           for i in range(__ITEMS__)]
)


def judge(ctx):
    i = int(ctx.item["id"][1:])
    return {"score": SCORES[i], "reason": f"judged {ctx.item['id']} <b>closely</b>"}


@experiment("review", dataset, evaluators=[Evaluator(name="judge", type="function", fn=judge)])
def run(ctx):
    if ctx.item["id"] == "r06":
        return "<script>alert(1)</script>"
    return ctx.item["expected"]
"""


@dataclass
class ReviewSite:
    url: str
    run: str
    database_url: str

    def review_url(self) -> str:
        return f"{self.url}/runs/{self.run}/review/"

    def labels(self, reviewer: str) -> dict[str, tuple]:
        """The reviewer's labels as stored: item key → (verdict, note, version)."""
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT item_key, verdict, note, version FROM cobalt_app_label WHERE reviewer = %s",
                [reviewer],
            ).fetchall()
        return {key: tuple(rest) for key, *rest in rows}


def cobalt(project: Project, env: dict[str, str], *args: str, stdin: str = "") -> str:
    done = cli_zygote.run(list(args), project.path, cli_env(env), input=stdin)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[ReviewSite]:
    """A project whose history is a PostgreSQL database of its own (embedded: no broker),
    one finished run, five users, and `cobalt serve` on it."""
    database = f"cobalt_test_review_{os.getpid()}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{database}"')
    database_url = f"postgresql://postgres@127.0.0.1:5432/{database}"
    env = {"COBALT_DATABASE_URL": database_url}
    project = Project(tmp_path_factory.mktemp("review") / "proj")
    project.path.mkdir()
    project.write("cobalt.toml", 'test_dir = "experiments"\n')
    project.write("experiments/review.cobalt.py", EXPERIMENT.replace("__ITEMS__", str(ITEMS)))
    server = None
    try:
        cobalt(project, env, "migrate")
        output = cobalt(project, env, "run", "experiments/review.cobalt.py")
        run_id = re.search(r"Run ID: (\w+)", output).group(1)
        for name in ("ana", "ben", "carla", "dan", "erin"):
            cobalt(project, env, "createuser", name, "--password-stdin", stdin=PASSWORD + "\n")
        server = subprocess.Popen(
            [sys.executable, "-m", "cobalt_cli", "serve", "--port", "0", "--workers", "2"],
            cwd=project.path,
            env=cli_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for line in server.stdout:  # the first line says where it listens
            found = re.search(r"Cobalt dashboard: (http://\S+?)/ ", line)
            if found:
                break
        else:
            raise AssertionError(f"cobalt serve exited with {server.wait(timeout=10)}")
        yield ReviewSite(found.group(1), run_id, database_url)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


@dataclass
class Reviewer:
    tab: object
    problems: list[str]

    def shown(self) -> str:
        """The key of the item on screen."""
        return self.tab.locator("#review-item bdi").inner_text()

    def progress(self):
        return self.tab.locator("#review-progress")

    def idle(self) -> None:
        """Wait until the panel has no request in flight or settling (its keys ignore a
        press until then: one press is one label)."""
        from playwright.sync_api import expect

        busy = self.tab.locator("#review-panel.htmx-request, #review-panel .htmx-request")
        expect(busy).to_have_count(0)


def log_in(browser, site: ReviewSite, user: str, *, context=None, **options) -> Reviewer:
    """A tab that opened review mode, was sent to log in as `user`, and came back; it records
    console errors, uncaught exceptions and dialogs (an escaped output opens none)."""
    from playwright.sync_api import expect

    if context is None:
        context = browser.new_context(viewport={"width": 1360, "height": 900}, **options)
    problems: list[str] = []
    tab = watched_tab(context, problems)
    tab.goto(site.review_url())
    if "/login/" in tab.url:
        tab.get_by_label("Username").fill(user)
        tab.get_by_label("Password").fill(PASSWORD)
        tab.get_by_role("button", name="Log in").click()
    tab.wait_for_url(re.compile(r"/review/"))
    expect(tab.locator("#review-progress")).to_contain_text(f"of {ITEMS} reviewed")
    return Reviewer(tab, problems)


def test_a_reviewer_labels_ten_items_from_the_keyboard(site, browser):
    from playwright.sync_api import expect

    ana = log_in(browser, site, "ana")
    tab = ana.tab
    expect(ana.progress()).to_have_text(f"0 of {ITEMS} reviewed")
    expect(tab.locator("#review-keys")).to_contain_text("p pass · f fail · s skip · n note")
    assert ana.shown() == "r06"  # the worst failure first (0.00)
    expect(tab.locator("#review-output")).to_have_text(XSS)  # text, not a script
    expect(tab.locator(".judge-score")).to_have_text("0.00 fail")
    tab.screenshot(path=str(ARTIFACTS / "review-page.png"), full_page=True)
    # The keys come from a static file of this page only, with a hashed name like the others.
    script = tab.locator("script[src*='/static/cobalt/review.']").get_attribute("src")
    assert re.fullmatch(r"/static/cobalt/review\.[0-9a-f]{12}\.js", script)

    note = tab.locator("#review-note")
    expected: dict[str, tuple[str, str]] = {}
    typed = "wrong: it skips a step; the judge kept it"  # p, f, s, j, k, n: typed, not keys
    # p/f label and move on; s skips; n + typing writes a note, Escape leaves it; j/k step.
    plan = ["f", "p", "s", "f", ("note", typed, "p"), "p", "j", "k", "f"]
    plan += ["s", "f", ("note", "borderline, but right", "p"), "p", "f"]
    done = 0
    for step in plan:
        ana.idle()
        key = ana.shown()
        if isinstance(step, tuple):
            _, text, verdict = step
            tab.keyboard.press("n")
            expect(note).to_be_focused()
            tab.keyboard.type(text)
            tab.keyboard.press("Escape")
            expect(note).not_to_be_focused()
            expect(note).to_have_value(text)
            expect(ana.progress()).to_have_text(f"{done} of {ITEMS} reviewed")  # nothing sent
            step = verdict
        else:
            text = ""
        if step in ("p", "f"):
            tab.keyboard.press(step)
            done += 1
            expect(ana.progress()).to_have_text(f"{done} of {ITEMS} reviewed")
            expect(tab.locator("#review-item bdi")).not_to_have_text(key)
            expected[key] = ("pass" if step == "p" else "fail", text)
        elif step == "s":
            tab.keyboard.press("s")
            expect(tab.locator("#review-item bdi")).not_to_have_text(key)
            assert key not in expected
        elif step == "j":
            tab.keyboard.press("j")
            expect(tab.locator("#review-item bdi")).not_to_have_text(key)
            stepped_to = ana.shown()
        elif step == "k":
            tab.keyboard.press("k")
            expect(tab.locator("#review-item bdi")).not_to_have_text(stepped_to)
    assert done == 10
    expect(tab.locator(".notice.saved")).to_contain_text("Saved your fail on item")
    tab.screenshot(path=str(ARTIFACTS / "review-labelled.png"), full_page=True)
    # Each save pushed the next item's URL: a reload shows the same item and progress.
    assert re.search(r"item=\d+", tab.url)
    shown = ana.shown()
    tab.reload()
    expect(tab.locator("#review-item bdi")).to_have_text(shown)
    expect(ana.progress()).to_have_text(f"10 of {ITEMS} reviewed")
    stored = site.labels("ana")
    assert {key: (verdict, note) for key, (verdict, note, _) in stored.items()} == expected
    # The queue: the six failures (lowest first) and two borderline items lead it.
    assert list(expected)[:2] == ["r06", "r01"]
    expect(tab.locator("#label-summary")).to_contain_text("10 labels on 10 items by ana")
    tab.context.close()
    assert ana.problems == []


def test_two_reviewers_labelling_the_same_run_at_once_both_keep_every_label(site, browser):
    from playwright.sync_api import expect

    ben = log_in(browser, site, "ben")
    carla = log_in(browser, site, "carla")
    keys, first_item = [], ben.tab.locator("#label-form input[name=item]").get_attribute("value")
    for done in range(1, 7):
        ben.idle()
        carla.idle()
        assert ben.shown() == carla.shown()  # one queue for every reviewer
        keys.append(ben.shown())
        # Both saves are on their way before either answers: the same item, at once.
        ben.tab.keyboard.press("p")
        carla.tab.keyboard.press("f")
        expect(ben.progress()).to_have_text(f"{done} of {ITEMS} reviewed")
        expect(carla.progress()).to_have_text(f"{done} of {ITEMS} reviewed")
    for reviewer in (ben, carla):
        expect(reviewer.tab.locator("#review-error")).to_have_count(0)
    assert site.labels("ben") == {key: ("pass", "", 1) for key in keys}
    assert site.labels("carla") == {key: ("fail", "", 1) for key in keys}
    # Each reviewer's label is shown separately on the other's page.
    ben.tab.goto(f"{site.review_url()}?evaluator=judge&item={first_item}")
    expect(ben.tab.locator("#other-labels")).to_contain_text("carla: fail")
    expect(ben.tab.locator("#my-label")).to_contain_text("Your label: pass")
    for reviewer in (ben, carla):
        reviewer.tab.context.close()
        assert reviewer.problems == []


def test_the_same_reviewer_in_two_tabs_gets_a_conflict_on_the_stale_save(site, browser):
    from playwright.sync_api import expect

    first = log_in(browser, site, "dan")
    second = log_in(browser, site, "dan", context=first.tab.context)
    assert first.shown() == second.shown()
    key = first.shown()
    first.tab.keyboard.press("n")
    first.tab.keyboard.type("from the first tab ")
    first.tab.keyboard.press("p")  # typed into the note: nothing sent
    expect(first.tab.locator("#review-note")).to_have_value("from the first tab p")
    first.tab.keyboard.press("Escape")
    first.tab.keyboard.press("p")
    expect(first.progress()).to_have_text(f"1 of {ITEMS} reviewed")

    second.tab.keyboard.press("n")
    second.tab.keyboard.type("from the second tab")
    second.tab.keyboard.press("Escape")
    second.tab.keyboard.press("f")  # it still shows no label: a stale save
    error = second.tab.locator("#review-error")
    expect(error).to_contain_text(f"dan's label of 'judge' on item '{key}' changed since you")
    expect(second.tab.locator("#review-note")).to_have_value("from the second tab")  # kept
    expect(second.tab.locator("#my-label")).to_contain_text("Your label: pass")
    assert site.labels("dan") == {key: ("pass", "from the first tab p", 1)}
    second.tab.keyboard.press("f")  # knowingly, over the label it now shows
    expect(second.progress()).to_have_text(f"1 of {ITEMS} reviewed")
    expect(second.tab.locator("#review-item bdi")).not_to_have_text(key)
    assert site.labels("dan") == {key: ("fail", "from the second tab", 2)}
    first.tab.context.close()
    conflicts = [p for p in first.problems + second.problems if "409 (Conflict)" in p]
    assert len(conflicts) == 1  # the browser logs the refused save's status, nothing else
    assert [p for p in first.problems + second.problems if p not in conflicts] == []


def test_review_works_with_javascript_off(site, browser):
    from playwright.sync_api import expect

    erin = log_in(browser, site, "erin", java_script_enabled=False)
    tab = erin.tab
    key = erin.shown()
    tab.get_by_label("Note").fill("no script needed")
    tab.get_by_role("button", name="Fail").click()
    expect(erin.progress()).to_have_text(f"1 of {ITEMS} reviewed")
    expect(tab.locator(".notice.saved")).to_contain_text(f"Saved your fail on item '{key}'")
    skipped = erin.shown()
    tab.locator('a[data-key="s"]').click()  # review's Skip, not the page's skip link
    expect(tab.locator("#review-item bdi")).not_to_have_text(skipped)
    tab.get_by_role("button", name="Pass").click()
    expect(erin.progress()).to_have_text(f"2 of {ITEMS} reviewed")
    assert site.labels("erin")[key] == ("fail", "no script needed", 1)
    assert skipped not in site.labels("erin")
    tab.context.close()
    assert erin.problems == []
