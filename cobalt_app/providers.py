"""LLM provider calls through the official SDKs (their retries, timeouts and Retry-After).

The OpenAI SDK honours `OPENAI_BASE_URL`, the Anthropic SDK `ANTHROPIC_BASE_URL`; a `base_url`
in the judge configuration or on an evaluator points at any OpenAI-compatible server
(Ollama, vLLM, LM Studio). Keys come from the environment (or `judge.api_key`, which the
error for a missing key does not suggest: cobalt.toml is committed) and are never stored or
printed.

Parameters sent per model family (`chat_params`): the judge asks for `temperature: 0`, except
of OpenAI's reasoning models (`gpt-5*`, `o1`, `o3`, `o4*`), which refuse any temperature but
the default with HTTP 400, so none is sent to them; Anthropic calls also send `max_tokens`.
A provider's error message is kept (with secrets removed) in every `ProviderError`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from cobalt.errors import CobaltError
from cobalt.run_settings import RUN_DEFAULTS
from cobalt_app.storable import redacted

DEFAULT_KEY_VARS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
KNOWN_PROVIDERS = tuple(DEFAULT_KEY_VARS)


class ProviderError(CobaltError):
    """A provider call failed; the message is safe to show and store."""

    http_status = 502  # the model provider refused or failed, not the request


class MissingApiKey(ProviderError):
    pass


@dataclass(frozen=True)
class ChatReply:
    text: str
    input_tokens: int
    output_tokens: int
    model: str


@dataclass(frozen=True)
class Embeddings:
    vectors: list[list[float]]
    input_tokens: int
    model: str


SDK_MODULES = {"openai": "openai", "anthropic": "anthropic"}


def import_sdk(provider: str) -> None:
    """Import a provider's SDK ahead of use, with its API resources, which a client imports
    on first use (`client.chat`: ~0.2 s for openai). Unknown providers are reported when
    called."""
    import importlib

    module = SDK_MODULES.get(provider)
    if module:
        importlib.import_module(module)
        importlib.import_module(f"{module}.resources")


def resolve_api_key(
    provider: str,
    *,
    judge_config: dict[str, Any],
    api_key_env: str | None = None,
    base_url: str | None = None,
    purpose: str = "the llm-judge",
) -> str:
    if provider not in KNOWN_PROVIDERS:
        raise ProviderError(
            f"unknown provider {provider!r}; use one of {', '.join(KNOWN_PROVIDERS)}"
        )
    variable = api_key_env or DEFAULT_KEY_VARS[provider]
    key = os.environ.get(variable)
    configured = judge_config.get("provider", RUN_DEFAULTS.judge.provider)
    if not key and not api_key_env and configured == provider:
        key = judge_config.get("api_key")
    if not key and base_url and provider == "openai":
        return "not-needed"  # local OpenAI-compatible servers usually take no key
    if not key:
        raise MissingApiKey(
            f"{variable} is not set: {purpose} calls the {provider} API. "
            f"Set {variable} in your environment (`export {variable}=...`, or a CI secret), "
            "not in cobalt.toml: it is committed."
        )
    return key


class ProviderHub:
    """The SDK clients of one event loop, one per (provider, base URL, key)."""

    def __init__(self, judge_config: dict[str, Any], limiter: Any = None) -> None:
        self.judge_config = judge_config
        self.limiter = limiter  # a ratelimit.RateLimiter when `rate_limits` is configured
        self._clients: dict[tuple[str, str | None, str], Any] = {}

    def client(self, provider: str, *, base_url: str | None, api_key: str) -> Any:
        cache_key = (provider, base_url, api_key)
        client = self._clients.get(cache_key)
        if client is None:
            options = {
                "api_key": api_key,
                "base_url": base_url or None,
                "max_retries": 0 if self._budgeted(provider) else self._retries,
                "timeout": float(self.judge_config.get("timeout", RUN_DEFAULTS.judge.timeout)),
            }
            if provider == "anthropic":
                import anthropic

                client = anthropic.AsyncAnthropic(**options)
            else:
                import openai

                client = openai.AsyncOpenAI(**options)
            self._clients[cache_key] = client
        return client

    async def chat(
        self,
        *,
        provider: str,
        model: str,
        system: str,
        user: str,
        base_url: str | None = None,
        api_key_env: str | None = None,
        params: dict[str, Any] | None = None,
        purpose: str = "the llm-judge",
        messages: list[dict[str, str]] | None = None,
    ) -> ChatReply:
        """One chat call: `system` and `user`, or `system` and a whole `messages` list."""
        turns = messages if messages is not None else [{"role": "user", "content": user}]
        key = resolve_api_key(
            provider,
            judge_config=self.judge_config,
            api_key_env=api_key_env,
            base_url=base_url,
            purpose=purpose,
        )
        client = self.client(provider, base_url=base_url, api_key=key)
        params = chat_params(provider, model, params or {})
        try:
            if provider == "anthropic":
                max_tokens = int(params.pop("max_tokens", 1024))
                response = await self.send(
                    provider,
                    key,
                    client.messages.create,
                    model=model,
                    system=system,
                    messages=turns,
                    max_tokens=max_tokens,
                    **supported_params(client.messages.create, params),
                )
                text = "".join(
                    getattr(block, "text", "") for block in response.content if block.type == "text"
                )
                usage = response.usage
                return ChatReply(text, usage.input_tokens or 0, usage.output_tokens or 0, model)
            # The SDK's request path (auth, retries, timeouts, base URL) without its typed
            # parameters and response models: a third of its CPU per call, which a worker
            # making thousands of judge calls spends on one core.
            body = await self.send(
                provider,
                key,
                client.post,
                path="/chat/completions",
                cast_to=str,
                body={
                    "model": model,
                    "messages": [{"role": "system", "content": system}, *turns],
                    **params,
                },
            )
        except Exception as exc:
            raise ProviderError(describe_sdk_error(provider, exc, secrets=(key,))) from exc
        return chat_reply(body, model)

    async def embed(
        self,
        texts: list[str],
        *,
        model: str,
        base_url: str | None = None,
        api_key_env: str | None = None,
    ) -> Embeddings:
        key = resolve_api_key(
            "openai",
            judge_config=self.judge_config,
            api_key_env=api_key_env,
            base_url=base_url,
            purpose="the similarity evaluator",
        )
        client = self.client("openai", base_url=base_url, api_key=key)
        try:
            response = await self.send(
                "openai", key, client.embeddings.create, model=model, input=texts
            )
        except Exception as exc:
            raise ProviderError(describe_sdk_error("openai", exc, secrets=(key,))) from exc
        vectors = [list(d.embedding) for d in sorted(response.data, key=lambda d: d.index)]
        tokens = response.usage.prompt_tokens if response.usage else 0
        return Embeddings(vectors, tokens or 0, model)

    @property
    def _retries(self) -> int:
        return int(self.judge_config.get("max_retries", RUN_DEFAULTS.judge.max_retries))

    def _budgeted(self, provider: str) -> bool:
        return self.limiter is not None and self.limiter.covers(provider)

    async def send(self, provider: str, key: str, create: Any, **kwargs: Any) -> Any:
        """One SDK request (`create(**kwargs)`), the way every provider call of Cobalt goes:
        within the shared rate budget (and its retries) when one is configured."""
        if not self._budgeted(provider):
            return await create(**kwargs)
        from cobalt_app.ratelimit import call_with_budget

        return await call_with_budget(
            self.limiter, provider, key, lambda: create(**kwargs), retries=self._retries
        )

    async def aclose(self) -> None:
        for client in self._clients.values():
            with contextlib.suppress(Exception):  # closing is best effort
                await client.close()
        self._clients.clear()


def chat_reply(body: str, model: str) -> ChatReply:
    """An OpenAI chat completion (the JSON text of the reply) as a `ChatReply`."""
    try:
        completion = json.loads(body)
        text = completion["choices"][0]["message"].get("content") or ""
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise ProviderError(
            f"openai: the reply is not a chat completion (model {model}): {body[:200]!r}"
        ) from None
    usage = completion.get("usage") or {}
    return ChatReply(
        text, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0), model
    )


def supported_params(method: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters a SDK method accepts (newer SDKs dropped e.g. Anthropic's temperature)."""
    import inspect

    accepted = inspect.signature(method).parameters
    return {k: v for k, v in params.items() if k in accepted}


