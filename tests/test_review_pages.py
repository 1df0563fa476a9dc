"""Review mode in-process (cobalt_app/views_review.py): who may label, plain form posts with
JavaScript off, the queue's order and progress, conflicts, htmx swaps, escaping, datasets."""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from cobalt.config import active_config, load_config, set_active_config
from cobalt_app import labels
from cobalt_app.models import ItemResult, Label, Run
from tests.test_pages import XSS, keys, make_run

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "review-panel"}
# k001 fails worst, k003 fails less badly, k002 is borderline (0.55 against 0.5); the others pass.
SCORES = {
    "k000": {"judge": 0.9},
    "k001": {"judge": 0.1},
    "k002": {"judge": 0.55},
    "k003": {"judge": 0.3},
}


def reviewer(name: str) -> Client:
    user = get_user_model().objects.create_user(name, password="a long enough password")
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    return client


@pytest.fixture
def client() -> Client:
    return Client(HTTP_HOST="127.0.0.1")


@pytest.fixture
def ana() -> Client:
    return reviewer("ana")


@pytest.fixture
def ben() -> Client:
    return reviewer("ben")


def item_id(run: Run, key: str) -> int:
    return ItemResult.objects.get(run=run, item_key=key, run_index=0).id


def review(run: Run, evaluator: str = "judge", item: int | None = None) -> str:
    url = f"/runs/{run.id}/review/?evaluator={evaluator}"
    return url + (f"&item={item}" if item else "")


def shown_item(page: str) -> str:
    """The key of the item the review page shows."""
    return re.search(r'<h2 id="review-item">.*?<bdi>([^<]+)</bdi>', page, re.S).group(1)


def form_value(page: str, name: str) -> str:
    found = re.search(rf'<input type="hidden" name="{name}" value="([^"]*)"', page)
    return found.group(1)


def note_field(page: str) -> str:
    return re.search(r'<textarea name="note"[^>]*>(.*?)</textarea>', page, re.S).group(1)


def label(client: Client, run: Run, key: str, verdict: str = "fail", **fields):
    """Post the label form as a browser does (the version the page showed: 0, none)."""
    headers = fields.pop("headers", {})
    data = {"evaluator": "judge", "item": item_id(run, key), "verdict": verdict, "version": 0}
    return client.post(f"/runs/{run.id}/review/label/", {**data, **fields}, **headers)


def test_an_anonymous_visitor_is_sent_to_log_in_and_cannot_label(client):
    run = make_run(keys=keys(2), scores=SCORES)
    page = client.get(review(run))
    assert page.status_code == 302
    assert page["Location"] == "/login/?" + urlencode({"next": review(run)})
    # Reading the run page stays open on loopback; writing never is.
    assert client.get(f"/runs/{run.id}/").status_code == 200
    posted = label(client, run, "k000")
    assert posted.status_code == 302 and posted["Location"].startswith("/login/?next=")
    htmx = client.post(f"/runs/{run.id}/review/label/", {}, **HTMX)
    assert htmx["HX-Redirect"].startswith("/login/?next=")
    assert not Label.objects.exists()


def test_a_reviewer_labels_item_after_item_with_plain_form_posts(ana):
    run = make_run(keys=keys(4), scores=SCORES)
    page = ana.get(review(run)).content.decode()
    # The worst failure first, with the judge's verdict coloured by the one rule.
    assert shown_item(page) == "k001"
    assert "0 of 4 reviewed" in page and "item 1 of 4 in the queue" in page
    assert re.search(r'score-cell score-fail judge-score" data-verdict="fail">0.10 fail', page)
    assert "judge says k001 &lt;b&gt;ok&lt;/b&gt;" in page  # the reason, escaped
    assert "answer k001" in page and "question k001" in page  # output, expected and input
    assert 'id="dataset-form"' not in page  # only once the item is labelled
    assert form_value(page, "version") == "0"

    saved = label(ana, run, "k001", "fail", note="wrong city", score="0.05")
    assert saved.status_code == 303  # See Other: the browser GETs the next item
    assert saved["Location"] == review(run, item=item_id(run, "k003"))
    after = ana.get(saved["Location"]).content.decode()
    assert shown_item(after) == "k003" and "1 of 4 reviewed" in after
    assert "Saved your fail on item &#x27;k001&#x27; (judge)." in after

    # A corrected expected output is JSON when it reads as JSON, else the text.
    label(ana, run, "k003", "pass", expected_output='{"city": "Lyon"}')
    label(ana, run, "k002", "pass", expected_output="Lyon, France")
    stored = {row.label.item_key: row.label for row in labels.run_labels(run)}
    assert (stored["k001"].reviewer, stored["k001"].verdict, stored["k001"].score) == (
        "ana",
        "fail",
        0.05,
    )
    assert stored["k001"].note == "wrong city" and stored["k001"].expected_output is None
    assert stored["k003"].expected_output == {"city": "Lyon"}
    assert stored["k002"].expected_output == "Lyon, France"

    # Back on a labelled item: the label is shown and the form holds it, at its version.
    again = ana.get(review(run, item=item_id(run, "k001"))).content.decode()
    assert "Your label:" in again and "wrong city" in note_field(again)
    assert form_value(again, "version") == "1"
    assert 'id="dataset-form"' in again
    last = label(ana, run, "k000", "pass")
    # All four reviewed: it stays on the last one and says so.
    assert last["Location"] == review(run, item=item_id(run, "k000"))
    done = ana.get(last["Location"]).content.decode()
    assert "4 of 4 reviewed" in done and 'id="review-done"' in done


