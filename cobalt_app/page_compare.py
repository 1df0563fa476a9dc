"""Reads behind the compare page: the per-evaluator summary, every matched item A against B,
and one item side by side with word-level diffs of its two outputs (or transcripts) and of
its two traces.

The summary is `selectors.compare_runs`, shared with the CLI, the API and the MCP tool; the
per-item table reuses the same join of the two runs' score tables (`score_tables`, stored at
finalisation), so no request reads every verdict of both runs.
"""

from __future__ import annotations

import difflib
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Min

from cobalt.significance import ALPHA
from cobalt.verdict import evaluation_verdict, score_verdict
from cobalt_app import calibration, score_tables, trace_spans, trace_store
from cobalt_app.conversation import is_transcript, render_transcript
from cobalt_app.models import ItemResult, Run
from cobalt_app.page_items import Paging
from cobalt_app.page_selectors import pass_marks
from cobalt_app.page_values import SHOWN_CHARS, pretty, shown
from cobalt_app.score_tables import Pairing
from cobalt_app.selectors import compare_runs

CHANGES = ("regressed", "improved", "unchanged")
PAIR_SORTS = ("delta", "-delta", "key")
TRACE_STEP_CHARS = 500  # of each step's input and output in the diffed trace
DIFF_LIMIT = SHOWN_CHARS  # of each output the diff reads (SequenceMatcher is quadratic)
EPSILON = 1e-12
STEP = re.compile(r"\s*\[[^\]]*\] \S+")


@dataclass
class PairRow:
    """One item key matched in both runs: each evaluator's (repetition-averaged) A, B and Δ."""

    key: str
    scores: list[dict[str, Any]]
    status_a: str
    status_b: str
    change: str
    item_a: int | None = None  # the item's number (as in `#17`) in A
    item_b: int | None = None


@dataclass
class PairTable(Paging):
    rows: list[PairRow] = field(default_factory=list)
    evaluators: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def columns(self) -> int:
        return 3 * len(self.evaluators) + 3

    @property
    def summary(self) -> str:
        if not self.total:
            return "No matched items"
        start = (self.number - 1) * self.per_page + 1
        end = min(self.total, self.number * self.per_page)
        return f"Items {start:,}–{end:,} of {self.total:,}"


@dataclass
class Comparison:
    a: Run
    b: Run
    evaluators: list[dict[str, Any]]
    matched: int
    only_in_a: int
    only_in_b: int
    table: PairTable
    alpha: float = ALPHA
    judges: list[Any] = field(default_factory=list)  # calibration.JudgeComparison

    @property
    def same_experiment(self) -> bool:
        return self.a.name == self.b.name

    @property
    def chart_data(self) -> dict[str, Any]:
        return {
            "labels": [e["name"] for e in self.evaluators],
            "a": [e["a"] for e in self.evaluators],
            "b": [e["b"] for e in self.evaluators],
            "labelA": f"A · {self.a.id}",
            "labelB": f"B · {self.b.id}",
        }


def compare(
    a: Run,
    b: Run,
    *,
    evaluator: str = "",
    change: str = "",
    sort: str = "delta",
    page: int = 1,
    per_page: int = 50,
    alpha: float = ALPHA,
) -> Comparison:
    """The compare page: `selectors.compare_runs` per evaluator, and a page of every item
    matched by key (filtered by evaluator and by change, sorted by Δ or key)."""
    pairing = score_tables.pair(a, b)
    diff = compare_runs(a, b, top=0, alpha=alpha, pairing=pairing)
    marks = pass_marks(a) | pass_marks(b)
    evaluators = []
    for name, values in diff["evaluators"].items():
        test = diff["significance"][name]
        evaluators.append(
            {
                "name": name,
                **values,
                "verdictA": score_verdict(values["a"], marks.get(name)),
                "verdictB": score_verdict(values["b"], marks.get(name)),
                "pairs": test["n"],
                "meanDelta": test["delta"],
                "ci": test["ci"],
                "pValue": test["pValue"],
                "test": test["test"],
                "verdict": test["verdict"],
            }
        )
    names = [e["name"] for e in evaluators]
    table = pair_table(
        a,
        b,
        pairing,
        [evaluator] if evaluator else names,
        marks,
        change=change,
        sort=sort,
        page=page,
        per_page=per_page,
    )
    return Comparison(
        a=a,
        b=b,
        evaluators=evaluators,
        matched=diff["matchedItems"],
        only_in_a=len(diff["onlyInA"]),
        only_in_b=len(diff["onlyInB"]),
        table=table,
        alpha=diff["alpha"],
        judges=calibration.compare_calibration(a, b),
    )


def pair_table(
    a: Run,
    b: Run,
    pairing: Pairing,
    names: list[str],
    marks: dict[str, float],
    *,
    change: str = "",
    sort: str = "delta",
    page: int = 1,
    per_page: int = 50,
) -> PairTable:
    """Every key scored (or failed) in both runs, A against B on the `names` evaluators.

    An item that errored or timed out in one run only counts as regressed (in B) or improved
    (in A); otherwise it regressed when an evaluator's score fell, improved when one rose and
    none fell. The changes of every pair are classified and sorted as arrays over the two
    runs' score tables; only the shown page becomes rows, with one query for its item ids.
    """
    pairs = _PairArrays.of(pairing, names)
    counts = {name: int((pairs.changes == i).sum()) for i, name in enumerate(CHANGES)}
    selected = pairs.selected(change, sort)
    total = len(selected)
    number = min(max(1, page), max(1, math.ceil(total / per_page)))
    shown = selected[(number - 1) * per_page : number * per_page].tolist()
    rows = [_pair_row(pairs, i, pairing, names, marks) for i in shown]
    _link_items(rows, a, b)
    return PairTable(
        number=number, per_page=per_page, total=total, rows=rows, evaluators=names, counts=counts
    )


