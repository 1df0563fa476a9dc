""" "Show judge call" for every judge Cobalt sends: pairwise judges (both orders), DeepEval
and Ragas metrics (the calls they make through Cobalt's judge), each capped and redacted as
an LLM judge's; where an evaluator calls its model itself, the page says so. All through the
fake provider (a real HTTP server)."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from cobalt import Evaluator
from cobalt_app.models import Evaluation, ItemResult, JudgeCall
from tests.helpers import run_with
from tests.test_pages import keys, make_run
from tests.test_pairwise import ITEMS, LONGER, answer

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "sk-test-openai-SECRET-0001"  # the fake provider's key in the environment (conftest)


@pytest.fixture
def client() -> Client:
    return Client(HTTP_HOST="127.0.0.1")


def item_page(client, run, key: str) -> str:
    item = ItemResult.objects.get(run=run, item_key=key)
    return client.get(f"/runs/{run.id}/items/{item.number}/").content.decode()


def test_a_pairwise_judges_call_holds_both_orders_without_secrets(project, fake_provider, client):
    def leaky(ctx):
        return f"{answer(ctx)} (token {KEY})"

    run = run_with(project, [LONGER], leaky, name="pairs", items=ITEMS[:1])
    call = JudgeCall.objects.get(item__run=run, evaluator="better").data
    assert call["via"] == "the pairwise judge, asked in both orders"
    first, second = call["calls"]
    assert first["prompt"].index("<output_a>\nokay") < first["prompt"].index("<output_b>")
    assert second["prompt"].index("<output_b>\nokay") > 0  # the candidate shown first
    assert json.loads(first["reply"])["winner"] == "B"
    assert KEY not in json.dumps(call) and "(token ***)" in first["prompt"]
    page = item_page(client, run, "long")
    assert (
        "Show judge call" in page and "2 calls by the pairwise judge, asked in both orders" in page
    )
    # The judge cache answers the second run, and keeps the calls it answered with.
    again = run_with(project, [LONGER], leaky, name="pairs", items=ITEMS[:1])
    assert Evaluation.objects.get(run=again).cached
    assert JudgeCall.objects.get(item__run=again).data == call


def test_deepeval_and_ragas_metrics_show_the_calls_they_made(project, fake_provider, client):
    pytest.importorskip("deepeval", reason="the `deepeval` extra is not installed")
    pytest.importorskip("ragas", reason="the `ragas` extra is not installed")
    from tests.test_deepeval_ragas import (
        ITEM,
        script_deepeval_faithfulness,
        script_ragas_faithfulness,
    )

    script_deepeval_faithfulness(fake_provider)
    script_ragas_faithfulness(fake_provider)
    evaluators = [
        Evaluator(
            "deepeval",
            "deepeval",
            metric="FaithfulnessMetric",
            mapping={"retrieval_context": "documents"},
        ),
        Evaluator(
            "ragas", "ragas", metric="faithfulness", mapping={"retrieved_contexts": "documents"}
        ),
    ]
    said = f"Paris is the capital of France. It has 9 museums. {KEY}"
    run = run_with(project, evaluators, lambda ctx: said, name="metrics", items=[ITEM])
    calls = dict(JudgeCall.objects.filter(item__run=run).values_list("evaluator", "data"))
    deepeval, ragas = calls["deepeval"], calls["ragas"]
    assert deepeval["via"] == "DeepEval's FaithfulnessMetric"
    assert len(deepeval["calls"]) == 4  # truths, claims, verdicts, reason
    assert any('"truths" key' in turn["prompt"] for turn in deepeval["calls"])
    assert ragas["via"] == "Ragas's faithfulness" and len(ragas["calls"]) == 2
    assert "It has 9 museums." in ragas["calls"][0]["prompt"]
    assert KEY not in json.dumps(calls)
    page = item_page(client, run, "q1")
    assert "4 calls by DeepEval&#x27;s FaithfulnessMetric" in page
    assert "2 calls by Ragas&#x27;s faithfulness" in page


def test_the_page_says_why_a_judged_score_has_no_call(client):
    run = make_run(keys=keys(1), evaluators=("own",))
    Evaluation.objects.filter(run=run).update(tokens=120, cost=0.001)
    page = item_page(client, run, "k000")
    assert "Show judge call" not in page
    assert "this evaluator calls its model itself, where Cobalt cannot see the prompt" in page


def test_an_autoevals_scorers_call_is_shown_with_its_tool_answer(project, fake_provider, client):
    pytest.importorskip("autoevals", reason="the `autoevals` extra is not installed")
    from tests.test_autoevals import ITEM

    facts = Evaluator("facts", "autoevals", autoeval="Factuality")
    run = run_with(project, [facts], lambda ctx: f"Lyon {KEY}", name="auto", items=[ITEM])
    call = JudgeCall.objects.get(item__run=run, evaluator="facts").data
    assert call["via"] == "autoevals' Factuality" and call["model"] == "gpt-4o-mini"
    (turn,) = call["calls"]
    assert turn["prompt"].startswith("[user]\n") and "Lyon ***" in turn["prompt"]
    assert turn["reply"].startswith("select_choice(")  # the scorer's tool answer
    assert KEY not in json.dumps(call)
    assert "1 call by autoevals&#x27; Factuality" in item_page(client, run, "q1")
