"""`ragas`: Ragas' metrics by name, their LLM (and embeddings) being Cobalt's.

    Evaluator(name="faithful", type="ragas", metric="faithfulness",
              mapping={"retrieved_contexts": "documents"})
    Evaluator(name="recall", type="ragas", metric="context_recall")

`metric=` is a metric's name (`faithfulness`, `answer_relevancy`, `context_precision`,
`context_recall`, `factual_correctness`, `tool_call_accuracy`…) or its class name
(`Faithfulness`). `mapping=` sends sample fields (`user_input`, `response`,
`retrieved_contexts`, `reference`, `reference_contexts`, `tool_calls`, `reference_tool_calls`)
from item fields, the output, metadata or the trace (`metric_libraries`); unmapped fields
come from their defaults (DEFAULTS). Other keywords are the metric's own fields (`strictness`,
`mode`, `atomicity`…). Prompts go through Cobalt's judge, embeddings through
`cobalt_app.embeddings` (`embedding_provider=`, `embedding_model=`), tokens and cost counted.
Ragas' own retries are off: the SDK's and the rate budget's apply. A reply Ragas cannot parse
(after its own format-fixing prompts), an exception or a NaN score is an evaluation error.
Install with `pip install 'cobalt-agents[ragas]'`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import re
import warnings
from typing import Any

from cobalt.evaluator import Evaluator
from cobalt.run_settings import RUN_DEFAULTS
from cobalt_app import embeddings
from cobalt_app.evaluators.base import EvalOutcome, EvalTarget, EvaluationError, register
from cobalt_app.evaluators.metric_libraries import (
    JUDGE_OPTIONS,
    Judge,
    build_problems,
    close_match,
    gather_inputs,
    import_library,
    judge_uses,
    mapping_of,
    own_params,
    scored,
    text_list,
    tool_call_list,
)
from cobalt_app.evaluators.usage import current
from cobalt_app.pricing import estimate_cost
from cobalt_app.providers import describe_sdk_error, resolve_api_key

FIELDS = (
    "user_input",
    "response",
    "retrieved_contexts",
    "reference",
    "reference_contexts",
    "tool_calls",
    "reference_tool_calls",
)
DEFAULTS: dict[str, tuple[str, ...]] = {
    "user_input": ("input",),
    "response": ("output",),
    "retrieved_contexts": (
        "retrieved_contexts",
        "retrieval_context",
        "metadata.retrieved_contexts",
        "metadata.retrieval_context",
        "trace.retrieved",
    ),
    "reference": ("reference", "expected_output"),
    "reference_contexts": ("reference_contexts", "context"),
    "tool_calls": ("metadata.tool_calls", "trace.tool_calls"),
    "reference_tool_calls": ("reference_tool_calls", "expected_tools"),
}
OPTIONS = ("metric", "mapping", "embedding_provider", "embedding_model", *JUDGE_OPTIONS)
# Fields Cobalt sets itself, and those that are not parameters.
RESERVED = ("llm", "embeddings", "name", "output_type", "max_retries")


def snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def metric_classes() -> dict[str, type]:
    """Every concrete Ragas metric by its class name and its snake_case name."""
    import_library("ragas", "ragas.metrics")
    from ragas.metrics.base import Metric, MultiTurnMetric, SingleTurnMetric

    found: dict[str, type] = {}
    pending = list(Metric.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        public = not cls.__name__.startswith("_") and cls.__module__.startswith("ragas.")
        if public and issubclass(cls, SingleTurnMetric | MultiTurnMetric):
            found.setdefault(cls.__name__, cls)
            found.setdefault(snake(cls.__name__), cls)
    return found


def metric_class(name: Any) -> type:
    classes = metric_classes()
    names = sorted(n for n in classes if n.islower())
    if not isinstance(name, str) or not name:
        raise EvaluationError(
            f'the ragas evaluator needs `metric="<name>"`; one of {", ".join(names)}'
        )
    if name not in classes:
        raise EvaluationError(
            f"Ragas has no metric {name!r}.{close_match(name, names)} Its metrics: "
            f"{', '.join(names)}"
        )
    return classes[name]


def metric_params(evaluator: Evaluator, cls: type) -> dict[str, Any]:
    accepted = [
        f.name
        for f in dataclasses.fields(cls)
        if f.init and f.name not in RESERVED and not f.name.startswith("_")
    ]
    return own_params(evaluator, accepted, f"Ragas' {cls.__name__}", OPTIONS)


def build_metric(evaluator: Evaluator, env: Any) -> tuple[Any, dict[str, Any]]:
    cls = metric_class(evaluator.options.get("metric"))  # first: it imports Ragas or says how
    from ragas.metrics.base import MetricWithEmbeddings, MetricWithLLM
    from ragas.run_config import RunConfig

    params = metric_params(evaluator, cls)
    mapping_of(evaluator, FIELDS, "Ragas")
    embedding_provider = evaluator.options.get("embedding_provider", "openai")
    if embedding_provider not in embeddings.PROVIDERS:
        raise EvaluationError(
            f"`embedding_provider` must be one of {', '.join(embeddings.PROVIDERS)} "
            f"(got {embedding_provider!r})"
        )
    keywords = dict(params)
    # One try per call: the SDK's retries and the rate budget apply, not Ragas' own.
    run_config = RunConfig(max_retries=1, max_wait=1)
    judge = Judge(evaluator, env, "ragas")
    if issubclass(cls, MetricWithLLM):
        keywords["llm"] = llm_class()(judge, run_config=run_config)
    if issubclass(cls, MetricWithEmbeddings):
        keywords["embeddings"] = cobalt_embeddings(evaluator, env, embedding_provider)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            metric = cls(**keywords)
    except Exception as exc:
        raise EvaluationError(
            f"Ragas' {cls.__name__} refused its parameters: {type(exc).__name__}: {exc}"
        ) from exc
    return metric, params


@functools.cache
def llm_class() -> type:
    """A `BaseRagasLLM` whose every prompt is a Cobalt judge call."""
    from langchain_core.outputs import Generation, LLMResult
    from ragas.llms.base import BaseRagasLLM

    class CobaltLLM(BaseRagasLLM):
        def __init__(self, judge: Judge, **options: Any) -> None:
            super().__init__(**options)
            self.judge = judge

        def generate_text(self, prompt: Any, *args: Any, **kwargs: Any) -> Any:
            raise EvaluationError("Ragas asked for a synchronous call; Cobalt runs it async")

        async def agenerate_text(
            self,
            prompt: Any,
            n: int = 1,
            temperature: float | None = 0.01,
            stop: Any = None,
            callbacks: Any = None,
        ) -> Any:
            text = prompt.to_string() if hasattr(prompt, "to_string") else str(prompt)
            # n > 1 asks for varied answers (answer_relevancy's strictness): one call each.
            replies = [await self.judge.ask(text, temperature) for _ in range(max(1, n))]
            return LLMResult(generations=[[Generation(text=reply) for reply in replies]])

        def is_finished(self, response: Any) -> bool:
            return True

    return CobaltLLM


def cobalt_embeddings(evaluator: Evaluator, env: Any, provider: str) -> Any:
    """`BaseRagasEmbeddings` through Cobalt's embeddings (OpenAI-compatible or local).

    Ragas asks some metrics' embeddings synchronously from inside its async scoring
    (answer_relevancy): those block the event loop for the call, outside the rate budget."""
    from ragas.embeddings.base import BaseRagasEmbeddings

    from cobalt_app.evaluators.llm_judge import judge_target

    local = provider == "local"
    target = judge_target(evaluator, env) if env is not None else {}
    base_url = target.get("base_url") if target.get("provider") == "openai" else None
    model = evaluator.options.get("embedding_model") or embeddings.default_model(provider)

    async def embed(texts: list[str]) -> list[list[float]]:
        try:
            batch = await embeddings.embed(
                texts,
                env,
                provider=provider,
                model=model,
                base_url=None if local else base_url,
                api_key_env=None if local else target.get("api_key_env"),
            )
        except embeddings.EmbeddingError as exc:
            raise EvaluationError(str(exc)) from exc
        current().spent(model, batch.tokens, batch.cost)
        return batch.vectors

    def embed_blocking(texts: list[str]) -> list[list[float]]:
        if local:
            return embeddings.embed_locally(texts)
        import openai

        key = resolve_api_key(
            "openai",
            judge_config=env.judge_config,
            api_key_env=target.get("api_key_env"),
            base_url=base_url,
            purpose=f"the ragas evaluator {evaluator.name!r} (embeddings)",
        )
        client = openai.OpenAI(
            api_key=key,
            base_url=base_url or None,
            timeout=float(env.judge_config.get("timeout", RUN_DEFAULTS.judge.timeout)),
            max_retries=int(env.judge_config.get("max_retries", RUN_DEFAULTS.judge.max_retries)),
        )
        try:
            response = client.embeddings.create(model=model, input=texts)
        except Exception as exc:
            raise EvaluationError(describe_sdk_error("openai", exc, secrets=(key,))) from exc
        finally:
            client.close()
        tokens = response.usage.prompt_tokens if response.usage else 0
        current().spent(model, tokens or 0, estimate_cost(model, tokens or 0, 0))
        return [list(d.embedding) for d in sorted(response.data, key=lambda d: d.index)]

    class CobaltEmbeddings(BaseRagasEmbeddings):
        def embed_query(self, text: str) -> list[float]:
            return embed_blocking([text])[0]

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return embed_blocking(list(texts))

        async def aembed_query(self, text: str) -> list[float]:
            return (await embed([text]))[0]

        async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
            return await embed(list(texts))

    return CobaltEmbeddings()


def sample(metric: Any, inputs: dict[str, Any]) -> tuple[Any, bool]:
    """(the Ragas sample, whether it is multi-turn) for the metric."""
    from ragas.dataset_schema import MultiTurnSample, SingleTurnSample
    from ragas.messages import AIMessage, HumanMessage, ToolCall
    from ragas.metrics.base import SingleTurnMetric

    def calls(field: str) -> list[Any]:
        return [
            ToolCall(
                name=c["name"], args=c["arguments"] if isinstance(c["arguments"], dict) else {}
            )
            for c in tool_call_list(inputs.get(field), field)
        ]

    if isinstance(metric, SingleTurnMetric):
        fields: dict[str, Any] = {}
        for name in ("user_input", "response", "reference"):
            if inputs.get(name) not in (None, ""):
                fields[name] = str(inputs[name])
        for name in ("retrieved_contexts", "reference_contexts"):
            if name in inputs:
                fields[name] = text_list(inputs[name], name)
        return SingleTurnSample(**fields), False
    messages = [
        HumanMessage(content=str(inputs.get("user_input") or "")),
        AIMessage(content=str(inputs.get("response") or ""), tool_calls=calls("tool_calls")),
    ]
    fields = {"user_input": messages}
    if "reference_tool_calls" in inputs:
        fields["reference_tool_calls"] = calls("reference_tool_calls")
    if inputs.get("reference") not in (None, ""):
        fields["reference"] = str(inputs["reference"])
    return MultiTurnSample(**fields), True


def missing_columns(metric: Any, row: Any, multi_turn: bool) -> list[str]:
    key = "MULTI_TURN" if multi_turn else "SINGLE_TURN"
    required = {c.removesuffix(":optional") for c in metric.required_columns.get(key, ())}
    optional = {c for c in metric.required_columns.get(key, ()) if c.endswith(":optional")}
    given = {name for name, value in row if value not in (None, "", [])}
    return sorted(c for c in required - given if c not in optional)


def asks_a_model(evaluator: Evaluator) -> bool:
    cls = metric_class(evaluator.options.get("metric"))  # first: it imports Ragas or says how
    from ragas.metrics.base import MetricWithEmbeddings, MetricWithLLM

    embeds = issubclass(cls, MetricWithEmbeddings) and (
        evaluator.options.get("embedding_provider", "openai") == "openai"
    )
    return issubclass(cls, MetricWithLLM) or embeds


@register(
    "ragas",
    options=OPTIONS,
    providers=judge_uses("ragas", asks_a_model),
    validate=build_problems(build_metric),
)
async def ragas_evaluator(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    await asyncio.to_thread(import_library, "ragas", "ragas.metrics")
    metric, params = build_metric(evaluator, env)
    inputs = gather_inputs(target, mapping_of(evaluator, FIELDS, "Ragas"), DEFAULTS)
    row, multi_turn = sample(metric, inputs)
    name = evaluator.options["metric"]
    missing = missing_columns(metric, row, multi_turn)
    if missing:
        raise EvaluationError(
            f"{name} needs {', '.join(missing)}, which the item does not give; map them with "
            f'mapping={{"{missing[0]}": "<item field>"}}'
        )

    async def measure() -> tuple[Any, str]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            if multi_turn:
                score = await metric.multi_turn_ascore(row)
            else:
                score = await metric.single_turn_ascore(row)
        described = isinstance(score, int | float) and score == score
        # Ragas' metrics return a bare number: say so rather than invent a reason.
        return (
            score,
            f"Ragas {metric.name} = {score:.3f} (Ragas gives no reason)" if described else "",
        )

    return await scored("ragas", evaluator, env, name, params, inputs, measure)
