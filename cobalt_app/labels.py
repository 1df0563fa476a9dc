"""Human labels: people's verdicts on evaluations, and the reads every door shows them with.

A label is given on one output of one item (`output_hash`), for one evaluator, by one
reviewer. A run shows the labels of its experiment whose item key it has: current when the
item's output is the one labelled, stale when it changed. A label whose verdict differs from
the judge's (the one verdict rule, `cobalt.verdict`) is a disagreement.

`label_save` is the one write (pages, API, CLI import and MCP call it); `run_labels` the one
read. The review queue puts the judge's failures and borderline items first, then the other
items in an order shuffled by a seed of the run and evaluator: reviewers of the same run see
the same queue, and any prefix of its second part is a uniform random sample.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from cobalt.errors import CobaltError, ConflictError, NotFoundError
from cobalt.verdict import Verdict, evaluation_verdict, pass_marks
from cobalt_app import storable
from cobalt_app.models import Evaluation, ItemResult, Label, Run

MAX_NOTE = 10_000
MAX_REVIEWER = 150
UNSET: Any = object()  # "leave the corrected expected output as it is"


class LabelError(CobaltError, ValueError):  # ValueError: the review page catches a dataset's too
    """A label that cannot be saved; the message names the field and what to do."""


class LabelNotFound(NotFoundError, LabelError):
    pass


class LabelConflict(ConflictError, LabelError):
    """Someone saved this label since the version the caller saw (or the run is running)."""

    exit_code = 1  # `cobalt labels import`: the file was fine, the labels changed meanwhile


def output_hash(output: Any) -> str:
    """SHA-256 of an output's canonical JSON: the same output hashes the same in any run."""
    text = json.dumps(
        output, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str
    )
    return hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest()


# Writes -------------------------------------------------------------------------------------


def label_save(
    *,
    run: Run,
    item_id: int,
    evaluator: str,
    reviewer: str,
    verdict: str | None = None,
    score: Any = None,
    note: str = "",
    expected_output: Any = UNSET,
    version: int | None = None,
) -> Label:
    """Create or change `reviewer`'s label of `evaluator` on the item's current output.

    Without `verdict`, a `score` decides it by the evaluator's pass mark. `version` is the
    version the caller last saw (0: none): when given and not the stored one, the save is
    refused (`LabelConflict`) instead of overwriting someone's edit; None overwrites.
    """
    if not run.is_finished:
        raise LabelConflict(
            f"run {run.id} is still {run.status}: label its items once it has finished"
        )
    item = ItemResult.objects.filter(run=run, id=item_id).only("id", "item_key", "output").first()
    if item is None:
        raise LabelNotFound(f"run {run.id} has no item with id {item_id}")
    values = clean_label(
        run, evaluator=evaluator, reviewer=reviewer, verdict=verdict, score=score, note=note
    )
    if expected_output is not UNSET:
        values["expected_output"] = _clean_expected(expected_output)
    key = {
        "experiment": run.name,
        "item_key": item.item_key,
        "output_hash": output_hash(item.output),
        "evaluator": evaluator,
        "reviewer": values.pop("reviewer"),
    }
    now = timezone.now()
    existing = Label.objects.filter(**key).only("id", "version").first()
    if existing is None:
        if version:
            raise LabelConflict(_changed(key, "it was removed"))
        try:
            with transaction.atomic():
                return Label.objects.create(
                    **key, **values, run=run, created_at=now, updated_at=now
                )
        except IntegrityError:
            raise LabelConflict(_changed(key, "someone saved it at the same time")) from None
    if version is not None and version != existing.version:
        raise LabelConflict(_changed(key, f"it is at version {existing.version}, not {version}"))
    rows = Label.objects.filter(id=existing.id, version=existing.version)
    if not rows.update(**values, run=run, updated_at=now, version=F("version") + 1):
        raise LabelConflict(_changed(key, "someone saved it at the same time"))
    return Label.objects.get(id=existing.id)


