"""The pairwise judge: both orders against the fake provider, a tie when they disagree, win
rates with ties half; in a run (against the reference), on the compare page and in the API."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from cobalt import Evaluator
from cobalt.config import active_config
from cobalt.pairwise import combine, win_rate
from cobalt_app.labels import label_save
from cobalt_app.models import Evaluation, JudgeCacheEntry
from cobalt_app.pairwise_compare import PairwiseError, pairwise_compare
from tests.helpers import run_with
from tests.test_api import api, api_project, token, user  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

ITEMS = [
    {"id": "long", "input": "q long", "expected_output": "okay"},
    {"id": "same", "input": "q same", "expected_output": "okay"},
    {"id": "short", "input": "q short", "expected_output": "okay"},
]
ANSWERS = {"long": "a much longer answer", "same": "fine", "short": "no"}
LONGER = Evaluator(name="better", type="pairwise", prompt="For {{input}}? [[prefer:longer]]")


def answer(ctx):
    return ANSWERS[ctx.item["id"]]


def scores(run) -> dict[str, tuple[str, float | None, str]]:
    found = Evaluation.objects.filter(run=run).values_list(
        "item__item_key", "status", "score", "error"
    )
    return {key: (status, score, error) for key, status, score, error in found}


def pair_requests(fake_provider) -> list[str]:
    return [
        r["json"]["messages"][-1]["content"]
        for r in fake_provider.requests
        if "<output_a>" in json.dumps(r["json"])
    ]


def test_a_verdict_counts_only_when_both_orders_agree():
    # forward: the candidate shown as B; backward: shown as A
    assert combine("B", "A") == "win"
    assert combine("A", "B") == "loss"
    assert combine("A", "A") == "tie"  # always the first shown: position bias, a tie
    assert combine("B", "B") == "tie"
    assert combine("tie", "A") == "tie"


def test_the_win_rate_counts_ties_half_with_a_seeded_bootstrap_interval():
    rate = win_rate(["win"] * 6 + ["tie"] * 6, order_disagreements=6)
    assert (rate.wins, rate.ties, rate.losses, rate.n) == (6, 6, 0, 12)
    assert rate.value == pytest.approx(0.75)
    assert 0.5 < rate.low < 0.75 < rate.high <= 1.0
    assert rate == win_rate(["win"] * 6 + ["tie"] * 6, order_disagreements=6)
    assert rate.as_dict()["ties"] == "ties count as half a win"
    assert win_rate([]).value is None


def test_in_a_run_it_judges_the_output_against_the_reference_in_both_orders(project, fake_provider):
    run = run_with(project, [LONGER], answer, name="pairs", items=ITEMS)
    found = scores(run)
    assert found["long"][:2] == ("ok", 1.0)  # longer than "okay" in both orders
    assert found["same"][:2] == ("ok", 0.5)  # equal length: "A" both times, the orders disagree
    assert found["short"][:2] == ("ok", 0.0)
    reason = Evaluation.objects.get(run=run, item__item_key="same").reason
    assert "the orders disagree: a tie" in reason
    asked = pair_requests(fake_provider)
    assert len(asked) == 6  # two orders per item
    long_asked = [text for text in asked if "q long" in text]
    assert "<output_a>\nokay\n</output_a>" in long_asked[0]  # the candidate second …
    assert "<output_a>\na much longer answer\n</output_a>" in long_asked[1]  # … then first
    again = run_with(project, [LONGER], answer, name="pairs", items=ITEMS)
    assert scores(again)["long"][:2] == ("ok", 1.0)
    assert len(pair_requests(fake_provider)) == 6  # both orders answered by the judge cache
    assert JudgeCacheEntry.objects.count() == 6


def test_a_judge_that_answers_prose_is_an_evaluation_error_naming_it(project, fake_provider):
    chatty = Evaluator(name="chatty", type="pairwise", prompt="[[reply:B, clearly]]")
    run = run_with(project, [chatty], answer, name="pairs", items=ITEMS[:1])
    status, score, error = scores(run)["long"]
    assert (status, score) == ("error", None)
    assert "the pairwise judge 'chatty' did not answer JSON" in error and "B, clearly" in error
    assert len(pair_requests(fake_provider)) == 2  # the first order, retried once, then given up


def test_an_item_without_the_reference_field_says_which_field(project, fake_provider):
    judge = Evaluator(name="better", type="pairwise", field="gold")
    run = run_with(project, [judge], answer, name="pairs", items=ITEMS[:1])
    status, _, error = scores(run)["long"]
    assert status == "error"
    assert "'gold' field, which this item lacks; name the reference with `field=`" in error


def test_the_compare_page_and_the_api_give_b_s_win_rate(api_project, api, fake_provider):  # noqa: F811
    judges = [LONGER, Evaluator(name="first", type="pairwise", prompt="[[prefer:first]]")]
    short = {"long": "no", "same": "fine", "short": "no"}
    a = run_with(api_project, judges, lambda ctx: short[ctx.item["id"]], name="pairs", items=ITEMS)
    b = run_with(api_project, judges, answer, name="pairs", items=ITEMS)

    found = api.get(f"/api/compare/pairwise/?a={a.id}&b={b.id}&judge=better").json()
    assert (found["wins"], found["tied"], found["losses"]) == (1, 2, 0)
    assert found["orderDisagreements"] == 2 and found["winRate"] == pytest.approx(4 / 6)
    assert found["low"] <= found["winRate"] <= found["high"]
    assert found["ties"] == "ties count as half a win"
    wrong = api.get(f"/api/compare/pairwise/?a={a.id}&b={b.id}&judge=nope")
    assert wrong.status_code == 400
    assert "pairwise judges there: better, first" in wrong.json()["judge"][0]

    with pytest.raises(PairwiseError, match="have 3 items to judge, 6 judge calls; a page"):
        pairwise_compare(a, b, "better", active_config(), max_pairs=2)  # too many to wait for

    client = Client(HTTP_HOST="127.0.0.1")
    page = client.get(f"/compare/?a={a.id}&b={b.id}").content.decode()
    assert '<option value="first">first</option>' in page and 'id="win-rate"' not in page
    page = client.get(f"/compare/?a={a.id}&b={b.id}&pairwise=first").content.decode()
    assert "B wins 0</strong>, ties 3 (3 where the orders disagreed), A wins 0" in page
    assert "Win rate of B <strong>0.50</strong>" in page


def test_the_api_gives_a_judge_s_disagreements_and_says_how_to_label(
    api_project,  # noqa: F811
    api,  # noqa: F811
    fake_provider,
):
    judge = Evaluator(name="strict", prompt="{{output}} [[score:0.0]]")
    run = run_with(api_project, [judge], answer, name="pairs", items=ITEMS)
    unlabelled = api.get(f"/api/judges/strict/calibration/?run={run.id}")
    assert unlabelled.status_code == 400
    assert "review page" in unlabelled.json()["judge"][0]
    item = run.items.get(item_key="long")
    label_save(
        run=run,
        item_id=item.id,
        evaluator="strict",
        reviewer="ana",
        verdict="pass",
        note="it is right",
    )
    found = api.get("/api/judges/strict/calibration/").json()
    assert found["run"] == run.id and found["labels"] == 1
    (row,) = found["disagreements"]
    assert (row["itemKey"], row["input"], row["output"]) == ("long", "q long", ANSWERS["long"])
    assert (row["judgeVerdict"], row["label"], row["note"]) == ("fail", "pass", "it is right")
    assert found["agreement"]["state"] == "not enough labels"
    trends = Client(HTTP_HOST="127.0.0.1").get("/trends/?experiment=pairs").content.decode()
    versions = trends.split('id="judge-versions"')[1].split("</table>")[0]
    assert f"<code>{found['judgeKey']}</code>" in versions and "not enough labels" in versions
    unknown = api.get("/api/judges/nope/calibration/")
    assert unknown.status_code == 404 and "known judges: strict" in unknown.json()["detail"]
