"""Quick deterministic evaluators: no model, no key, no cost.

`contains` / `not-contains` (`value=` a string or a list of strings, or `field=` to take it
from the item; `case_sensitive=False` to ignore case), `regex` (`pattern=`, search semantics,
`flags="ims"`), `json-valid`, `json-schema` (`schema=` a dict), `levenshtein` (normalised edit
similarity to `field`, default `expected_output`; with `threshold=` it scores 1/0), `latency`
(`max_ms=`) and `cost` (`max_usd=`) budgets per item.

An empty output, an empty or missing expected value and a missing option are evaluation errors
with a reason, never a score of 0.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from cobalt.evaluator import Evaluator
from cobalt_app.evaluators.base import EvalOutcome, EvalTarget, EvaluationError, register
from cobalt_app.evaluators.basic import field_value, output_text
from cobalt_app.pricing import agent_usage, price_of

NEEDLE_OPTIONS = ("value", "field", "case_sensitive")
REGEX_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE}


def shorten(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def nonempty_output(target: EvalTarget) -> str:
    """The output as text; an empty output is an evaluation error (there is nothing to check)."""
    if target.output is None:
        raise EvaluationError("the output is empty (None): the runner returned nothing to check")
    text = output_text(target.output)
    if not text.strip():
        raise EvaluationError("the output is empty: there is nothing to check")
    return text


def option(evaluator: Evaluator, name: str, example: str) -> Any:
    if evaluator.options.get(name) is None:
        raise EvaluationError(
            f"the {evaluator.type} evaluator needs `{name}=` (for example {example})"
        )
    return evaluator.options[name]


def number_option(evaluator: Evaluator, name: str, example: str) -> float:
    value = option(evaluator, name, example)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise EvaluationError(f"`{name}` must be a number of at least 0 (got {value!r})")
    return float(value)


def case_sensitive(evaluator: Evaluator) -> bool:
    value = evaluator.options.get("case_sensitive", True)
    if not isinstance(value, bool):
        raise EvaluationError(f"`case_sensitive` must be True or False (got {value!r})")
    return value


# ---------------------------------------------------------------------- contains


def needles(evaluator: Evaluator, target: EvalTarget) -> list[str]:
    """The strings to look for: `value=` (str or list), else the item's `field`."""
    if evaluator.options.get("value") is not None:
        raw, where = evaluator.options["value"], "`value`"
    elif evaluator.field:
        raw, where = (
            field_value(evaluator, target, evaluator.field),
            f"the item's {evaluator.field!r}",
        )
    else:
        raise EvaluationError(
            f'the {evaluator.type} evaluator needs `value="text"` (or a list) or `field="name"` '
            "to take the text from the item"
        )
    values = raw if isinstance(raw, list) else [raw]
    if not values:
        raise EvaluationError(f"{where} is an empty list: there is nothing to look for")
    texts = []
    for value in values:
        text = value if isinstance(value, str) else output_text(value)
        if value is None or not text.strip():
            raise EvaluationError(f"{where} is empty: there is nothing to look for")
        texts.append(text)
    return texts


def found(needle: str, haystack: str, sensitive: bool) -> bool:
    return needle in haystack if sensitive else needle.casefold() in haystack.casefold()


