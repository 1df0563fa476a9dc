"""The autoevals evaluator: scorers by name, through Cobalt's providers and judge cache, against
the fake provider (which answers tool calls from `[[tool:{...}]]` markers)."""

from __future__ import annotations

import json

import pytest

from cobalt import Dataset, Evaluator
from cobalt_app import embeddings
from cobalt_app.models import Evaluation
from cobalt_app.preflight import PreflightError
from tests.helpers import define, execute, run_with

pytest.importorskip("autoevals", reason="the `autoevals` extra is not installed")
pytestmark = pytest.mark.django_db(transaction=True)

ITEM = {
    "id": "q1",
    "input": "What is the capital of France?",
    "expected_output": "Paris",
    "context": "Paris is the capital and largest city of France.",
    "criteria": "Names the right city",
}


def run_auto(project, evaluators, output, *, item=None, config_text=None, no_cache=False):
    """The evaluations of one item (ITEM) answered `output`, by evaluator."""
    run = run_with(
        project,
        evaluators,
        lambda ctx: output,
        name="auto",
        items=[item or ITEM],
        config_text=config_text,
        no_cache=no_cache,
    )
    return {e.evaluator: e for e in Evaluation.objects.filter(run=run)}


def chat_requests(fake_provider):
    return [r for r in fake_provider.requests if r["path"] == "/v1/chat/completions"]


def test_factuality_asks_with_a_tool_and_scores_the_chosen_answer(project, fake_provider):
    output = 'Paris. [[tool:{"choice": "C", "reasons": "The answer matches the expert."}]]'
    found = run_auto(project, [Evaluator("facts", "autoevals", autoeval="Factuality")], output)
    facts = found["facts"]
    assert (facts.status, facts.score) == ("ok", 1.0)
    assert facts.reason == "The answer matches the expert. (choice C)"
    assert facts.tokens > 0 and facts.cost > 0
    (request,) = chat_requests(fake_provider)
    body = request["json"]
    assert body["model"] == "gpt-4o-mini"  # the configured judge model, not autoevals' default
    assert body["tool_choice"] == {"type": "function", "function": {"name": "select_choice"}}
    prompt = body["messages"][0]["content"]
    assert "What is the capital of France?" in prompt and "Paris" in prompt
    assert request["headers"]["authorization"] == "Bearer sk-test-openai-SECRET-0001"


def test_the_default_tool_answer_maps_through_the_choice_scores(project, fake_provider):
    found = run_auto(project, [Evaluator("facts", "autoevals", autoeval="Factuality")], "Lyon")
    assert found["facts"].score == 0.4  # the fake picks choice "A", which Factuality scores 0.4
    assert "(choice A)" in found["facts"].reason


def test_replies_are_cached_in_the_judge_cache(project, fake_provider):
    evaluator = Evaluator("facts", "autoevals", autoeval="Factuality")
    first = run_auto(project, [evaluator], 'Paris [[tool:{"choice": "E"}]]')["facts"]
    assert not first.cached and len(chat_requests(fake_provider)) == 1
    second = run_auto(project, [evaluator], 'Paris [[tool:{"choice": "E"}]]')["facts"]
    assert second.cached and second.tokens == 0 and second.score == first.score == 1.0
    assert len(chat_requests(fake_provider)) == 1
    run_auto(project, [evaluator], 'Paris [[tool:{"choice": "E"}]]', no_cache=True)
    assert len(chat_requests(fake_provider)) == 2


def test_field_mappings_feed_the_scorers_arguments(project, fake_provider):
    item = {"id": "m", "question": "Sort a list", "reference": "sorted(xs)", "rule": "Uses Python"}
    evaluators = [
        Evaluator(
            "battle",
            "autoevals",
            autoeval="Battle",
            expected="reference",
            mapping={"instructions": "question"},
        ),
        Evaluator(
            "closed",
            "autoevals",
            autoeval="ClosedQA",
            context={"input": "question", "criteria": "rule"},  # the seed's spelling
        ),
    ]
    found = run_auto(project, evaluators, "xs.sort()", item=item)
    assert found["battle"].status == "ok" and found["closed"].status == "ok"
    prompts = [r["json"]["messages"][0]["content"] for r in chat_requests(fake_provider)]
    battle = next(p for p in prompts if "sorted(xs)" in p)
    assert "Sort a list" in battle and "xs.sort()" in battle
    closed = next(p for p in prompts if "Uses Python" in p)
    assert "Sort a list" in closed


