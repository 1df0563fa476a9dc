"""Variants: one experiment run as several, over the same items (a *sweep*).

`experiment(..., variants={"model": ["a", "b"], "temperature": [0, 0.7]})` declares a grid
(every combination) and `variants=[{"model": "a"}, {"model": "b", "temperature": 0}]` an
explicit list. `declare()` checks either and gives the `Variant`s; `expand()` turns the
experiment into one ordinary experiment per variant, named `name [label]`, whose runner
receives `ctx.variant`. Loaders expand where they collect an experiment (`discovery`), so
`cobalt run`, workers, `--resume` and re-judge all find a variant's run by its name.

`select()` is `cobalt run --variants model=a`: the variants whose values match every
`key=value` given.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cobalt.experiments import Experiment

LABEL_VALUE_MAX = 24  # longer values (a whole prompt) are labelled by their position: prompt#2


@dataclass(frozen=True)
class Variant:
    """One combination: its values by key, and its short label (`model=a prompt#2`)."""

    values: dict[str, Any]
    label: str


def value_text(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def _is_short(value: Any) -> bool:
    text = value_text(value)
    plain = isinstance(value, str | int | float | bool) or value is None
    return plain and len(text) <= LABEL_VALUE_MAX and "\n" not in text and "[" not in text


def _label_part(key: str, value: Any, position: int, by_value: bool) -> str:
    """`key=value` when every value of the key is short, else `key#position` (1-based)."""
    return f"{key}={value_text(value)}" if by_value else f"{key}#{position + 1}"


def declare(experiment: str, given: Any) -> list[Variant]:
    """The variants of a grid (dict of key → list of values) or of an explicit list of dicts;
    ValueError/TypeError saying what to pass for an empty or malformed declaration."""
    if isinstance(given, Mapping):
        return _grid(experiment, given)
    if isinstance(given, list | tuple):
        return _explicit(experiment, list(given))
    raise TypeError(
        f"experiment {experiment!r}: `variants` must be a grid such as "
        '{"model": ["a", "b"], "temperature": [0, 0.7]} or a list of dicts such as '
        f'[{{"model": "a"}}, {{"model": "b"}}], not {type(given).__name__}.'
    )


def _grid(experiment: str, grid: Mapping[str, Any]) -> list[Variant]:
    if not grid:
        raise ValueError(
            f"experiment {experiment!r}: `variants` is an empty grid; give each key a list of "
            'values, e.g. variants={"model": ["gpt-4o-mini", "claude-haiku-4-5"]}.'
        )
    keys = list(grid)
    for key in keys:
        values = grid[key]
        if not isinstance(key, str) or not key:
            raise TypeError(f"experiment {experiment!r}: variant keys must be non-empty strings.")
        if not isinstance(values, list | tuple) or not values:
            raise ValueError(
                f"experiment {experiment!r}: variants[{key!r}] must be a non-empty list of "
                f"values (got {values!r})."
            )
    by_value = {k: all(_is_short(v) for v in grid[k]) for k in keys}
    variants = []
    for positions in itertools.product(*(range(len(grid[k])) for k in keys)):
        values = {k: grid[k][p] for k, p in zip(keys, positions, strict=True)}
        label = " ".join(
            _label_part(k, values[k], p, by_value[k]) for k, p in zip(keys, positions, strict=True)
        )
        variants.append(Variant(values, label))
    return variants


def _explicit(experiment: str, given: list[Any]) -> list[Variant]:
    if not given:
        raise ValueError(
            f"experiment {experiment!r}: `variants` is an empty list; give at least one dict "
            'such as {"model": "gpt-4o-mini"}.'
        )
    positions: dict[str, list[str]] = {}
    for index, values in enumerate(given):
        if not isinstance(values, Mapping) or not values:
            raise ValueError(
                f"experiment {experiment!r}: variants[{index}] must be a non-empty dict of "
                f"values such as {{'model': 'a'}} (got {values!r})."
            )
        for key, value in values.items():
            seen = positions.setdefault(key, [])
            if value_text(value) not in seen:
                seen.append(value_text(value))
    by_value = {
        key: all(_is_short(v) for values in given for k, v in values.items() if k == key)
        for key in positions
    }
    variants = []
    for values in given:
        parts = [
            _label_part(k, v, positions[k].index(value_text(v)), by_value[k])
            for k, v in values.items()
        ]
        variants.append(Variant(dict(values), " ".join(parts)))
    labels = [v.label for v in variants]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ValueError(f"experiment {experiment!r}: variants declared twice: {twice}.")
    return variants


def parse_selection(specs: Iterable[str]) -> dict[str, list[str]]:
    """`--variants model=a --variants model=b,prompt=#1`: key → accepted values (`#N`: the
    N-th value of a key whose values are too long for a label)."""
    wanted: dict[str, list[str]] = {}
    for spec in specs:
        for part in spec.split(","):
            key, sep, value = part.strip().partition("=")
            if not sep or not key.strip():
                raise ValueError(
                    f"--variants {spec!r}: write key=value (e.g. --variants model=gpt-4o-mini)."
                )
            wanted.setdefault(key.strip(), []).append(value.strip())
    return wanted


def select(variants: list[Variant], wanted: Mapping[str, list[str]]) -> list[Variant]:
    """The variants whose value of each key given is one of the values given for it."""
    if not wanted:
        return variants
    return [v for v in variants if all(_has(v, k, texts) for k, texts in wanted.items())]


def _has(variant: Variant, key: str, texts: list[str]) -> bool:
    """The variant's value of `key` is one of `texts`, or its label says `key#N` for `#N`."""
    if key not in variant.values:
        return False
    parts = variant.label.split(" ")
    return any(value_text(variant.values[key]) == t or f"{key}{t}" in parts for t in texts)


def variant_name(base: str, label: str) -> str:
    return f"{base} [{label}]"


def _with_variant(runner: Callable[..., Any], values: dict[str, Any]) -> Callable[..., Any]:
    """The runner, given `ctx.variant` (a copy of the context: the engine's is untouched)."""
    if inspect.iscoroutinefunction(runner):

        @functools.wraps(runner)
        async def run_async(ctx: Any) -> Any:
            return await runner(dataclasses.replace(ctx, variant=values))

        return run_async

    @functools.wraps(runner)
    def run(ctx: Any) -> Any:
        return runner(dataclasses.replace(ctx, variant=values))

    return run


def expand(experiment: Experiment) -> list[Experiment]:
    """One experiment per declared variant (the experiment itself when it declares none)."""
    if not experiment.variants:
        return [experiment]
    return [
        dataclasses.replace(
            experiment,
            name=variant_name(experiment.name, variant.label),
            runner=_with_variant(experiment.runner, variant.values),
            variants=[],
            variant=variant,
            sweep_of=experiment.name,
        )
        for variant in experiment.variants
    ]


def expand_all(experiments: Iterable[Experiment]) -> list[Experiment]:
    return [child for experiment in experiments for child in expand(experiment)]


def default_label(variants: list[Variant], default: Mapping[str, Any] | None) -> str | None:
    """The default variant's label: the first one matching `default_variant`, else the first
    declared."""
    if not variants:
        return None
    if default:
        for variant in variants:
            if all(k in variant.values and variant.values[k] == v for k, v in default.items()):
                return variant.label
    return variants[0].label
