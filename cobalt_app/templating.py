"""`{{field}}` templates of judge prompts: item fields, dotted paths, bracket indexes
(`{{tags[0]}}`, `{{items[0].name}}`, `{{metadata["a key"]}}`), input/output/metadata.

Every `{{...}}` in a prompt must be such a path with a value: anything else is an error naming
the placeholder, raised before the judge is called (never sent to it as literal text).
"""

from __future__ import annotations

import json
import re
from typing import Any

from cobalt_app.conversation import is_transcript, render_transcript

_NAME = r"[A-Za-z_][\w\-]*"
_STEP = r"\.[\w\-]+|\[\s*\d+\s*\]|\[\s*(?:\"[^\"]*\"|'[^']*')\s*\]"
PATH = re.compile(rf"{_NAME}(?:{_STEP})*")
# A well-formed placeholder; group 1 is its path.
PLACEHOLDER = re.compile(rf"\{{\{{\s*({PATH.pattern})\s*\}}\}}")
# Anything written as a placeholder, well-formed or not.
ANY_PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
STEPS = re.compile(r"\.([\w\-]+)|\[\s*(\d+)\s*\]|\[\s*(?:\"([^\"]*)\"|'([^']*)')\s*\]")


class TemplateError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def template_context(
    item: dict[str, Any],
    output: Any,
    metadata: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> dict:
    """Item fields first, then the evaluator's `context=` variables (`extra`), then the reserved
    names: neither an item field nor an extra variable overrides the output."""
    context = dict(item)
    context.update(extra or {})
    context["input"] = item.get("input", item)
    context["output"] = output
    context["metadata"] = metadata or {}
    context["item"] = item
    if is_transcript(output):  # a conversation: the whole of it, and its last reply
        context["transcript"] = render_transcript(output)
        replies = [m["content"] for m in output if m["role"] == "assistant"]
        context["last_reply"] = replies[-1] if replies else ""
    return context


def render(template: str, context: dict[str, Any]) -> str:
    """Replace every placeholder; one that is not a path, or has no value, is an error naming
    it."""

    def replace(match: re.Match[str]) -> str:
        inner = match.group(1).strip()
        if not PATH.fullmatch(inner):
            raise TemplateError(
                f"the prompt's placeholder {{{{{inner}}}}} is not a field path; write "
                "{{field}}, {{field.key}} or {{field[0]}} (e.g. {{items[0].name}})"
            )
        return _stringify(_lookup(context, inner))

    return ANY_PLACEHOLDER.sub(replace, template)


def placeholder_names(template: str) -> set[str]:
    """The names the template's well-formed placeholders start with (`trace` for
    `{{trace}}`)."""
    return {_steps(match.group(1))[0] for match in PLACEHOLDER.finditer(template)}


def _steps(path: str) -> list[str | int]:
    """`items[0].name` → ["items", 0, "name"]; a path of other characters splits on dots."""
    if not PATH.fullmatch(path):
        return list(path.split("."))
    name = re.match(_NAME, path)
    assert name is not None  # PATH matched
    steps: list[str | int] = [name.group(0)]
    for match in STEPS.finditer(path, name.end()):
        dotted, index, double, single = match.groups()
        if index is not None:
            steps.append(int(index))
        else:
            steps.append(next(v for v in (dotted, double, single) if v is not None))
    return steps


def _lookup(context: dict[str, Any], path: str) -> Any:
    node: Any = context
    for step in _steps(path):
        key = str(step)
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            raise TemplateError(
                f"the prompt uses {{{{{path}}}}} but the item has no such field; "
                "add it to the dataset or change the prompt"
            )
    return node


def _stringify(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)