def check_evaluator(run: Run, evaluator: str) -> None:
    """`LabelError` naming the run's evaluators when it has no `evaluator`."""
    if evaluator not in run.evaluator_names:
        raise LabelError(
            f"evaluator: run {run.id} has no evaluator {evaluator!r} "
            f"(it has: {', '.join(run.evaluator_names) or 'none'})"
        )


def clean_label(
    run: Run, *, evaluator: str, reviewer: str, verdict: Any, score: Any, note: Any
) -> dict[str, Any]:
    """The stored values of a label, or `LabelError` naming the field that is wrong."""
    check_evaluator(run, evaluator)
    reviewer = (reviewer or "").strip() if isinstance(reviewer, str) else ""
    if not reviewer or len(reviewer) > MAX_REVIEWER:
        raise LabelError(f"reviewer: a user name of 1 to {MAX_REVIEWER} characters is needed")
    if score is not None and score != "":
        if isinstance(score, bool) or not isinstance(score, int | float | str):
            raise LabelError(f"score: {score!r} is not a number from 0 to 1")
        try:
            score = float(score)
        except ValueError:
            raise LabelError(f"score: {score!r} is not a number from 0 to 1") from None
        if not math.isfinite(score) or not 0.0 <= score <= 1.0:
            raise LabelError(f"score: {score!r} is outside 0..1 (a corrected score is 0 to 1)")
    else:
        score = None
    if verdict in (None, ""):
        if score is None:
            raise LabelError("verdict: give 'pass' or 'fail' (or a corrected score)")
        mark = pass_marks(run.config.get("evaluators", [])).get(evaluator)
        verdict = evaluation_verdict(score, mark).passed and "pass" or "fail"
    if verdict not in Label.Verdict.values:
        raise LabelError(f"verdict: {verdict!r} is not 'pass' or 'fail'")
    if note is None:
        note = ""
    if not isinstance(note, str):
        raise LabelError("note: text is expected")
    if len(note) > MAX_NOTE:
        raise LabelError(f"note: {len(note)} characters; at most {MAX_NOTE}")
    return {
        "reviewer": storable.clean_text(reviewer),
        "verdict": verdict,
        "score": score,
        "note": storable.clean_message(note),
    }


def _clean_expected(value: Any) -> Any:
    try:
        storable.dumps_at(value, "expected_output")
    except storable.Unstorable as exc:
        raise LabelError(f"{exc} (a corrected expected output must be JSON)") from None
    return storable.redacted(value)


def _changed(key: dict[str, str], why: str) -> str:
    return (
        f"{key['reviewer']}'s label of {key['evaluator']!r} on item {key['item_key']!r} "
        f"changed since you read it ({why}): reload it and save again"
    )


# Reads --------------------------------------------------------------------------------------


@dataclass
class LabelRow:
    """A label as a run shows it: on which of its items, current or stale, and whether the
    judge's verdict on that item agrees."""

    label: Label
    item_id: int
    item_index: int
    run_index: int
    stale: bool
    judge_score: float | None
    judge_verdict: Verdict

    @property
    def disagrees(self) -> bool:
        """A current label whose pass/fail differs from the judge's (errors never disagree)."""
        judged = self.judge_verdict.passed
        return not self.stale and judged is not None and judged != (self.label.verdict == "pass")

    def as_json(self) -> dict[str, Any]:
        """The label as the API, results file, exports and MCP give it."""
        label = self.label
        return {
            "id": label.id,
            "item": self.item_index + 1,
            "itemId": self.item_id,
            "itemKey": label.item_key,
            "repetition": self.run_index,
            "evaluator": label.evaluator,
            "reviewer": label.reviewer,
            "verdict": label.verdict,
            "score": label.score,
            "note": label.note,
            "expectedOutput": label.expected_output,
            "stale": self.stale,
            "judgeScore": self.judge_score,
            "judgeVerdict": str(self.judge_verdict),
            "disagrees": self.disagrees,
            "version": label.version,
            "labelledRun": label.run_id,
            "createdAt": label.created_at.isoformat(),
            "updatedAt": label.updated_at.isoformat(),
        }