def test_the_queue_puts_failures_then_borderline_items_first_then_the_rest_shuffled(ana):
    scores = {key: {"judge": 1.0} for key in keys(12)}
    scores |= {"k007": {"judge": 0.3}, "k004": {"judge": 0.0}, "k010": {"judge": 0.52}}
    run = make_run(keys=keys(12), scores=scores)
    order, page = [], ana.get(review(run)).content.decode()
    while True:
        order.append(shown_item(page))
        following = re.search(r'data-key="j" rel="next" href="([^"]+)"', page)
        if not following:
            break
        page = ana.get(following.group(1).replace("&amp;", "&")).content.decode()
    assert order[:3] == ["k004", "k007", "k010"]  # failures, lowest first, then borderline
    assert sorted(order[3:]) == [k for k in keys(12) if k not in ("k004", "k007", "k010")]
    assert order[3:] != sorted(order[3:])  # a seeded shuffle, not the dataset's order
    queue = labels.review_queue(run, "judge", reviewer="ana")
    assert order == [ItemResult.objects.get(id=i).item_key for i in queue.item_ids]


def test_progress_counts_my_labels_and_shows_each_other_reviewer_separately(ana, ben):
    run = make_run(keys=keys(4), scores=SCORES)
    label(ben, run, "k001", "pass", note="ben thinks it is fine")
    page = ana.get(review(run)).content.decode()
    assert "0 of 4 reviewed" in page and shown_item(page) == "k001"  # ben's label is his
    assert re.search(r"<strong>ben</strong>: <span[^>]*>pass</span> · <q[^>]*>ben thinks", page)
    label(ana, run, "k001", "fail", note="ana disagrees with ben")
    label(ana, run, "k003", "fail")
    page = ana.get(review(run, item=item_id(run, "k001"))).content.decode()
    assert "2 of 4 reviewed" in page
    # Both labels are kept, one row each; ben's disagrees with the judge (0.10 fails).
    assert sorted(Label.objects.values_list("reviewer", "verdict")) == [
        ("ana", "fail"),
        ("ana", "fail"),
        ("ben", "pass"),
    ]
    assert "3 labels on 2 items by ana, ben" in page and "1 disagrees with the judge" in page
    table = page.split('class="disagreements-table"')[1]
    assert "ben" in table and "ben thinks it is fine" in table and "ana" not in table


def test_a_stale_save_is_refused_with_a_message_and_nothing_typed_is_lost(ana):
    run = make_run(keys=keys(2), scores=SCORES)
    first_tab = ana.get(review(run)).content.decode()
    assert shown_item(first_tab) == "k001" and form_value(first_tab, "version") == "0"
    # A second tab saves first.
    assert label(ana, run, "k001", "pass", note="from the second tab").status_code == 303
    refused = label(ana, run, "k001", "fail", note="typed in the first tab", version=0)
    assert refused.status_code == 409
    page = refused.content.decode()
    assert "ana&#x27;s label of &#x27;judge&#x27; on item &#x27;k001&#x27; changed since" in page
    assert note_field(page) == "typed in the first tab"  # kept in the form
    assert "from the second tab" in page  # the label that is stored now is shown
    assert form_value(page, "version") == "1"  # saving again replaces it, knowingly
    assert Label.objects.get().note == "from the second tab"
    assert label(ana, run, "k001", "fail", note="typed in the first tab", version=1).status_code
    assert Label.objects.get().note == "typed in the first tab"


