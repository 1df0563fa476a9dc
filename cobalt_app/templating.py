"""`{{field}}` templates of judge prompts: item fields, dotted paths, input/output/metadata."""

from __future__ import annotations

import json
import re
from typing import Any

from cobalt_app.conversation import is_transcript, render_transcript

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][\w\-]*(?:\.[\w\-]+)*)\s*\}\}")


class TemplateError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def template_context(item: dict[str, Any], output: Any, metadata: dict[str, Any]) -> dict:
    """Item fields first, then the reserved names: an item field never overrides the output."""
    context = dict(item)
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
    """Replace every placeholder; a placeholder with no value is an error naming it."""

    def replace(match: re.Match[str]) -> str:
        return _stringify(_lookup(context, match.group(1)))

    return PLACEHOLDER.sub(replace, template)


def _lookup(context: dict[str, Any], dotted: str) -> Any:
    node: Any = context
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise TemplateError(
                f"the prompt uses {{{{{dotted}}}}} but the item has no such field; "
                "add it to the dataset or change the prompt"
            )
    return node


def _stringify(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)