def test_context_recall_uses_the_context_field(project, fake_provider):
    statements = {
        "statements": [
            {"statement": "Paris is the capital", "reason": "in context", "attributed": 1},
            {"statement": "It has 2M people", "reason": "not in context", "attributed": 0},
        ]
    }
    item = {**ITEM, "context": f"Paris is the capital. [[tool:{json.dumps(statements)}]]"}
    found = run_auto(
        project, [Evaluator("recall", "autoevals", autoeval="ContextRecall")], "Paris", item=item
    )
    assert found["recall"].score == 0.5
    (request,) = chat_requests(fake_provider)
    assert request["json"]["tools"][0]["function"]["name"] == "extract_statements"


def test_answer_relevancy_combines_a_tool_call_and_cached_embeddings(project, fake_provider):
    question = {"question": "What is the capital of France?", "noncommittal": 0}
    output = f"Paris [[tool:{json.dumps(question)}]]"
    evaluator = Evaluator("rel", "autoevals", autoeval="AnswerRelevancy", args={"strictness": 1})
    found = run_auto(project, [evaluator], output)
    assert found["rel"].score == pytest.approx(1.0)  # the generated question equals the input
    embedding_requests = [r for r in fake_provider.requests if r["path"] == "/v1/embeddings"]
    assert embedding_requests
    assert all(r["json"]["model"] == "text-embedding-3-small" for r in embedding_requests)


def test_answer_similarity_uses_the_embedding_model(project, fake_provider):
    evaluator = Evaluator("sim", "autoevals", autoeval="AnswerSimilarity")
    found = run_auto(project, [evaluator], "Paris")
    assert found["sim"].score == 1.0  # the same text as expected_output
    (request,) = [r for r in fake_provider.requests if r["path"] == "/v1/embeddings"]
    assert request["json"]["model"] == "text-embedding-3-small"


@pytest.mark.skipif(not embeddings.local_available(), reason="the `local` extra is not installed")
def test_embedding_scorers_can_run_on_the_local_model(project, fake_provider):
    evaluator = Evaluator(
        "sim", "autoevals", autoeval="EmbeddingSimilarity", embedding_provider="local"
    )
    found = run_auto(project, [evaluator], "The capital city is Paris.")
    assert 0 < found["sim"].score < 1
    assert fake_provider.request_count() == 0


def test_deterministic_scorers_need_no_model(project, fake_provider):
    item = {"id": "d", "expected_output": {"a": 1, "b": [1, 2]}, "text": "kitten"}
    evaluators = [
        Evaluator("diff", "autoevals", autoeval="JSONDiff"),
        Evaluator("valid", "autoevals", autoeval="ValidJSON"),
        Evaluator("lev", "autoevals", autoeval="Levenshtein", expected="text"),
    ]
    found = run_auto(project, evaluators, {"a": 1, "b": [1, 2]}, item=item)
    assert found["diff"].score == 1.0 and found["valid"].score == 1.0
    assert found["lev"].status == "ok" and 0 <= found["lev"].score < 1
    assert found["diff"].reason == "JSONDiff scored 1.000"
    assert fake_provider.request_count() == 0


def test_an_anthropic_judge_answers_autoevals_through_tool_use(project, fake_provider):
    config = '[judge]\nprovider = "anthropic"\nmodel = "claude-haiku-4-5"\n'
    output = 'Paris [[tool:{"choice": "D", "reasons": "Contradicts the expert."}]]'
    found = run_auto(
        project,
        [Evaluator("facts", "autoevals", autoeval="Factuality")],
        output,
        config_text=config,
    )
    assert found["facts"].score == 0.0 and "Contradicts the expert." in found["facts"].reason
    (request,) = fake_provider.requests
    assert request["path"] == "/v1/messages"
    body = request["json"]
    assert body["model"] == "claude-haiku-4-5"
    assert body["tool_choice"] == {"type": "tool", "name": "select_choice"}
    assert body["tools"][0]["input_schema"]["properties"]["choice"]["enum"] == list("ABCDE")


