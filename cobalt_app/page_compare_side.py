"""One item of a compare, side by side: its evaluators' reasons in A and B, the word diff of
its two outputs (or transcripts), and its two traces as a table of steps matched by kind and
name (timings and ids dropped: they differ on every run).

`side_by_side` is what the slide-over (and its page) shows; `neighbours` are the keys before
and after it in the compare table's current filter and sort, for j/k.
"""

from __future__ import annotations

import difflib
import re
from collections import defaultdict
from typing import Any

from cobalt.verdict import evaluation_verdict
from cobalt_app import trace_spans, trace_store
from cobalt_app.conversation import is_transcript, render_transcript
from cobalt_app.models import ItemResult, Run
from cobalt_app.page_selectors import pass_marks
from cobalt_app.page_values import SHOWN_CHARS, pretty, shown

TRACE_STEP_CHARS = 500  # of each step's input and output in the diffed trace
DIFF_LIMIT = SHOWN_CHARS  # of each output the diff reads (SequenceMatcher is quadratic)
STEP_ROWS = 300  # steps of each trace the step table matches (an agent loop can run thousands)
STEP = re.compile(r"\s*\[[^\]]*\] \S+")


def word_diff(before: str, after: str) -> list[tuple[str, str]]:
    """(op, text) segments turning `before` into `after` word by word; op is "same", "del"
    or "ins". The texts are plain strings: the template escapes them."""
    old, new = _words(before[:DIFF_LIMIT]), _words(after[:DIFF_LIMIT])
    segments: list[tuple[str, str]] = []
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            segments.append(("same", "".join(old[i1:i2])))
            continue
        if op in ("delete", "replace"):
            segments.append(("del", "".join(old[i1:i2])))
        if op in ("insert", "replace"):
            segments.append(("ins", "".join(new[j1:j2])))
    return segments