def test_two_reviewers_saving_the_same_item_at_once_both_keep_their_label(ana, ben):
    run = make_run(keys=keys(2), scores=SCORES)
    assert label(ana, run, "k001", "fail").status_code == 303
    assert label(ben, run, "k001", "pass").status_code == 303
    assert sorted(Label.objects.values_list("reviewer", "verdict", "version")) == [
        ("ana", "fail", 1),
        ("ben", "pass", 1),
    ]


def test_a_bad_value_shows_the_page_again_with_the_message_and_the_typed_note(ana):
    run = make_run(keys=keys(2), scores=SCORES)
    refused = label(ana, run, "k001", "fail", score="1.7", note="almost right")
    assert refused.status_code == 400
    page = refused.content.decode()
    assert "score: 1.7 is outside 0..1" in page and note_field(page) == "almost right"
    assert 'value="1.7"' in page
    missing = label(ana, run, "k001", "fail", item=999999, note="kept")
    assert missing.status_code == 404 and "has no item with id 999999" in missing.content.decode()
    assert not Label.objects.exists()


def test_an_unknown_evaluator_is_named_with_the_ones_the_run_has(ana):
    run = make_run(keys=keys(2), scores=SCORES)
    page = ana.get(review(run, "relevance"))
    assert page.status_code == 400
    text = page.content.decode()
    assert "has no evaluator &#x27;relevance&#x27; (it has: exact, judge)" in text
    assert '<option value="judge" >judge</option>' in text  # pick another
    posted = label(ana, run, "k001", "fail", evaluator="relevance", note="my note")
    assert posted.status_code == 400
    assert re.search(r'id="review-unsaved">.*my note', posted.content.decode(), re.S)
    # Without an evaluator the review starts with the first one.
    assert '<option value="exact" selected>' in ana.get(f"/runs/{run.id}/review/").content.decode()


def test_a_running_run_says_labelling_opens_when_it_finishes(ana):
    run = make_run(keys=keys(3), scores=SCORES, finish=False, done=1)
    page = ana.get(review(run))
    assert page.status_code == 200
    assert "labelling opens when it finishes" in page.content.decode()
    assert 'id="label-form"' not in page.content.decode()
    refused = label(ana, run, "k000", "fail")
    assert refused.status_code == 409 and "is still running" in refused.content.decode()
    assert not Label.objects.exists()


def test_outputs_notes_and_reasons_are_escaped(ana, ben):
    run = make_run(keys=keys(2), scores=SCORES, outputs={"k001": XSS})
    label(ben, run, "k001", "fail", note=XSS, expected_output=XSS)
    label(ana, run, "k001", "fail", note=XSS)
    response = ana.get(review(run, item=item_id(run, "k001")))
    page = response.content.decode()
    assert XSS not in page
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 4  # output, notes, expected
    policy = response["Content-Security-Policy"]
    assert "script-src 'self';" in policy
    scripts = re.findall(r"<script([^>]*)>", page)
    assert all("src=" in attrs for attrs in scripts)
    assert re.search(r'<script src="/static/cobalt/review\.[0-9a-f]{12}\.js" defer>', page)
    assert "review." not in ana.get(f"/runs/{run.id}/").content.decode().split("</head>")[0]


def test_htmx_gets_the_next_items_panel_and_its_url(ana):
    run = make_run(keys=keys(4), scores=SCORES)
    saved = label(ana, run, "k001", "fail", headers=HTMX)
    assert saved.status_code == 200
    panel = saved.content.decode()
    assert panel.lstrip().startswith('<section id="review-panel"') and "<html" not in panel
    assert saved["HX-Push-Url"] == review(run, item=item_id(run, "k003"))
    assert shown_item(panel) == "k003" and "1 of 4 reviewed" in panel
    # A refused save answers its panel too (review.js swaps 4xx panels in), typed text kept.
    refused = label(ana, run, "k001", "pass", note="second try", headers=HTMX)
    assert refused.status_code == 409 and "HX-Push-Url" not in refused
    assert refused.content.decode().lstrip().startswith('<section id="review-panel"')
    assert note_field(refused.content.decode()) == "second try"
    step = ana.get(review(run, item=item_id(run, "k002")), **HTMX).content.decode()
    assert step.lstrip().startswith('<section id="review-panel"') and shown_item(step) == "k002"
    # A history restore gets the whole page.
    whole = ana.get(review(run), **HTMX, HTTP_HX_HISTORY_RESTORE_REQUEST="true")
    assert "<html" in whole.content.decode()


