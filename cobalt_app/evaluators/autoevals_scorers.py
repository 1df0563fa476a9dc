"""`autoevals`: the scorers of Braintrust's `autoevals` package, by name.

    Evaluator(name="facts", type="autoevals", autoeval="Factuality", expected="answer")
    Evaluator(name="recall", type="autoevals", autoeval="ContextRecall",
              mapping={"context": "documents"})

Arguments: `output` is the agent's output; `expected` comes from the item field named by
`expected=` (or `field=`, default `expected_output`); `input`, `context`, `criteria`, `language`
from the item fields of the same name, and `mapping=` (the seed's `context=` dict works too)
maps any scorer argument to an item field or a dotted path (`"metadata.docs"`, `"output"`).
`args=` passes constructor options (`{"use_cot": False}`). Install with
`pip install 'cobalt-agents[autoevals]'`.

Model calls go through Cobalt, not autoevals' own client: the judge provider, model, base URL
and key of the evaluator or the `[judge]` configuration (Anthropic included, translated to
tool use), the SDKs' retries, and the judge cache. Embeddings (AnswerSimilarity,
EmbeddingSimilarity, AnswerRelevancy) use the cached OpenAI embeddings (`embedding_model=`,
default `text-embedding-3-small`), or the offline local model with `embedding_provider="local"`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import inspect
import json
import weakref
from types import SimpleNamespace
from typing import Any

from cobalt.evaluator import Evaluator
from cobalt.wording import install_hint
from cobalt_app import embeddings
from cobalt_app.cache import cached_call
from cobalt_app.evaluators.base import (
    EvalOutcome,
    EvalTarget,
    EvaluationError,
    ProviderUse,
    register,
)
from cobalt_app.evaluators.basic import output_text
from cobalt_app.evaluators.llm_judge import judge_settings, judge_target
from cobalt_app.evaluators.metric_libraries import library_call
from cobalt_app.evaluators.usage import counted, current
from cobalt_app.providers import (
    ProviderError,
    chat_params,
    describe_sdk_error,
    resolve_api_key,
)
from cobalt_app.templating import TemplateError, _lookup

INSTALL_HINT = install_hint("autoevals")
# What each well-known scorer cannot do without (autoevals' LLM classifiers would silently
# render an empty template variable instead of failing).
REQUIRED: dict[str, tuple[str, ...]] = {
    "Factuality": ("input", "expected"),
    "ClosedQA": ("input", "criteria"),
    "Battle": ("instructions", "expected"),
    "Possible": ("input",),
    "Sql": ("input", "expected"),
    "Summary": ("input", "expected"),
    "Translation": ("input", "expected", "language"),
    "AnswerCorrectness": ("input", "expected"),
    "AnswerSimilarity": ("expected",),
    "AnswerRelevancy": ("input", "context"),
    "ContextRecall": ("input", "expected", "context"),
    "ContextPrecision": ("input", "expected", "context"),
    "ContextRelevancy": ("input", "context"),
    "ContextEntityRecall": ("expected", "context"),
    "Faithfulness": ("input", "context"),
    "Levenshtein": ("expected",),
    "EmbeddingSimilarity": ("expected",),
    "JSONDiff": ("expected",),
    "ExactMatch": ("expected",),
    "NumericDiff": ("expected",),
    "ListContains": ("expected",),
}
# Item fields read by default for scorer arguments of these names ("instructions" is Battle's
# name for the task).
DEFAULT_SOURCES = {
    "input": "input",
    "context": "context",
    "criteria": "criteria",
    "language": "language",
    "instructions": "input",
}
RAW_OUTPUT_SCORERS = ("JSONDiff", "ValidJSON", "ExactMatch", "NumericDiff", "ListContains")
EMBEDDING_MODEL = "text-embedding-3-small"
# Scorers whose `model` argument is an embedding model, not a chat model.
EMBEDDING_SCORERS = ("EmbeddingSimilarity", "AnswerSimilarity")
# Scorers that call no model, and those that embed besides asking the judge.
LOCAL_SCORERS = (
    "ExactMatch",
    "JSONDiff",
    "Levenshtein",
    "LevenshteinScorer",
    "ListContains",
    "NumericDiff",
    "ValidJSON",
)
JUDGE_AND_EMBEDDING_SCORERS = ("AnswerCorrectness", "AnswerRelevancy")
OPTIONS = (
    "autoeval",
    "scorer",
    "expected",
    "field",
    "mapping",
    "context",
    "args",
    "embedding_model",
    "embedding_provider",
    "provider",
    "model",
    "base_url",
    "api_key_env",
)


class CobaltClient:
    """What autoevals sees as an OpenAI client; every call goes through Cobalt's providers."""

    def __init__(
        self, target: dict[str, Any], env: Any, embedding_provider: str, embedding_model: str
    ) -> None:
        self.target = target
        self.env = env
        self.embedding_provider = embedding_provider
        self.embedding_model = embedding_model
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.complete))
        self.embeddings = SimpleNamespace(create=self.embed)
        self.responses = SimpleNamespace(create=self.respond)
        self.moderations = SimpleNamespace(create=self.moderate)

    async def complete(self, **request: Any) -> dict[str, Any]:
        request.pop("span_info", None)
        request["model"] = self.target["model"]
        request = chat_params(self.target["provider"], request["model"], request)
        usage = current()
        usage.calls += 1
        provider = self.target["provider"]
        env = self.env

        async def completed() -> dict[str, Any]:
            api_key = resolve_api_key(
                provider,
                judge_config=env.judge_config,
                api_key_env=self.target["api_key_env"],
                base_url=self.target["base_url"],
                purpose="the autoevals evaluator",
            )
            client = env.hub.client(provider, base_url=self.target["base_url"], api_key=api_key)
            send = functools.partial(env.hub.send, provider, api_key)  # the shared rate budget
            try:
                if provider == "anthropic":
                    reply = await _anthropic_completion(client, request, send)
                else:
                    created = await send(client.chat.completions.create, **request)
                    reply = _slim(created.model_dump())
            except ProviderError:
                raise
            except Exception as exc:
                raise ProviderError(describe_sdk_error(provider, exc, secrets=(api_key,))) from exc
            usage.add(
                self.target["model"],
                reply["usage"]["prompt_tokens"],
                reply["usage"]["completion_tokens"],
            )
            return reply

        asked = {
            "kind": "autoevals",
            "provider": provider,
            "model": self.target["model"],
            "base_url": self.target["base_url"],
            "request": request,
        }
        reply, cached = await cached_call(
            env, asked, completed, provider=provider, model=self.target["model"]
        )
        usage.hits += cached
        usage.heard(_messages_text(request), _reply_text(reply))
        return reply

    async def respond(self, **request: Any) -> dict[str, Any]:
        """The Responses API, which autoevals uses for gpt-5 models: answered as a chat call."""
        tools = [
            {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
            if t.get("type") == "function"
            else t
            for t in request.get("tools") or []
        ]
        chat: dict[str, Any] = {"model": request["model"], "messages": request["input"]}
        if tools:
            chat["tools"] = tools
            if request.get("tool_choice") == "required" and len(tools) == 1:
                name = tools[0]["function"]["name"]
                chat["tool_choice"] = {"type": "function", "function": {"name": name}}
        if "temperature" in request:
            chat["temperature"] = request["temperature"]
        return await self.complete(**chat)

    async def embed(self, *, input: Any, **_: Any) -> dict[str, Any]:
        # The configured embedding model wins over the one autoevals names: some scorers
        # (AnswerRelevancy) drop their `embedding_model` and ask for autoevals' default.
        texts = [input] if isinstance(input, str) else [str(t) for t in input]
        usage = current()
        usage.calls += 1
        local = self.embedding_provider == "local"
        base_url = self.target["base_url"] if self.target["provider"] == "openai" else None
        try:
            batch = await embeddings.embed(
                texts,
                self.env,
                provider=self.embedding_provider,
                model=None if local else self.embedding_model,
                base_url=None if local else base_url,
                api_key_env=None if local else self.target["api_key_env"],
            )
        except embeddings.EmbeddingError as exc:
            raise ProviderError(str(exc)) from exc
        usage.spent(batch.model, batch.tokens, batch.cost)
        usage.hits += batch.cached == len(texts)
        return {
            "data": [{"embedding": v, "index": i} for i, v in enumerate(batch.vectors)],
            "usage": {"prompt_tokens": batch.tokens, "total_tokens": batch.tokens},
        }

    async def moderate(self, **_: Any) -> dict[str, Any]:
        raise ProviderError(
            "the Moderation scorer calls OpenAI's moderation API, which Cobalt does not route; "
            "use an llm-judge evaluator for content checks"
        )


def _messages_text(request: dict[str, Any]) -> str:
    """A chat request's messages as "Show judge call" shows a prompt: each with its role."""
    parts = []
    for message in request.get("messages") or []:
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        parts.append(f"[{message.get('role', '?')}]\n{text}")
    return "\n\n".join(parts)


def _reply_text(reply: dict[str, Any]) -> str:
    """A slim completion's answer: its text, or the tool calls it chose."""
    message = ((reply.get("choices") or [{}])[0]).get("message") or {}
    calls = [
        f"{c['function']['name']}({c['function']['arguments']})"
        for c in message.get("tool_calls") or []
    ]
    return "\n".join([message.get("content") or "", *calls]).strip()


def _slim(response: dict[str, Any]) -> dict[str, Any]:
    """The parts of a chat completion autoevals reads (and the cache keeps)."""
    choices = []
    for choice in response.get("choices") or []:
        message = choice.get("message") or {}
        slim: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if message.get("tool_calls"):
            slim["tool_calls"] = [
                {
                    "id": call.get("id"),
                    "type": "function",
                    "function": {
                        "name": call["function"]["name"],
                        "arguments": call["function"]["arguments"],
                    },
                }
                for call in message["tool_calls"]
            ]
        choices.append(
            {
                "index": choice.get("index", 0),
                "message": slim,
                "finish_reason": choice.get("finish_reason"),
            }
        )
    usage = response.get("usage") or {}
    return {
        "choices": choices,
        "usage": {
            "prompt_tokens": usage.get("prompt_tokens") or 0,
            "completion_tokens": usage.get("completion_tokens") or 0,
        },
    }


async def _anthropic_completion(client: Any, request: dict[str, Any], send: Any) -> dict[str, Any]:
    """A chat-completions request with function tools, asked of Claude as tool use."""
    system = "\n\n".join(
        str(m["content"]) for m in request["messages"] if m.get("role") == "system"
    )
    messages = [
        {"role": m["role"], "content": m["content"]}
        for m in request["messages"]
        if m.get("role") in ("user", "assistant")
    ]
    call: dict[str, Any] = {
        "model": request["model"],
        "messages": messages,
        "max_tokens": int(request.get("max_tokens") or 1024),
    }
    if system:
        call["system"] = system
    if "temperature" in request:
        call["temperature"] = request["temperature"]
    if request.get("tools"):
        call["tools"] = [
            {
                "name": t["function"]["name"],
                "description": t["function"].get("description", ""),
                "input_schema": t["function"].get("parameters") or {"type": "object"},
            }
            for t in request["tools"]
        ]
        choice = request.get("tool_choice")
        if isinstance(choice, dict) and choice.get("function", {}).get("name"):
            call["tool_choice"] = {"type": "tool", "name": choice["function"]["name"]}
    response = await send(client.messages.create, **call)
    text = "".join(getattr(b, "text", "") for b in response.content if b.type == "text")
    tool_calls = [
        {
            "id": b.id,
            "type": "function",
            "function": {"name": b.name, "arguments": json.dumps(b.input)},
        }
        for b in response.content
        if b.type == "tool_use"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "choices": [{"index": 0, "message": message, "finish_reason": response.stop_reason}],
        "usage": {
            "prompt_tokens": response.usage.input_tokens or 0,
            "completion_tokens": response.usage.output_tokens or 0,
        },
    }


# One client per run and evaluator configuration, so autoevals' in-memory embedding cache
# (keyed by client identity) stays bounded by the dataset.
_clients: dict[int, dict[tuple, Any]] = {}


def llm_client(evaluator: Evaluator, env: Any, embedding_provider: str) -> Any:
    from autoevals.oai import LLMClient

    target = judge_target(evaluator, env)
    embedding_model = evaluator.options.get("embedding_model") or EMBEDDING_MODEL
    config = (*sorted(target.items()), embedding_provider, embedding_model)
    per_env = _clients.get(id(env))
    if per_env is None:
        per_env = _clients[id(env)] = {}
        weakref.finalize(env, _clients.pop, id(env), None)
    if config not in per_env:
        adapter = CobaltClient(target, env, embedding_provider, embedding_model)
        # Passing `moderation` marks the client as customised, so autoevals never wraps it in
        # Braintrust tracing; it still reads chat/embeddings/responses from the adapter.
        per_env[config] = LLMClient(openai=adapter, is_async=True, moderation=adapter.moderate)
    return per_env[config]


def _import_quietly(module: str) -> None:
    with contextlib.suppress(ImportError):
        importlib.import_module(module)


def scorer_class(name: Any) -> type:
    try:
        import autoevals
    except ImportError as exc:
        raise EvaluationError(
            f"the autoevals evaluator needs the optional extra: {INSTALL_HINT} "
            f"(missing Python module {exc.name!r})"
        ) from exc
    known = sorted(
        n
        for n in getattr(autoevals, "__all__", dir(autoevals))
        if inspect.isclass(getattr(autoevals, n, None))
        and issubclass(getattr(autoevals, n), autoevals.Scorer)
        and n not in ("Scorer", "LLMClassifier", "OpenAILLMClassifier", "SpecFileClassifier")
    ) or sorted(REQUIRED)
    if not isinstance(name, str) or not name:
        raise EvaluationError(
            f'the autoevals evaluator needs `autoeval="<scorer>"`; one of {", ".join(known)}'
        )
    cls = getattr(autoevals, name, None)
    if not inspect.isclass(cls) or not issubclass(cls, autoevals.Scorer):
        raise EvaluationError(f"autoevals has no scorer {name!r}; use one of {', '.join(known)}")
    return cls


def scorer_arguments(evaluator: Evaluator, target: EvalTarget, name: str) -> dict[str, Any]:
    """The keyword arguments of `eval_async` from the item, the output and the mapping."""
    options = evaluator.options
    mapping = options.get("mapping")
    if mapping is None and isinstance(options.get("context"), dict):
        mapping = options["context"]  # the seed's spelling
    mapping = dict(mapping or {})
    if isinstance(options.get("context"), str):
        mapping.setdefault("context", options["context"])
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
        raise EvaluationError(
            '`mapping` must map scorer arguments to item fields, e.g. {"context": "docs"}'
        )
    expected_field = options.get("expected") or evaluator.field or "expected_output"
    lookup = {
        **target.item,
        "output": target.output,
        "metadata": target.metadata,
        "item": target.item,
    }
    arguments: dict[str, Any] = {}
    if name in RAW_OUTPUT_SCORERS or isinstance(target.output, str):
        arguments["output"] = target.output
    else:
        arguments["output"] = output_text(target.output)
    if expected_field in target.item:
        arguments["expected"] = target.item[expected_field]
    for argument, field in DEFAULT_SOURCES.items():
        if field in target.item and argument not in mapping:
            arguments[argument] = target.item[field]
    for argument, path in mapping.items():
        try:
            arguments[argument] = _lookup(lookup, path)
        except TemplateError:
            raise EvaluationError(
                f"`mapping` sends {path!r} to the scorer's `{argument}`, but the item has no such "
                "field"
            ) from None
    for argument in REQUIRED.get(name, ()):
        if arguments.get(argument) in (None, ""):
            source = mapping.get(argument) or (
                expected_field
                if argument == "expected"
                else DEFAULT_SOURCES.get(argument, argument)
            )
            hint = (
                'expected="field"'
                if argument == "expected"
                else f'mapping={{"{argument}": "field"}}'
            )
            raise EvaluationError(
                f"{name} needs `{argument}`, but the item's {source!r} is missing or empty; "
                f"add it to the dataset or point at another field with {hint}"
            )
    return arguments


def constructor_options(
    cls: type, evaluator: Evaluator, env: Any, embedding_provider: str
) -> dict[str, Any]:
    options = dict(evaluator.options.get("args") or {})
    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        parameters = {}
    if "client" in parameters:
        options["client"] = llm_client(evaluator, env, embedding_provider)
    embedding_model = evaluator.options.get("embedding_model") or EMBEDDING_MODEL
    if embedding_provider == "local":
        embedding_model = embeddings.LOCAL_MODEL
    if cls.__name__ in EMBEDDING_SCORERS:
        options.setdefault("model", embedding_model)
    elif "model" in parameters:
        options.setdefault("model", judge_target(evaluator, env)["model"])
    if "embedding_model" in parameters:
        options.setdefault("embedding_model", embedding_model)
    return options


def describe(score: Any, name: str) -> str:
    metadata = score.metadata if isinstance(score.metadata, dict) else {}
    rationale = metadata.get("rationale")
    choice = metadata.get("choice")
    if rationale:
        reason = str(rationale).strip()
        return f"{reason} (choice {choice})" if choice else reason
    if choice:
        return f"{name} chose {choice!r}"
    return f"{name} scored {score.score:.3f}"


def scorer_providers(evaluator: Evaluator, judge_config: dict[str, Any]) -> list[ProviderUse]:
    """The APIs the named scorer calls: the judge's, OpenAI embeddings, both or none."""
    name = evaluator.options.get("autoeval") or evaluator.options.get("scorer")
    if name in LOCAL_SCORERS:
        return []
    target = judge_settings(evaluator, judge_config)
    purpose = f"the autoevals evaluator {evaluator.name!r} ({name})"
    uses = []
    if name not in EMBEDDING_SCORERS:
        uses.append(
            ProviderUse(target["provider"], target["base_url"], target["api_key_env"], purpose)
        )
    embeds = name in EMBEDDING_SCORERS or name in JUDGE_AND_EMBEDDING_SCORERS
    if embeds and evaluator.options.get("embedding_provider", "openai") == "openai":
        base_url = target["base_url"] if target["provider"] == "openai" else None
        uses.append(ProviderUse("openai", base_url, target["api_key_env"], purpose))
    return uses


@register("autoevals", options=OPTIONS, providers=scorer_providers)
async def autoevals_evaluator(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    name = evaluator.options.get("autoeval") or evaluator.options.get("scorer")
    # The first import takes ~0.4 s: do it off the event loop, where other items are running.
    await asyncio.to_thread(_import_quietly, "autoevals")
    cls = scorer_class(name)
    embedding_provider = evaluator.options.get("embedding_provider", "openai")
    if embedding_provider not in embeddings.PROVIDERS:
        raise EvaluationError(
            f"`embedding_provider` must be one of {', '.join(embeddings.PROVIDERS)} "
            f"(got {embedding_provider!r})"
        )
    arguments = scorer_arguments(evaluator, target, name)
    with counted(name, told=(ProviderError, EvaluationError)) as usage:
        scorer = cls(**constructor_options(cls, evaluator, env, embedding_provider))
        result = await scorer.eval_async(**arguments)
    if result.score is None:
        raise usage.error(f"{name} returned no score (it skipped this item)")
    return EvalOutcome(
        evaluator.name,
        float(result.score),
        reason=describe(result, name),
        cached=usage.calls > 0 and usage.hits == usage.calls,
        tokens=usage.tokens,
        cost=usage.cost,
        unpriced_model=usage.unpriced,
        judge_call=library_call(f"autoevals' {name}", judge_target(evaluator, env), usage, ""),
    )