def run_labels(
    run: Run,
    *,
    item_ids: list[int] | None = None,
    evaluator: str | None = None,
    reviewer: str | None = None,
    stale: bool = True,
) -> list[LabelRow]:
    """The labels of the run's items, in item order (one row per item and label: a label
    given on another repetition's output reads as stale on this one). Only the items whose
    key has a label are read."""
    labels = Label.objects.filter(experiment=run.name)
    if evaluator:
        labels = labels.filter(evaluator=evaluator)
    if reviewer:
        labels = labels.filter(reviewer=reviewer)
    by_key: dict[str, list[Label]] = defaultdict(list)
    for label in labels.order_by("evaluator", "reviewer", "id"):
        by_key[label.item_key].append(label)
    if not by_key:
        return []
    items = ItemResult.objects.filter(run=run, item_key__in=list(by_key))
    if item_ids is not None:
        items = items.filter(id__in=item_ids)
    items = list(
        items.order_by("item_index", "run_index").values_list(
            "id", "item_key", "item_index", "run_index", "output"
        )
    )
    judged = _judge_verdicts(run, [row[0] for row in items])
    rows: list[LabelRow] = []
    for item_id, key, index, repetition, output in items:
        digest = output_hash(output)
        for label in by_key[key]:
            is_stale = label.output_hash != digest
            if is_stale and not stale:
                continue
            score, verdict = judged.get((item_id, label.evaluator), (None, Verdict.NONE))
            rows.append(LabelRow(label, item_id, index, repetition, is_stale, score, verdict))
    return rows


def _judge_verdicts(run: Run, item_ids: list[int]) -> dict[tuple[int, str], tuple[Any, Verdict]]:
    marks = pass_marks(run.config.get("evaluators", []))
    found = {}
    for item_id, name, score, status in Evaluation.objects.filter(item_id__in=item_ids).values_list(
        "item_id", "evaluator", "score", "status"
    ):
        error = status != Evaluation.Status.OK
        found[item_id, name] = (score, evaluation_verdict(score, marks.get(name), error=error))
    return found


def labels_by_item(
    run: Run, *, item_ids: list[int] | None = None, rows: list[LabelRow] | None = None
) -> dict[int, list[dict[str, Any]]]:
    """Every label row of the run (of `item_ids` only, when given) as JSON, by item id (the
    results file and exports). `rows`: already read with `run_labels`."""
    found: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in run_labels(run, item_ids=item_ids) if rows is None else rows:
        found[row.item_id].append(row.as_json())
    return dict(found)


def label_summary(run: Run, *, rows: list[LabelRow] | None = None) -> dict[str, Any]:
    """Counts for a run: labels, items labelled, reviewers, stale labels and disagreements.
    `rows`: every row of the run, already read with `run_labels`."""
    rows = run_labels(run) if rows is None else rows
    current = [row for row in rows if not row.stale]
    return {
        "labels": len(current),
        "stale": len(rows) - len(current),
        "itemsLabelled": len({row.item_id for row in current}),
        "reviewers": sorted({row.label.reviewer for row in current}),
        "disagreements": sum(row.disagrees for row in current),
    }


def find_item(
    run: Run,
    *,
    item_id: int | None = None,
    key: str | None = None,
    index: int | None = None,
    repetition: int = 0,
) -> ItemResult:
    """One item of the run: by id, or by item key or index (0-based; people's #N is N - 1)
    and repetition (0-based); else `LabelNotFound` naming what was looked for."""
    items = ItemResult.objects.filter(run=run).only(
        "id", "item_key", "item_index", "run_index", "input"
    )
    again = f" (repetition {repetition})" if repetition else ""
    if item_id is not None:
        found, wanted = items.filter(id=item_id).first(), f"id {item_id}"
    elif index is not None:
        found = items.filter(item_index=index, run_index=repetition).first()
        wanted = f"number #{index + 1}{again}"
    else:
        found = items.filter(item_key=key, run_index=repetition).first()
        wanted = f"key {key!r}{again}"
    if found is None:
        raise LabelNotFound(f"item: run {run.id} has no item with {wanted}")
    return found


