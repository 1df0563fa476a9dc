"""Tokens of a model call that reported no usage, counted from its request and response text.

A streamed OpenAI call without `stream_options={"include_usage": True}` (LlamaIndex's default
agent streams so) reports no usage; left at 0 tokens, it would cost $0 and the run's cost
would read complete. Its span still holds the messages sent and the text received, so:

- an OpenAI model's text is counted with tiktoken, when its encoding can be read without the
  network: tiktoken downloads encodings on first use, and Cobalt never does; it reads them
  from tiktoken's cache (`TIKTOKEN_CACHE_DIR`, `DATA_GYM_CACHE_DIR`, or the temporary
  folder's `data-gym-cache`), or from the copy LlamaIndex or LiteLLM ship (`BUNDLED_CACHES`);
  the step says `tokensEstimated: "tiktoken"` (exact for the text, without the few tokens of
  the chat format);
- any other model's text, or an OpenAI model's whose encoding is not on this machine, is
  estimated at CHARS_PER_TOKEN characters a token: `tokensEstimated: "chars"`;
- a call without any text to count (its content not captured) has unknown tokens:
  `tokensEstimated: "unknown"`, and the run's cost says "unknown" rather than $0.

The run summary names the estimated calls (`estimatedUsage`) and its cost is then not
complete (`costComplete: false`), see `run_summary.compute_summary`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import math
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, NamedTuple

CHARS_PER_TOKEN = 4  # OpenAI's rule of thumb for English text
MESSAGE_OVERHEAD = 3  # tokens the chat format adds per message (OpenAI's cookbook)
TIKTOKEN, CHARS, UNKNOWN = "tiktoken", "chars", "unknown"
ENCODING_URL = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
# Frameworks that ship tiktoken's cache files, and where (inside the package).
BUNDLED_CACHES = (
    ("llama_index.core", "_static/tiktoken_cache"),
    ("litellm", "litellm_core_utils/tokenizers"),
)
# The keys of OpenInference's message attributes whose values are text the model read or wrote.
_TEXT_KEYS = (".message.content", ".message_content.text", ".function.arguments", ".function.name")
_env_lock = threading.Lock()


class Counted(NamedTuple):
    input_tokens: int | None
    output_tokens: int | None
    method: str  # TIKTOKEN, CHARS or UNKNOWN


def count_without_usage(model: str | None, attributes: Any) -> Counted:
    """The tokens of a model call's span that reported none."""
    sent, sent_messages = span_text(attributes, "input")
    received, received_messages = span_text(attributes, "output")
    if not sent and not received:
        return Counted(None, None, UNKNOWN)
    encoding = encoding_for(model)
    if encoding is not None:
        return Counted(
            _tokens(encoding, sent) + MESSAGE_OVERHEAD * sent_messages,
            _tokens(encoding, received),
            TIKTOKEN,
        )
    return Counted(
        math.ceil(len(sent) / CHARS_PER_TOKEN), math.ceil(len(received) / CHARS_PER_TOKEN), CHARS
    )


def _tokens(encoding: Any, text: str) -> int:
    return len(encoding.encode(text, disallowed_special=())) if text else 0


def unanswered(failed: bool, attributes: Any) -> bool:
    """A call that failed without receiving anything spent no tokens: a provider bills none
    for an error, and `--replay` refused it unsent. None are estimated for it."""
    return failed and not span_text(attributes, "output")[0]


def span_text(attributes: Any, side: str) -> tuple[str, int]:
    """(the text of a span's `input` or `output` messages, how many messages): OpenInference's
    `llm.{side}_messages.*` (contents, tool calls' names and arguments), else the GenAI
    conventions' messages, else the raw `{side}.value`."""
    prefix = f"llm.{side}_messages."
    parts, messages = [], set()
    for key, value in attributes.items():
        if key.startswith(prefix) and isinstance(value, str) and key.endswith(_TEXT_KEYS):
            parts.append(value)
            messages.add(key[len(prefix) :].split(".", 1)[0])
    if parts:
        return "\n".join(parts), len(messages)
    genai = "gen_ai.input.messages" if side == "input" else "gen_ai.output.messages"
    for key in (genai, f"{side}.value"):
        value = attributes.get(key)
        if isinstance(value, str) and value.strip():
            return value, 1
    return "", 0


def _encoding_name(model: str) -> str | None:
    try:
        import tiktoken
    except ImportError:
        return None
    try:
        return tiktoken.encoding_name_for_model(model.split("/")[-1])
    except KeyError:
        return None


def encoding_for(model: str | None) -> Any:
    """tiktoken's encoding of an OpenAI model, read from a cache on this machine; None for
    another model, or when the encoding's file is nowhere here (never downloaded)."""
    name = _encoding_name(model) if model else None
    return _encoding(name) if name else None


@functools.cache
def _encoding(name: str) -> Any:
    import tiktoken

    folder = cache_folder(name)
    if folder is None:
        return None
    with _env_lock:  # tiktoken reads its cache folder from the environment, at the call
        before = os.environ.get("TIKTOKEN_CACHE_DIR")
        os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
        try:
            return tiktoken.get_encoding(name)
        except Exception:  # a damaged cache file: tiktoken would download it again
            return None
        finally:
            if before is None:
                os.environ.pop("TIKTOKEN_CACHE_DIR", None)
            else:
                os.environ["TIKTOKEN_CACHE_DIR"] = before


def cache_folder(name: str) -> Path | None:
    """The first folder holding tiktoken's cached file of encoding `name`."""
    key = hashlib.sha1(ENCODING_URL.format(name=name).encode()).hexdigest()
    folders = [os.environ.get("TIKTOKEN_CACHE_DIR"), os.environ.get("DATA_GYM_CACHE_DIR")]
    folders.append(os.path.join(tempfile.gettempdir(), "data-gym-cache"))
    for package, inside in BUNDLED_CACHES:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.submodule_search_locations:
            folders.append(os.path.join(list(spec.submodule_search_locations)[0], inside))
    for folder in folders:
        if folder and (Path(folder) / key).is_file():
            return Path(folder)
    return None