def test_a_gpt5_judge_goes_through_chat_completions_too(project, fake_provider):
    evaluator = Evaluator("facts", "autoevals", autoeval="Factuality", model="gpt-5-mini")
    found = run_auto(project, [evaluator], 'Paris [[tool:{"choice": "B"}]]')
    assert found["facts"].score == 0.6
    (request,) = chat_requests(fake_provider)
    assert request["json"]["model"] == "gpt-5-mini"
    assert request["json"]["tool_choice"]["function"]["name"] == "select_choice"


@pytest.mark.parametrize(
    ("evaluator", "item", "message"),
    [
        (Evaluator("x", "autoevals"), ITEM, 'needs `autoeval="<scorer>"`; one of'),
        (Evaluator("x", "autoevals", autoeval="Factualty"), ITEM, "no scorer 'Factualty'"),
        (
            Evaluator("x", "autoevals", autoeval="Factuality"),
            {"id": "n", "input": "q"},
            "Factuality needs `expected`, but the item's 'expected_output' is missing",
        ),
        (
            Evaluator("x", "autoevals", autoeval="ContextRecall"),
            {"id": "n", "input": "q", "expected_output": "a"},
            "ContextRecall needs `context`",
        ),
        (
            Evaluator("x", "autoevals", autoeval="ClosedQA", mapping={"criteria": "rules"}),
            ITEM,
            "sends 'rules' to the scorer's `criteria`",
        ),
        (
            Evaluator("x", "autoevals", autoeval="Factuality", embedding_provider="cohere"),
            ITEM,
            "`embedding_provider` must be one of",
        ),
        (Evaluator("x", "autoevals", autoeval="Moderation"), ITEM, "does not route"),
    ],
)
def test_problems_are_evaluation_errors_with_reasons(
    project, fake_provider, evaluator, item, message
):
    found = run_auto(project, [evaluator], "Paris", item=item)
    assert found["x"].status == "error" and found["x"].score is None
    assert message in found["x"].error
    assert chat_requests(fake_provider) == []


def test_a_missing_key_names_the_variable(project, fake_provider, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY")
    facts = Evaluator("facts", "autoevals", autoeval="Factuality")
    with pytest.raises(PreflightError) as refused:
        run_auto(project, [facts], "Paris")
    assert "OPENAI_API_KEY is not set: the autoevals evaluator 'facts' (Factuality)" in str(
        refused.value
    )
    assert fake_provider.request_count() == 0


def test_without_the_extra_the_error_says_how_to_install_it(monkeypatch):
    import asyncio
    import sys

    from cobalt_app.evaluators import EvalTarget, evaluate

    monkeypatch.setitem(sys.modules, "autoevals", None)  # as if not installed
    evaluator = Evaluator("facts", "autoevals", autoeval="Factuality")
    outcome = asyncio.run(evaluate(evaluator, EvalTarget(ITEM, "Paris"), None))
    assert outcome.status == "error"
    assert "pip install 'cobalt-agents[autoevals]'" in outcome.error


def test_autoevals_calls_keep_to_the_shared_rate_budget(project, fake_provider):
    # 6 items, one Factuality call each, at most 5 requests a second after a burst of 1.
    project.write(
        "cobalt.toml",
        'test_dir = "experiments"\n[rate_limits.openai]\nrequests_per_second = 5\n',
    )
    definition = define(
        "budgeted",
        Dataset(items=[{**ITEM, "id": f"q{i}"} for i in range(6)]),
        lambda ctx: f"Paris {ctx.index}",
        evaluators=[Evaluator("facts", "autoevals", autoeval="Factuality")],
        concurrency=6,
    )
    execute(project, definition, no_cache=True)
    times = sorted(r["time"] for r in chat_requests(fake_provider))
    assert len(times) == 6
    # Spaced by the budget, not all at once: 5 gaps of 0.2 s after the first grant. The first
    # request may reach the provider late (its connection is opened then), so count from the
    # second one.
    assert times[-1] - times[1] >= 4 * 0.2 * 0.95