@register("contains", options=NEEDLE_OPTIONS, calls_nothing=True)
async def contains(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    text, sensitive = nonempty_output(target), case_sensitive(evaluator)
    wanted = needles(evaluator, target)
    missing = [n for n in wanted if not found(n, text, sensitive)]
    if missing:
        shown = ", ".join(repr(shorten(m)) for m in missing)
        return EvalOutcome(evaluator.name, 0.0, reason=f"the output does not contain {shown}")
    shown = ", ".join(repr(shorten(n)) for n in wanted)
    return EvalOutcome(evaluator.name, 1.0, reason=f"the output contains {shown}")


@register("not-contains", options=NEEDLE_OPTIONS, calls_nothing=True)
async def not_contains(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    text, sensitive = nonempty_output(target), case_sensitive(evaluator)
    unwanted = needles(evaluator, target)
    present = [n for n in unwanted if found(n, text, sensitive)]
    if present:
        shown = ", ".join(repr(shorten(p)) for p in present)
        return EvalOutcome(evaluator.name, 0.0, reason=f"the output contains {shown}")
    shown = ", ".join(repr(shorten(n)) for n in unwanted)
    return EvalOutcome(evaluator.name, 1.0, reason=f"the output does not contain {shown}")


# ---------------------------------------------------------------------- regex


@functools.lru_cache(maxsize=256)
def compile_pattern(pattern: str, flags: str) -> re.Pattern[str]:
    value = 0
    for letter in flags:
        if letter not in REGEX_FLAGS:
            raise EvaluationError(
                f"unknown regex flag {letter!r}; use any of {''.join(REGEX_FLAGS)} "
                "(i ignore case, m multiline, s dot matches newline, x verbose)"
            )
        value |= REGEX_FLAGS[letter]
    try:
        return re.compile(pattern, value)
    except re.error as exc:
        raise EvaluationError(
            f"the pattern {pattern!r} is not a valid regular expression: {exc}"
        ) from None


@register("regex", options=("pattern", "flags", "case_sensitive"), calls_nothing=True)
async def regex(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    pattern = option(evaluator, "pattern", r'pattern=r"\d{4}-\d{2}-\d{2}"')
    flags = evaluator.options.get("flags", "")
    if not isinstance(pattern, str) or not pattern:
        raise EvaluationError(f"`pattern` must be a non-empty string (got {pattern!r})")
    if not isinstance(flags, str):
        raise EvaluationError(f'`flags` must be a string such as "im" (got {flags!r})')
    if not case_sensitive(evaluator) and "i" not in flags:
        flags += "i"
    compiled = compile_pattern(pattern, flags)
    text = nonempty_output(target)
    match = compiled.search(text)
    if match is None:
        return EvalOutcome(
            evaluator.name, 0.0, reason=f"no match for /{shorten(pattern)}/ in the output"
        )
    return EvalOutcome(
        evaluator.name,
        1.0,
        reason=f"/{shorten(pattern)}/ matches {shorten(match.group(0))!r} at {match.start()}",
    )


# ---------------------------------------------------------------------- JSON


def parse_output_json(target: EvalTarget) -> tuple[Any, str | None]:
    """(value, None) when the output is JSON (a str holding JSON, or already a dict/list/...);
    (None, problem) when it is text that does not parse."""
    if target.output is None:
        raise EvaluationError("the output is empty (None): the runner returned nothing to check")
    if not isinstance(target.output, str):
        return target.output, None
    if not target.output.strip():
        raise EvaluationError("the output is empty: there is nothing to check")
    try:
        return json.loads(target.output), None
    except json.JSONDecodeError as exc:
        return (
            None,
            f"the output is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
        )


@register("json-valid", options=(), calls_nothing=True)
async def json_valid(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    value, problem = parse_output_json(target)
    if problem:
        return EvalOutcome(evaluator.name, 0.0, reason=problem)
    kind = type(value).__name__.replace("dict", "object").replace("list", "array")
    return EvalOutcome(evaluator.name, 1.0, reason=f"the output is valid JSON ({kind})")


@functools.lru_cache(maxsize=64)
def schema_validator(schema_json: str) -> Any:
    import jsonschema

    schema = json.loads(schema_json)
    validator_class = jsonschema.validators.validator_for(schema)
    try:
        validator_class.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the top level"
        raise EvaluationError(
            f"`schema` is not a valid JSON Schema at {where}: {exc.message}"
        ) from None
    return validator_class(schema)


@register("json-schema", options=("schema",), calls_nothing=True)
async def json_schema(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    schema = option(evaluator, "schema", 'schema={"type": "object", "required": ["answer"]}')
    if not isinstance(schema, dict | bool):
        raise EvaluationError(f"`schema` must be a JSON Schema dict (got {type(schema).__name__})")
    validator = schema_validator(json.dumps(schema, sort_keys=True))
    value, problem = parse_output_json(target)
    if problem:
        return EvalOutcome(evaluator.name, 0.0, reason=problem)
    import jsonschema

    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return EvalOutcome(evaluator.name, 1.0, reason="the output matches the schema")
    where = "/".join(str(p) for p in error.absolute_path) or "the top level"
    return EvalOutcome(
        evaluator.name, 0.0, reason=f"schema violation at {where}: {shorten(error.message, 160)}"
    )


# ---------------------------------------------------------------------- levenshtein


def levenshtein_distance(a: str, b: str) -> int:
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        current = [i]
        for j, char_b in enumerate(b, start=1):
            current.append(
                min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b))
            )
        previous = current
    return previous[-1]


@register("levenshtein", options=("field", "case_sensitive", "threshold"), calls_nothing=True)
async def levenshtein(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    name = evaluator.field or "expected_output"
    expected = field_value(evaluator, target, name)
    expected_text = (expected if isinstance(expected, str) else output_text(expected)).strip()
    if expected is None or not expected_text:
        raise EvaluationError(f"the item's {name!r} is empty: there is nothing to compare with")
    actual = nonempty_output(target).strip()
    if not case_sensitive(evaluator):
        actual, expected_text = actual.casefold(), expected_text.casefold()
    distance = levenshtein_distance(actual, expected_text)
    similarity = 1.0 - distance / max(len(actual), len(expected_text))
    detail = f"edit distance {distance} over {max(len(actual), len(expected_text))} characters"
    threshold = evaluator.threshold
    if threshold is None:
        return EvalOutcome(
            evaluator.name, similarity, reason=f"similarity {similarity:.3f} ({detail})"
        )
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, int | float)
        or not 0 <= threshold <= 1
    ):
        raise EvaluationError(f"`threshold` must be a number from 0 to 1 (got {threshold!r})")
    passed = similarity >= threshold
    sign = ">=" if passed else "<"
    return EvalOutcome(
        evaluator.name,
        1.0 if passed else 0.0,
        reason=f"similarity {similarity:.3f} {sign} threshold {threshold:g} ({detail})",
    )


# ---------------------------------------------------------------------- budgets


@register("latency", options=("max_ms",), calls_nothing=True)
async def latency(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    budget = number_option(evaluator, "max_ms", "max_ms=2000")
    if target.latency_ms is None:
        raise EvaluationError("the item has no measured latency")
    took = target.latency_ms
    if took <= budget:
        return EvalOutcome(evaluator.name, 1.0, reason=f"{took:.0f} ms within {budget:g} ms")
    return EvalOutcome(evaluator.name, 0.0, reason=f"{took:.0f} ms over the {budget:g} ms budget")


def cost_is_known(metadata: dict[str, Any]) -> bool:
    reported = metadata.get("cost")
    if isinstance(reported, int | float) and not isinstance(reported, bool):
        return True
    return price_of(metadata.get("model")) is not None and agent_usage(metadata)[2] > 0


@register("cost", options=("max_usd",), calls_nothing=True)
async def cost(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    budget = number_option(evaluator, "max_usd", "max_usd=0.01")
    if not cost_is_known(target.metadata):
        raise EvaluationError(
            "the runner reported no cost: return metadata with `cost` (USD), or a priced `model` "
            "with token `usage`, for the cost evaluator to check"
        )
    spent = target.cost
    if spent <= budget:
        return EvalOutcome(evaluator.name, 1.0, reason=f"${spent:.6f} within ${budget:g}")
    return EvalOutcome(evaluator.name, 0.0, reason=f"${spent:.6f} over the ${budget:g} budget")