def steps_diff(before: str, after: str) -> list[tuple[str, str]]:
    """Like `word_diff`, for two traces rendered one step a line (`trace_spans.render`): steps
    are matched by their kind and name, a step in one trace only is one segment, and matched
    steps are diffed word by word (their inputs, outputs, errors)."""
    old = before[:DIFF_LIMIT].splitlines(keepends=True)
    new = after[:DIFF_LIMIT].splitlines(keepends=True)
    segments: list[tuple[str, str]] = []
    matcher = difflib.SequenceMatcher(None, _steps(old), _steps(new), autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            for line_a, line_b in zip(old[i1:i2], new[j1:j2], strict=True):
                segments += word_diff(line_a, line_b)
            continue
        if i2 > i1:
            segments.append(("del", "".join(old[i1:i2])))
        if j2 > j1:
            segments.append(("ins", "".join(new[j1:j2])))
    return segments


def _steps(lines: list[str]) -> list[str]:
    """Each rendered step's `[kind] name`, with its indentation (its depth)."""
    return [(STEP.match(line) or [line])[0] for line in lines]


def _words(text: str) -> list[str]:
    return re.findall(r"\s+|\w+|[^\w\s]", text)


def side_by_side(a: Run, b: Run, key: str) -> list[dict[str, Any]]:
    """The item with this key in both runs, repetition by repetition, outputs diffed.

    Runs with different repetition counts pair each repetition of the longer run with the
    last repetition of the shorter one, so every repetition is shown against something.
    """
    items = (
        ItemResult.objects.filter(run__in=[a, b], item_key=key)
        .select_related("trace")
        .prefetch_related("evaluations")
        .order_by("run_index")
    )
    sides: dict[str, list[ItemResult]] = defaultdict(list)
    for item in items:
        sides["a" if item.run_id == a.id else "b"].append(item)
    if not sides:
        return []
    names = list(dict.fromkeys([*a.evaluator_names, *b.evaluator_names]))
    marks = pass_marks(a) | pass_marks(b)
    result = []
    for n in range(max(len(sides["a"]), len(sides["b"]))):
        pair = {side: sides[side][min(n, len(sides[side]) - 1)] for side in "ab" if sides[side]}
        verdicts = {
            side: {e.evaluator: e for e in item.evaluations.all()} for side, item in pair.items()
        }
        output_a = _text(pair["a"].output) if "a" in pair else ""
        output_b = _text(pair["b"].output) if "b" in pair else ""
        steps_a, steps_b = _steps_of(pair.get("a")), _steps_of(pair.get("b"))
        trace_a = _trace_text(steps_a)
        trace_b = _trace_text(steps_b)
        transcript = any(is_transcript(item.output) for item in pair.values())
        rows = []
        for name in names:
            va, vb = verdicts.get("a", {}).get(name), verdicts.get("b", {}).get(name)
            rows.append(
                {
                    "name": name,
                    "a": va,
                    "b": vb,
                    "verdictA": _verdict_of(va, marks.get(name)),
                    "verdictB": _verdict_of(vb, marks.get(name)),
                }
            )
        result.append(
            {
                "a": pair.get("a"),
                "b": pair.get("b"),
                "input": shown(pretty((pair.get("a") or pair.get("b")).input)),
                "outputA": shown(output_a),
                "outputB": shown(output_b),
                "outputKind": "transcript" if transcript else "output",
                "diff": word_diff(output_a, output_b) if len(pair) == 2 else [],
                "traceA": shown(trace_a),
                "traceB": shown(trace_b),
                "traceDiff": steps_diff(trace_a, trace_b) if trace_a and trace_b else [],
                "steps": step_table(steps_a, steps_b) if steps_a or steps_b else [],
                "verdicts": rows,
            }
        )
    return result


def _text(value: Any) -> str:
    """An output as the side-by-side view shows and diffs it: a conversation as its
    `role: text` lines (as judges read it), anything else as text or indented JSON."""
    if value is None:
        return ""
    if is_transcript(value):
        return render_transcript(value)
    return pretty(value)


def _steps_of(item: ItemResult | None) -> list[dict[str, Any]]:
    return trace_store.of_item(item).steps if item is not None else []


def _trace_text(steps: list[dict[str, Any]]) -> str:
    """A trace as one line per step (kind, name, model, input, output, error: what the agent
    did, without the timings that differ on every run); "" when none was captured."""
    return trace_spans.render(steps, max_chars=TRACE_STEP_CHARS) if steps else ""


def _verdict_of(evaluation: Any, mark: float | None) -> str:
    if evaluation is None:
        return "none"
    return evaluation_verdict(evaluation.score, mark, error=evaluation.status != "ok")


def step_table(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Two traces' steps as rows matched by depth, kind and name: each row's step, how it
    changed ("same", "changed", "only in A", "only in B") and what it did (model, input,
    output, error: `trace_spans.render` of the step, without timings or ids), word-diffed
    when changed."""
    old, new = _step_rows(before[:STEP_ROWS], before), _step_rows(after[:STEP_ROWS], after)
    rows: list[dict[str, Any]] = []
    matcher = difflib.SequenceMatcher(
        None, [s[0] for s in old], [s[0] for s in new], autojunk=False
    )
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            for (step, did_a), (_, did_b) in zip(old[i1:i2], new[j1:j2], strict=True):
                if did_a == did_b:
                    rows.append({"step": step, "change": "same", "did": [("same", did_a)]})
                else:
                    rows.append({"step": step, "change": "changed", "did": word_diff(did_a, did_b)})
            continue
        for step, did in old[i1:i2]:
            rows.append({"step": step, "change": "only in A", "did": [("del", did)]})
        for step, did in new[j1:j2]:
            rows.append({"step": step, "change": "only in B", "did": [("ins", did)]})
    return rows


def _step_rows(shown: list[dict[str, Any]], steps: list[dict[str, Any]]) -> list[tuple]:
    """(`[kind] name` indented with ↳ by depth, what the step did) of each shown step."""
    rows = []
    for step in shown:
        depth, parent = 0, step.get("parent")
        while parent is not None and depth < 20 and 0 <= parent < len(steps):
            depth, parent = depth + 1, steps[parent].get("parent")
        head = f"[{step.get('kind')}] {step.get('name')}"
        line = trace_spans.render([{**step, "parent": None}], max_chars=TRACE_STEP_CHARS)
        indent = "\u00a0\u00a0" * (depth - 1) + "↳\u00a0" if depth else ""
        rows.append((indent + head, line[len(head) :].strip()))
    return rows