def test_the_run_page_links_to_review_mode_with_label_and_disagreement_counts(ana, ben):
    run = make_run(keys=keys(4), scores=SCORES)
    page = ana.get(f"/runs/{run.id}/").content.decode()
    assert f'href="/runs/{run.id}/review/" id="run-review">Review</a>' in page
    assert 'id="run-labels"' not in page
    label(ana, run, "k001", "pass")
    label(ben, run, "k001", "fail")
    page = ana.get(f"/runs/{run.id}/").content.decode()
    assert re.search(r'id="run-labels">\(2 labels, <a [^>]+>1 disagreement</a>\)', page)


@pytest.fixture
def project(tmp_path):
    """The project folder datasets are written in (a throwaway one)."""
    before = active_config()
    set_active_config(load_config(tmp_path))
    yield tmp_path
    set_active_config(before)


def test_the_add_to_dataset_form_appends_the_reviewed_item(ana, project):
    run = make_run(keys=keys(3), scores=SCORES)
    label(ana, run, "k001", "fail", expected_output="answer k001, corrected")
    page = ana.get(review(run, item=item_id(run, "k001"))).content.decode()
    assert re.search(r'name="path" value="datasets/reviewed.jsonl"', page)
    data = {"evaluator": "judge", "item": item_id(run, "k001"), "path": "datasets/reviewed.jsonl"}
    added = ana.post(f"/runs/{run.id}/review/dataset/", data)
    assert added.status_code == 303
    assert added["Location"] == review(run, item=item_id(run, "k001"))
    assert (
        "Added item &#x27;k001&#x27; to datasets/reviewed.jsonl, line 1."
        in ana.get(added["Location"]).content.decode()
    )
    [line] = (project / "datasets" / "reviewed.jsonl").read_text().splitlines()
    assert json.loads(line)["id"] == "k001"
    assert "answer k001, corrected" in line
    # The same item again is refused by the dataset with its message; the form keeps the path
    # and the label form its version.
    again = ana.post(f"/runs/{run.id}/review/dataset/", data, **HTMX)
    assert again.status_code == 409
    panel = again.content.decode()
    assert "already has an item with id &#x27;k001&#x27;; nothing was written" in panel
    assert 'name="path" value="datasets/reviewed.jsonl"' in panel
    assert form_value(panel, "version") == "1"
    assert len((project / "datasets" / "reviewed.jsonl").read_text().splitlines()) == 1
    outside = ana.post(f"/runs/{run.id}/review/dataset/", {**data, "path": "../elsewhere.jsonl"})
    assert outside.status_code == 400 and "outside the project" in outside.content.decode()
    assert 'value="../elsewhere.jsonl"' in outside.content.decode()


def test_the_dataset_path_defaults_to_the_runs_own_jsonl_dataset(ana):
    run = make_run(keys=keys(2), scores=SCORES)
    config = run.config
    config["dataset"]["source"] = "datasets/qa.jsonl"
    Run.objects.filter(id=run.id).update(config=config)
    label(ana, run, "k001", "fail")
    page = ana.get(review(run, item=item_id(run, "k001"))).content.decode()
    assert 'name="path" value="datasets/qa.jsonl"' in page


def test_the_login_page_brings_the_reviewer_back_to_the_review(client):
    get_user_model().objects.create_user("ana", password="a long enough password")
    run = make_run(keys=keys(2), scores=SCORES)
    login = client.get(review(run), follow=True)
    next_url = parse_qs(urlsplit(login.redirect_chain[-1][0]).query)["next"][0]
    assert next_url == review(run)
    back = client.post(
        "/login/", {"username": "ana", "password": "a long enough password", "next": next_url}
    )
    assert back["Location"] == review(run)
    assert "0 of 2 reviewed" in client.get(back["Location"]).content.decode()


def test_a_short_run_id_redirects_an_unknown_one_is_404_and_notes_keep_their_lines(ana):
    run = make_run(keys=keys(2), scores=SCORES)
    short = ana.get(f"/runs/{run.id[:6]}/review/?evaluator=judge&item=5")
    assert short.status_code == 302
    assert short["Location"] == f"/runs/{run.id}/review/?evaluator=judge&item=5"
    assert ana.get("/runs/nosuchrun000/review/").status_code == 404
    assert ana.get(review(run, item=999999)).status_code == 404
    # Browsers end a textarea's lines with CR LF.
    label(ana, run, "k001", note="line one\r\nline two", expected_output="Lyon\r\nFrance")
    stored = Label.objects.get()
    assert (stored.note, stored.expected_output) == ("line one\nline two", "Lyon\nFrance")
