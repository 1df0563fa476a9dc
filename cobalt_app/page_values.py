"""What a page shows of a long value, and the download of the whole.

An agent's output, an item's input, expected output and metadata, a trace step's input and
output: a page shows the first `SHOWN_CHARS` characters of each and links to the whole,
downloaded as a file (`Content-Disposition: attachment`, text or JSON, never HTML). The API
and the exports keep returning whole values.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from cobalt_app import trace_store
from cobalt_app.models import Evaluation, ItemResult, JudgeCall, Run

SHOWN_CHARS = 20_000  # of each long value a page shows; the rest is downloaded
PARTS = ("output", "input", "expected", "metadata", "item")
STEP_PART = re.compile(r"^step-(\d+)-(input|output)$")


@dataclass(frozen=True)
class Shown:
    """The first part of a value's text, with the whole text's length."""

    text: str
    total: int

    @property
    def cut(self) -> bool:
        return self.total > len(self.text)

    def __str__(self) -> str:
        return self.text

    def __bool__(self) -> bool:
        return bool(self.total)


def shown(text: str | None) -> Shown:
    text = text or ""
    return Shown(text[:SHOWN_CHARS], len(text))


def pretty(value: Any) -> str:
    """A value as a page and a download show it: text as it is, anything else as indented
    JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, indent=2, default=str)


@dataclass(frozen=True)
class Download:
    body: str
    content_type: str
    filename: str


def item_download(run: Run, item_id: int, part: str) -> Download | None:
    """The whole of one part of an item (`output`, `input`, `expected`, `metadata`, `item`
    as the panel's JSON, or a trace step's `step-N-input`/`step-N-output`, N from 1); None
    when the item or the part does not exist."""
    step = STEP_PART.match(part)
    if part not in PARTS and step is None:
        return None
    item = ItemResult.objects.filter(run=run, id=item_id).first()
    if item is None:
        return None
    if step is not None:
        steps = trace_store.read([item.id]).get(item.id, [])
        number, field = int(step.group(1)), step.group(2)
        if not 1 <= number <= len(steps) or steps[number - 1].get(field) is None:
            return None
        value: Any = steps[number - 1][field]
    else:
        value = _part_value(run, item, part)
        if value is None:
            return None
    text = isinstance(value, str)
    return Download(
        body=pretty(value),
        content_type="text/plain; charset=utf-8" if text else "application/json",
        filename=f"{run.id}-item-{item.item_index + 1}-{part}.{'txt' if text else 'json'}",
    )


def _part_value(run: Run, item: ItemResult, part: str) -> Any:
    if part == "output":
        return item.output
    if part == "input":
        return item.input
    if part == "expected":
        return expected_value(run, item.input)
    if part == "metadata":
        return item.metadata or None
    item.verdicts = ordered_verdicts(run, item)
    return item_json(item)


def ordered_verdicts(run: Run, item: ItemResult) -> list[Evaluation]:
    """The item's evaluations in the run's evaluator order."""
    order = {name: i for i, name in enumerate(run.evaluator_names)}
    verdicts = sorted(
        Evaluation.objects.filter(item=item), key=lambda e: (order.get(e.evaluator, 99), e.id)
    )
    types = {e.get("name"): e.get("type", "") for e in run.config.get("evaluators", [])}
    with_judge_calls(item, verdicts, types)
    return verdicts


# Evaluators whose model calls go through Cobalt's judge and are kept ("Show judge call").
CAPTURED = ("llm-judge", "pairwise", "deepeval", "ragas", "autoevals")


def with_judge_calls(
    item: ItemResult, verdicts: list[Evaluation], types: dict[str, str] | None = None
) -> None:
    """Each evaluation's `judge_call` (None without one) and, where a score cost tokens but
    no call was kept, `judge_call_note` saying why: read only when one of them called a model
    or came from the judge cache (a function evaluator's item costs no query)."""
    for verdict in verdicts:
        verdict.judge_call = None
        verdict.judge_call_note = ""
    if not any(v.tokens or v.cached for v in verdicts):
        return
    calls = dict(JudgeCall.objects.filter(item=item).values_list("evaluator", "data"))
    for verdict in verdicts:
        verdict.judge_call = calls.get(verdict.evaluator)
        if verdict.judge_call is None and (verdict.tokens or verdict.cached):
            kind = (types or {}).get(verdict.evaluator, "")
            verdict.judge_call_note = _no_call_note(kind, verdict.cached)


def _no_call_note(kind: str, cached: bool) -> str:
    if kind in CAPTURED and cached:
        return (
            "No judge call to show: this score came from the judge cache, written before "
            "Cobalt kept judge calls."
        )
    if kind in CAPTURED:
        return (
            "No judge call to show: its tokens went to embeddings, or no reply of the judge "
            "could be read."
        )
    return (
        "No judge call to show: this evaluator calls its model itself, where Cobalt cannot "
        "see the prompt; only the tokens and cost it reported are counted."
    )


@dataclass(frozen=True)
class ItemValues:
    """What the item page and the review page show of an item's values, each cut to
    `SHOWN_CHARS`; `cut` when any was (the panel then offers a download, not a copy)."""

    input: Shown
    output: Shown
    expected: Shown
    metadata: Shown

    @property
    def cut(self) -> bool:
        return any(v.cut for v in (self.input, self.output, self.expected, self.metadata))


def item_values(run: Run, item: ItemResult) -> ItemValues:
    expected = expected_value(run, item.input)
    return ItemValues(
        input=shown(pretty(item.input)),
        output=shown("" if item.output is None else pretty(item.output)),
        expected=shown("" if expected is None else pretty(expected)),
        metadata=shown(pretty(item.metadata) if item.metadata else ""),
    )


EXPECTED_FIELDS = ("expected_output", "expected")


def expected_value(run: Run, item_input: Any) -> Any:
    """The item's expected output: the field its evaluators read, else `expected_output` or
    `expected`; None when it has none."""
    if not isinstance(item_input, dict):
        return None
    named = [e["field"] for e in run.config.get("evaluators", []) if e.get("field")]
    for name in dict.fromkeys([*named, *EXPECTED_FIELDS]):
        if item_input.get(name) is not None:
            return item_input[name]
    return None


def item_json(item: ItemResult) -> dict[str, Any]:
    """The item as the panel's "Copy as JSON" (or its JSON download) gives it."""
    return {
        "run": item.run_id,
        "key": item.item_key,
        "index": item.item_index,
        "repetition": item.run_index,
        "status": item.status,
        "input": item.input,
        "output": item.output,
        "error": item.error or None,
        "metadata": item.metadata,
        "latencyMs": item.latency_ms,
        "tokens": item.tokens,
        "cost": item.cost,
        "evaluations": [
            {
                "evaluator": v.evaluator,
                "score": v.score,
                "status": v.status,
                "reason": v.reason,
                "error": v.error or None,
            }
            for v in item.verdicts
        ],
    }
