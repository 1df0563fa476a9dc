"""The spec of a generated experiment and the checks on it.

The judge LLM replies with a JSON spec (`SPEC_SCHEMA`; `generate_prompt.REPLY_FORMAT` shows
it): the experiment's name, the agent function to call and its arguments, the items and the
evaluators. `parse_spec()` finds the object in the reply and `check_spec()` holds it against
the schema and against the agent file's top-level functions (`agent_functions()`). Every step
of `cobalt_generate` raises `GenerateError`, whose message says what to change.
"""

from __future__ import annotations

import ast
import json
import keyword
import re
from dataclasses import dataclass
from typing import Any

import jsonschema

from cobalt.dataset import item_key
from cobalt.errors import CobaltError
from cobalt_app.templating import PLACEHOLDER

CATEGORIES = ("normal", "edge", "adversarial")
RESERVED_PLACEHOLDERS = {"input", "output", "metadata", "item"}
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$"

SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name", "function", "arguments", "items", "evaluators"],
    "properties": {
        "name": {"type": "string", "pattern": NAME_PATTERN},
        "description": {"type": "string"},
        "function": {"type": "string"},
        "arguments": {"type": "object", "additionalProperties": {"type": "string"}},
        "items": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["category"],
                "properties": {
                    "id": {"type": ["string", "integer"]},
                    "category": {"enum": list(CATEGORIES)},
                },
            },
        },
        "evaluators": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "type"],
                "properties": {
                    "name": {"type": "string", "pattern": NAME_PATTERN},
                    "type": {"enum": ["llm-judge", "exact-match", "contains", "max-length"]},
                    "prompt": {"type": "string", "minLength": 1},
                    "field": {"type": "string", "minLength": 1},
                    "max_chars": {"type": "integer", "minimum": 1},
                },
                "allOf": [
                    {
                        "if": {"properties": {"type": {"const": "llm-judge"}}},
                        "then": {"required": ["prompt"]},
                    },
                    {
                        "if": {"properties": {"type": {"enum": ["exact-match", "contains"]}}},
                        "then": {"required": ["field"]},
                    },
                    {
                        "if": {"properties": {"type": {"const": "max-length"}}},
                        "then": {"required": ["max_chars"]},
                    },
                ],
            },
        },
    },
}


class GenerateError(CobaltError):
    """The experiment could not be generated; the message says what to change."""


@dataclass(frozen=True)
class AgentFunction:
    """A top-level function of the agent file, as the runner will call it."""

    name: str
    is_async: bool
    positional_only: tuple[str, ...]
    parameters: tuple[str, ...]
    required: tuple[str, ...]
    var_keyword: bool
    signature: str
    doc: str


def agent_functions(source: str, shown_path: str) -> dict[str, AgentFunction]:
    """The top-level functions of the agent file, by name."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise GenerateError(
            f"agentFile {shown_path} is not valid Python (line {exc.lineno}: {exc.msg})"
        ) from None
    found: dict[str, AgentFunction] = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        args = node.args
        positional = [*args.posonlyargs, *args.args]
        first_default = len(positional) - len(args.defaults)
        required = [a.arg for i, a in enumerate(positional) if i < first_default]
        required += [
            a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None
        ]
        prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
        returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
        found[node.name] = AgentFunction(
            name=node.name,
            is_async=isinstance(node, ast.AsyncFunctionDef),
            positional_only=tuple(a.arg for a in args.posonlyargs),
            parameters=tuple(a.arg for a in [*positional, *args.kwonlyargs]),
            required=tuple(required),
            var_keyword=args.kwarg is not None,
            signature=f"{prefix} {node.name}({ast.unparse(args)}){returns}",
            doc=first_line(ast.get_docstring(node)),
        )
    if not found:
        raise GenerateError(
            f"agentFile {shown_path} defines no top-level function; cobalt_generate writes a "
            "runner that calls one (wrap your agent in a function such as `def answer(question)`)"
        )
    return found


def first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else ""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_spec(reply: str) -> dict[str, Any]:
    """The JSON object in the LLM's reply (code fences tolerated)."""
    text = re.sub(r"^\s*```[A-Za-z]*\s*|\s*```\s*$", "", reply.strip())
    candidates = [text]
    start, end = text.find("{"), text.rfind("}")
    if start != -1 and end > start:
        candidates.append(text[start : end + 1])
    problem = "no JSON object found"
    for candidate in candidates:
        try:
            data = json.loads(candidate, parse_constant=_reject_constant)
        except ValueError as exc:
            problem = str(exc)
            continue
        if isinstance(data, dict):
            return data
        problem = f"the reply is JSON but a {type(data).__name__}, not an object"
    shown = " ".join(reply.split())
    shown = shown if len(shown) <= 300 else shown[:297] + "..."
    raise GenerateError(
        f"the LLM did not reply with the JSON spec ({problem}); reply was: {shown!r}. "
        "Call cobalt_generate again, or add guidance in `context`."
    )