@dataclass
class _PairArrays:
    """The pairs of the table as arrays: per evaluator (rows) and pair (columns) the scores
    before and after and their deltas; per pair its position in the pairing (`keep`), its
    change (an index into CHANGES), its largest fall (`worst`) and rise (`best`)."""

    keep: Any
    before: Any
    after: Any
    deltas: Any
    changes: Any
    worst: Any
    best: Any

    @classmethod
    def of(cls, pairing: Pairing, names: list[str]) -> _PairArrays:
        import numpy as np

        count = pairing.matched
        columns = [pairing.scores(name) for name in names]
        before = np.array([c[0] for c in columns], dtype=float).reshape(len(names), count)
        after = np.array([c[1] for c in columns], dtype=float).reshape(len(names), count)
        failed_a = pairing.a.failed[pairing.at_a]
        failed_b = pairing.b.failed[pairing.at_b]
        # A key is in the table when each run either scored it (on these evaluators) or failed it.
        present = (failed_a | (~np.isnan(before)).any(axis=0)) & (
            failed_b | (~np.isnan(after)).any(axis=0)
        )
        keep = np.flatnonzero(present)
        if len(keep) < count:
            before, after = before[:, keep], after[:, keep]
            failed_a, failed_b = failed_a[keep], failed_b[keep]
            count = len(keep)
        deltas = after - before
        broke = failed_b & ~failed_a
        mended = failed_a & ~failed_b
        with np.errstate(invalid="ignore"):
            fell = (deltas < -EPSILON).any(axis=0)
            rose = (deltas > EPSILON).any(axis=0)
        regressed = broke | (~mended & fell)
        improved = ~regressed & (mended | rose)
        changes = np.where(regressed, 0, np.where(improved, 1, 2))  # index into CHANGES
        if names and count:  # each pair's largest fall and rise (a missing score is no change)
            with np.errstate(invalid="ignore"):
                lowest = np.nan_to_num(np.fmin.reduce(deltas, axis=0), nan=0.0)
                highest = np.nan_to_num(np.fmax.reduce(deltas, axis=0), nan=0.0)
        else:
            lowest = highest = np.zeros(count)
        worst = np.where(broke, -np.inf, lowest)
        best = np.where(mended, np.inf, highest)
        return cls(keep, before, after, deltas, changes, worst, best)

    def selected(self, change: str, sort: str) -> Any:
        """The pairs of the `change` asked for (all without one), in the order asked for."""
        import numpy as np

        selected = np.arange(len(self.changes))
        if change in CHANGES:
            selected = selected[self.changes == CHANGES.index(change)]
        if sort == "delta":
            selected = selected[np.lexsort((self.best[selected], self.worst[selected]))]
        elif sort == "-delta":
            selected = selected[np.lexsort((-self.worst[selected], -self.best[selected]))]
        return selected


def _pair_row(
    pairs: _PairArrays, i: int, pairing: Pairing, names: list[str], marks: dict[str, float]
) -> PairRow:
    at = int(pairs.keep[i])
    cells = []
    for n, name in enumerate(names):
        score_a, score_b = _score(pairs.before[n, i]), _score(pairs.after[n, i])
        delta = pairs.deltas[n, i]
        cells.append(
            {
                "name": name,
                "a": score_a,
                "b": score_b,
                "delta": None if math.isnan(delta) else float(delta),
                "verdictA": score_verdict(score_a, marks.get(name)),
                "verdictB": score_verdict(score_b, marks.get(name)),
            }
        )
    statuses = ItemResult.Status.values
    status_a = statuses[int(pairing.a.status[pairing.at_a[at]])]
    status_b = statuses[int(pairing.b.status[pairing.at_b[at]])]
    return PairRow(pairing.key(at), cells, status_a, status_b, CHANGES[int(pairs.changes[i])])


def _link_items(rows: list[PairRow], a: Run, b: Run) -> None:
    """Each row's item number in A and in B (one query for the page)."""
    if not rows:
        return
    ids = (
        ItemResult.objects.filter(run_id__in=[a.id, b.id], item_key__in=[r.key for r in rows])
        .values("run_id", "item_key")
        .annotate(first=Min("item_index"))
        .values_list("run_id", "item_key", "first")
    )
    found = {(run_id, key): index + 1 for run_id, key, index in ids}
    for row in rows:
        row.item_a = found.get((a.id, row.key))
        row.item_b = found.get((b.id, row.key))


def _score(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


# Side by side -------------------------------------------------------------------------------


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
        trace_a = _trace_text(pair.get("a"))
        trace_b = _trace_text(pair.get("b"))
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


def _trace_text(item: ItemResult | None) -> str:
    """The item's trace as one line per step (kind, name, model, input, output, error: what
    the agent did, without the timings that differ on every run); "" when none was captured."""
    steps = trace_store.of_item(item).steps if item is not None else []
    return trace_spans.render(steps, max_chars=TRACE_STEP_CHARS) if steps else ""


def _verdict_of(evaluation: Any, mark: float | None) -> str:
    if evaluation is None:
        return "none"
    return evaluation_verdict(evaluation.score, mark, error=evaluation.status != "ok")
