"""Tool results measured in tokens, and fitted into the client's budget.

Claude Code refuses a tool result over 25,000 tokens by default, so every result is kept
under `[mcp] result_tokens` (20,000 by default). What does not fit is left out in a way the
result describes, never silently: long fields are shortened first, then whole items are left
out, and the result names what is missing and the call that fetches it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

# Characters kept of any one string, tried in this order until what must fit, fits.
FIELD_LIMITS = (2_000, 600, 200, 80)
LIST_ELEMENTS = 50  # elements kept of a list inside an item, at the longest field limit


def estimate_tokens(text: str) -> int:
    """Tokens a model will count for `text`, erring on the high side: one per three bytes of
    UTF-8 (English prose runs about four characters a token, JSON about three, and other
    scripts about one a character, which their two or three bytes keep on the safe side)."""
    return -(-len(text.encode("utf-8")) // 3)


def compact(value: Any) -> str:
    """The JSON the protocol sends for `value` (compact, as the SDK serialises it)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def value_tokens(value: Any) -> int:
    return estimate_tokens(compact(value))


def shorten(value: Any, limit: int, notes: list[str], path: str = "") -> Any:
    """`value` with strings cut to `limit` characters and lists to a share of it; each cut
    is described in `notes` (by its path in the value). Types are kept: a list of objects
    stays a list of objects."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        notes.append(f"{path or 'value'}: {len(value):,} characters, the first {limit:,} kept")
        return value[:limit] + "…"
    if isinstance(value, dict):
        return {
            key: shorten(inner, limit, notes, f"{path}.{key}" if path else str(key))
            for key, inner in value.items()
        }
    if isinstance(value, list):
        keep = max(5, LIST_ELEMENTS * limit // FIELD_LIMITS[0])
        if len(value) > keep:
            notes.append(f"{path or 'value'}: {len(value):,} elements, the first {keep} kept")
        return [
            shorten(inner, limit, notes, f"{path}[{i}]") for i, inner in enumerate(value[:keep])
        ]
    return value


def shortened(entry: dict[str, Any], limit: int) -> dict[str, Any]:
    """An item with its long fields shortened; `shortened` lists what was cut."""
    notes: list[str] = []
    shaped = shorten(entry, limit, notes)
    if notes:
        shaped["shortened"] = notes
    return shaped


@dataclass
class Fitted:
    """The items kept, at which field limit, and how many were left out."""

    items: list[dict[str, Any]] = field(default_factory=list)
    limit: int = FIELD_LIMITS[0]
    kept_first: int = 0  # of the `first` items (e.g. the failing ones)
    kept_rest: int = 0
    tokens: int = 0


def fit(
    first: list[dict[str, Any]],
    rest: Iterable[dict[str, Any]],
    tokens: int,
    *,
    shape: Callable[[dict[str, Any], int], dict[str, Any]] = shortened,
) -> Fitted:
    """Keep every item of `first` if their fields can be shortened enough to fit in `tokens`
    (else as many as fit, in order), then items of `rest`, in order, while they fit."""
    fitted = Fitted()
    for limit in FIELD_LIMITS:
        shaped = [shape(entry, limit) for entry in first]
        costs = [value_tokens(entry) + 1 for entry in shaped]
        fitted = Fitted(limit=limit)
        if sum(costs) <= tokens or limit == FIELD_LIMITS[-1]:
            break
    for entry, cost in zip(shaped, costs, strict=True):
        if fitted.tokens + cost > tokens:
            break
        fitted.items.append(entry)
        fitted.tokens += cost
        fitted.kept_first += 1
    if fitted.kept_first < len(first):
        return fitted
    for entry in rest:
        item = shape(entry, fitted.limit)
        cost = value_tokens(item) + 1
        if fitted.tokens + cost > tokens:
            break
        fitted.items.append(item)
        fitted.tokens += cost
        fitted.kept_rest += 1
    return fitted
