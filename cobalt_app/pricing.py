"""Estimated cost of tokens, per model (USD per million tokens: input, output).

An estimate, not a bill: prices change. A model is priced by its name, or by a dated or
`-latest` snapshot of a listed name (`gpt-4o-2024-08-06`, `claude-sonnet-4-5-20250929`); a
project adds or overrides prices under `[prices]` in its configuration. A model with no price
counts 0 and is reported as *unpriced* (summary, run page, results file), never silently free.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from cobalt.config import active_config
from cobalt.usage_notes import NO_MODEL

PRICES_PER_MILLION: dict[str, tuple[float, float]] = {
    # OpenAI
    "gpt-4o": (2.50, 10.00),
    "chatgpt-4o-latest": (5.00, 15.00),
    "gpt-4": (30.00, 60.00),
    "gpt-4-32k": (60.00, 120.00),
    "gpt-4-1106-preview": (10.00, 30.00),
    "gpt-4-0125-preview": (10.00, 30.00),
    "gpt-5.1": (1.25, 10.00),
    "gpt-5-pro": (15.00, 120.00),
    "o1": (15.00, 60.00),
    "o1-mini": (1.10, 4.40),
    "o1-pro": (150.00, 600.00),
    "o3-pro": (20.00, 80.00),
    "text-embedding-ada-002": (0.10, 0.0),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-5": (1.25, 10.00),
    "gpt-5-mini": (0.25, 2.00),
    "gpt-5-nano": (0.05, 0.40),
    "o3": (2.00, 8.00),
    "o3-mini": (1.10, 4.40),
    "o4-mini": (1.10, 4.40),
    "gpt-4-turbo": (10.00, 30.00),
    "gpt-3.5-turbo": (0.50, 1.50),
    "text-embedding-3-small": (0.02, 0.0),
    "text-embedding-3-large": (0.13, 0.0),
    # Anthropic
    "claude-opus-4": (15.00, 75.00),
    "claude-opus-4-0": (15.00, 75.00),
    "claude-opus-4-1": (15.00, 75.00),
    "claude-opus-4-5": (5.00, 25.00),
    "claude-opus-4-6": (5.00, 25.00),
    "claude-sonnet-4-0": (3.00, 15.00),
    "claude-3-opus": (15.00, 75.00),
    "claude-3-sonnet": (3.00, 15.00),
    "claude-sonnet-4": (3.00, 15.00),
    "claude-sonnet-4-5": (3.00, 15.00),
    "claude-haiku-4-5": (1.00, 5.00),
    "claude-3-7-sonnet": (3.00, 15.00),
    "claude-3-5-sonnet": (3.00, 15.00),
    "claude-3-5-haiku": (0.80, 4.00),
    "claude-3-haiku": (0.25, 1.25),
}


# What may follow a listed name in a snapshot's name: a date or version (`-2024-08-06`,
# `@20241022`, `-v2@20241022`, `:0`), `-latest` or `-preview`.
SNAPSHOT_SUFFIX = re.compile(r"[-@:](?:\d[\w.:@-]*|v\d[\w.:@-]*|latest|preview)$")
# A platform's prefix before the model's own name: `openai/`, `anthropic.`, `us.anthropic.`.
PLATFORM_PREFIX = re.compile(r"^(?:.*/)?(?:(?:[a-z]{2}\.)?(?:anthropic|openai)\.)?")


def price_of(model: str | None) -> tuple[float, float] | None:
    """Prices for a model name (the project's `[prices]` first), matching snapshots of a listed
    name (`gpt-4o-2024-08-06`); None when the model has no price."""
    if not model:
        return None
    try:
        given = active_config().get("prices") or {}
    except Exception:  # noqa: BLE001 - a broken configuration is reported by the run itself
        given = {}
    return _price_in(str(model), repr(given) if given else "")


@functools.lru_cache(maxsize=4096)
def _price_in(model: str, prices: str) -> Any:
    """`price_of` for a model and the project's `[prices]` (their repr, "" for none),
    remembered: every model call of a trace is priced (the OTLP receiver prices thousands a
    second), and a project calls a handful of models."""
    name = PLATFORM_PREFIX.sub("", model.lower(), count=1)
    table = {**PRICES_PER_MILLION, **(configured_prices() if prices else {})}
    if name in table:
        return table[name]
    snapshots = [k for k in table if name.startswith(k) and SNAPSHOT_SUFFIX.match(name[len(k) :])]
    best = max(snapshots, key=len, default=None)
    return table[best] if best else None


def configured_prices() -> dict[str, tuple[float, float]]:
    """`[prices]` of the active configuration: model = [input, output] USD per million."""
    try:
        prices = active_config().get("prices") or {}
    except Exception:  # noqa: BLE001 - a broken configuration is reported by the run itself
        return {}
    return {str(k).lower(): parse_price(v) for k, v in prices.items()}


def parse_price(value: Any) -> tuple[float, float]:
    """`[2.5, 10]` or `{input = 2.5, output = 10}` (USD per million tokens)."""
    if isinstance(value, dict):
        value = [value.get("input"), value.get("output", 0.0)]
    return float(value[0]), float(value[1])


def estimate_cost(model: str | None, input_tokens: int, output_tokens: int) -> float:
    prices = price_of(model)
    if prices is None:
        return 0.0
    return (input_tokens * prices[0] + output_tokens * prices[1]) / 1_000_000


def unpriced(model: str | None, tokens: int) -> str:
    """The model's name when it spent tokens and has no price (NO_MODEL when the tokens came
    without a model), else ''."""
    if tokens <= 0 or price_of(model) is not None:
        return ""
    return str(model) if model else NO_MODEL


INPUT_KEYS = ("input_tokens", "prompt_tokens", "input")
OUTPUT_KEYS = ("output_tokens", "completion_tokens", "output")
TOTAL_KEYS = ("total_tokens", "total")
ACCEPTED_USAGE = (
    '`tokens` as a number (the total) or as {"input": n, "output": m}; `usage` or `tokens` '
    "in OpenAI (prompt_tokens/completion_tokens) or Anthropic (input_tokens/output_tokens) shape"
)


def agent_usage(metadata: dict[str, Any]) -> tuple[int, int, int]:
    """(input, output, total) tokens the runner reported in its metadata, in any common shape."""
    input_tokens, output_tokens, total, _ = read_usage(metadata)
    return input_tokens, output_tokens, total


def usage_problem(metadata: dict[str, Any]) -> str | None:
    """Why the token usage in this metadata cannot be read, or None (also when there is none)."""
    return read_usage(metadata)[3]


def read_usage(metadata: dict[str, Any]) -> tuple[int, int, int, str | None]:
    """(input, output, total, problem): the shapes of ACCEPTED_USAGE, or a problem naming the
    field that holds something else (a negative, NaN or text count, an unknown key)."""
    problem = None
    sources: list[dict[str, Any]] = [metadata]
    for field in ("usage", "tokens"):
        value = metadata.get(field)
        if value is None or (field == "tokens" and _count(value) is not None):
            continue
        if isinstance(value, dict) and any(
            _count(value.get(k)) is not None for k in (*INPUT_KEYS, *OUTPUT_KEYS, *TOTAL_KEYS)
        ):
            sources.insert(0, value)
        elif problem is None:
            problem = f"metadata.{field} = {_shown(value)}"
    input_tokens = _first(sources, INPUT_KEYS)
    output_tokens = _first(sources, OUTPUT_KEYS)
    total = _count(metadata.get("tokens")) or _first(sources, TOTAL_KEYS)
    if not total:
        total = input_tokens + output_tokens
    return input_tokens, output_tokens, total, problem


def _first(sources: list[dict[str, Any]], keys: tuple[str, ...]) -> int:
    for source in sources:
        for key in keys:
            if key in ("input", "output", "total") and source is sources[-1]:
                continue  # bare `input`/`output` at the top of metadata are not token counts
            count = _count(source.get(key))
            if count is not None:
                return count
    return 0


def _count(value: Any) -> int | None:
    """A token count: a non-negative finite number (bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if value != value or value in (float("inf"), float("-inf")) or value < 0:
        return None
    return int(value)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def agent_unpriced(model: Any, reported_cost: Any, tokens: int) -> str:
    """The agent's unpriced model, from its metadata's `model` and `cost` and its token count
    ('' when priced, free of tokens or costed by the runner itself)."""
    if isinstance(reported_cost, int | float) and not isinstance(reported_cost, bool):
        return ""
    return unpriced(model if isinstance(model, str) else None, tokens)


def agent_cost(metadata: dict[str, Any]) -> float:
    """The runner's own `cost` if it reported one, else an estimate from its model and tokens."""
    reported = metadata.get("cost")
    if isinstance(reported, int | float) and not isinstance(reported, bool):
        return float(reported)
    input_tokens, output_tokens, total = agent_usage(metadata)
    if not input_tokens and not output_tokens:
        input_tokens = total
    return estimate_cost(metadata.get("model"), input_tokens, output_tokens)