REASONING_MODEL = re.compile(r"^(gpt-5|o[1-9])(?![a-z])")
# Parameters OpenAI's reasoning models refuse unless they hold the default value.
REASONING_UNSUPPORTED = ("temperature", "top_p", "presence_penalty", "frequency_penalty")


def is_reasoning_model(model: str | None) -> bool:
    """OpenAI's reasoning models: `gpt-5*`, `o1`, `o3`, `o4-mini`… (dated snapshots too)."""
    return bool(model) and bool(REASONING_MODEL.match(str(model).lower().split("/")[-1]))


def chat_params(provider: str, model: str | None, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters this model accepts: none of REASONING_UNSUPPORTED for OpenAI's reasoning
    models, which answer HTTP 400 to a non-default temperature."""
    params = dict(params)
    if provider == "openai" and is_reasoning_model(model):
        for name in REASONING_UNSUPPORTED:
            params.pop(name, None)
    return params


def provider_message(exc: Exception) -> str:
    """The message a provider put in its error body (OpenAI or Anthropic shape), else ''."""
    body = getattr(exc, "body", None)
    for _ in range(3):  # {"error": {"message": ...}} or {"message": ...}
        if isinstance(body, dict) and isinstance(body.get("message"), str):
            return body["message"]
        body = body.get("error") if isinstance(body, dict) else None
    if isinstance(body, str):
        return body
    return ""


def describe_sdk_error(provider: str, exc: Exception, *, secrets: tuple[str, ...] = ()) -> str:
    """One line naming the provider, the status and the provider's own message (redacted)."""
    status = getattr(exc, "status_code", None)
    name = type(exc).__name__
    message = " ".join(provider_message(exc).split())
    if len(message) > 300:
        message = message[:297] + "..."
    said = f": {redacted(message, secrets=secrets).rstrip('.')}" if message else ""
    if status == 401:
        return (
            f"{provider}: the API key was refused (401){said}. Check {DEFAULT_KEY_VARS[provider]}."
        )
    if status == 429:
        return f"{provider}: rate limited (429) after the SDK's retries{said}; lower concurrency."
    if status is not None:
        return f"{provider}: HTTP {status} ({name}){said}."
    message = str(exc).splitlines()[0] if str(exc) else name
    return f"{provider}: {name}: {redacted(message, secrets=secrets)}"