def check_spec(spec: dict[str, Any], functions: dict[str, AgentFunction], size: int) -> list[str]:
    """Raise GenerateError naming the first problem; returns notes about adjustments made."""
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(SPEC_SCHEMA).iter_errors(spec)
    )
    if error is not None:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        raise GenerateError(f"the LLM's spec is invalid at spec{where}: {error.message}")
    notes = _fit_items(spec, size)
    function = functions.get(spec["function"])
    if function is None:
        raise GenerateError(
            f"the LLM's spec calls function {spec['function']!r}, which the agent file does not "
            f"define at top level (it defines: {', '.join(functions)})"
        )
    _check_arguments(spec["arguments"], function)
    _check_items(spec["items"], spec["arguments"])
    names = [e["name"] for e in spec["evaluators"]]
    for name in names:
        if names.count(name) > 1:
            raise GenerateError(f"spec.evaluators: the name {name!r} is used twice")
    for number, evaluator in enumerate(spec["evaluators"]):
        check_evaluator(evaluator, number, spec["items"])
    return notes


def _fit_items(spec: dict[str, Any], size: int) -> list[str]:
    """Keep the first `size` items; a note when the LLM returned more or fewer."""
    if len(spec["items"]) > size:
        notes = [f"the LLM returned {len(spec['items'])} items; kept the first {size}"]
        spec["items"] = spec["items"][:size]
        return notes
    if len(spec["items"]) < size:
        return [f"the LLM returned {len(spec['items'])} items instead of {size}"]
    return []


def _check_arguments(arguments: dict[str, str], function: AgentFunction) -> None:
    """Every argument a parameter of the function (unless it takes **kwargs), every required
    parameter given, every name a Python name."""
    unknown = [p for p in arguments if p not in function.parameters]
    if unknown and not function.var_keyword:
        raise GenerateError(
            f"spec.arguments names {unknown[0]!r}, which is not a parameter of {function.signature}"
        )
    missing = [p for p in function.required if p not in arguments]
    if missing:
        raise GenerateError(
            f"spec.arguments does not give {missing[0]!r}, a required parameter of "
            f"{function.signature}"
        )
    for p in arguments:
        if not p.isidentifier() or keyword.iskeyword(p):
            raise GenerateError(f"spec.arguments: {p!r} is not a parameter name")


def _check_items(items: list[dict[str, Any]], arguments: dict[str, str]) -> None:
    """Each item gets an id (unique) and holds every field an argument reads."""
    ids: set[str] = set()
    for index, item in enumerate(items):
        if item.get("id") is None:
            item["id"] = f"{item['category']}-{index + 1}"
        key = item_key(item)
        if key in ids:
            raise GenerateError(f"spec.items[{index}].id {key!r} is used twice; ids must be unique")
        ids.add(key)
        for parameter, item_field in arguments.items():
            if item_field not in item:
                raise GenerateError(
                    f"spec.items[{index}] ({key}) has no field {item_field!r}, which the "
                    f"argument {parameter!r} reads"
                )


def check_evaluator(evaluator: dict[str, Any], number: int, items: list[dict[str, Any]]) -> None:
    where = f"spec.evaluators[{number}] ({evaluator['name']})"
    needed: list[str] = []
    if evaluator["type"] in ("exact-match", "contains"):
        needed = [evaluator["field"]]
    elif evaluator["type"] == "llm-judge":
        placeholders = [m.group(1) for m in PLACEHOLDER.finditer(evaluator["prompt"])]
        if "output" not in placeholders:
            raise GenerateError(
                f"{where}: the prompt must show the agent's answer as {{{{output}}}}"
            )
        roots = [re.split(r"[.\[]", p)[0] for p in placeholders]
        needed = [root for root in roots if root not in RESERVED_PLACEHOLDERS]
    for name in needed:
        for index, item in enumerate(items):
            if name not in item:
                raise GenerateError(
                    f"{where} reads the field {name!r}, but spec.items[{index}] ({item['id']}) "
                    "has none; every item needs it"
                )