def label_list(
    run: Run,
    *,
    item_id: int | None = None,
    evaluator: str | None = None,
    reviewer: str | None = None,
    stale: bool = True,
    disagrees: bool = False,
) -> list[LabelRow]:
    """The label rows the doors list: the run's, or one item's (`LabelNotFound` when the run
    has no item with that id), filtered; `disagrees`: only current labels that disagree."""
    if item_id is not None:
        find_item(run, item_id=item_id)
    rows = run_labels(
        run,
        item_ids=None if item_id is None else [item_id],
        evaluator=evaluator,
        reviewer=reviewer,
        stale=stale and not disagrees,
    )
    return [row for row in rows if row.disagrees] if disagrees else rows


def saved_row(run: Run, item_id: int, label: Label) -> LabelRow:
    """A label just saved on an item of the run, as the run shows it."""
    rows = run_labels(run, item_ids=[item_id], evaluator=label.evaluator, reviewer=label.reviewer)
    return next(row for row in rows if row.label.id == label.id)


# The review queue ---------------------------------------------------------------------------


@dataclass
class ReviewQueue:
    """The items of a run to review for one evaluator, in order, and which are done."""

    run: Run
    evaluator: str
    item_ids: list[int]
    reviewed: set[int]  # by this reviewer, on the current output

    @property
    def total(self) -> int:
        return len(self.item_ids)

    @property
    def done(self) -> int:
        return len(self.reviewed)

    def next_after(self, item_id: int | None) -> int | None:
        """The first unreviewed item after `item_id` (wrapping round), or None when all are."""
        start = self.item_ids.index(item_id) + 1 if item_id in self.item_ids else 0
        ordered = self.item_ids[start:] + self.item_ids[:start]
        return next((i for i in ordered if i not in self.reviewed), None)

    def neighbours(self, item_id: int) -> tuple[int | None, int | None]:
        """The items before and after `item_id` in the queue, reviewed or not."""
        if item_id not in self.item_ids:
            return None, None
        at = self.item_ids.index(item_id)
        before = self.item_ids[at - 1] if at > 0 else None
        after = self.item_ids[at + 1] if at + 1 < len(self.item_ids) else None
        return before, after


def default_review_evaluator(run: Run) -> str | None:
    """The evaluator a review starts with: the first LLM judge, else the first evaluator."""
    described = run.config.get("evaluators", [])
    judges = [e["name"] for e in described if e.get("type") == "llm-judge"]
    return (judges or run.evaluator_names or [None])[0]


def review_queue(run: Run, evaluator: str, *, reviewer: str) -> ReviewQueue:
    """The judge's failures (lowest score first) and borderline items, then every other item
    the evaluator scored or errored on, shuffled by a seed of the run and evaluator."""
    check_evaluator(run, evaluator)
    mark = pass_marks(run.config.get("evaluators", [])).get(evaluator)
    first: list[tuple[int, float, int]] = []
    rest: list[int] = []
    for item_id, score, status in (
        Evaluation.objects.filter(run=run, evaluator=evaluator)
        .order_by("item_id")
        .values_list("item_id", "score", "status")
    ):
        verdict = evaluation_verdict(score, mark, error=status != Evaluation.Status.OK)
        if verdict in (Verdict.FAIL, Verdict.BORDERLINE):
            first.append((verdict != Verdict.FAIL, score, item_id))
        else:
            rest.append(item_id)
    random.Random(f"{run.id}:{evaluator}").shuffle(rest)
    ordered = [item_id for *_, item_id in sorted(first)] + rest
    reviewed = {
        row.item_id for row in run_labels(run, evaluator=evaluator, reviewer=reviewer, stale=False)
    }
    return ReviewQueue(run, evaluator, ordered, reviewed & set(ordered))
