"""`cobalt calibrate JUDGE --probes`: how far a judge's verdicts move when nothing that
matters changed, on the items people labelled.

- verbosity: the same output padded with irrelevant text. A scoring judge's verdict should
  not change; a pairwise judge asked "padded or not?" should not prefer the padded copy.
- self-consistency: the same input and output judged twice; the verdicts should match.
- position (pairwise judges): the output against the item's reference in both orders; the
  orders should agree (they disagree when the judge prefers a position).

The judge is the one the experiment file defines now (as `cobalt rejudge` uses), so a prompt
just edited is probed. Every call bypasses the judge cache: a cached answer would always be
consistent with itself. Counts, not just rates, are reported.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from cobalt.config import Config
from cobalt.evaluator import Evaluator
from cobalt.verdict import score_verdict
from cobalt_app import aio, engine, labels, rejudge
from cobalt_app.evaluators import EvalTarget, evaluate
from cobalt_app.evaluators.base import EvaluationError
from cobalt_app.evaluators.pairwise import judge_pair, pair_prompt, pair_text
from cobalt_app.judge_loop import NoLabels, how_to_label, judge_run
from cobalt_app.models import ItemResult

CONCURRENCY = 8
PADDING = (
    "\n\nAdditional notes: this response was prepared carefully. In general, many factors can "
    "be relevant to questions of this kind, and it is often useful to consider them from "
    "several perspectives before drawing conclusions. Background information, historical "
    "context and general best practices may also be of interest to some readers, although "
    "they do not change the answer given above. Thank you for reading this response."
)


@dataclass
class Probe:
    """One probe's counts: of `n` items judged both ways, `flips` moved (`to_pass` of them
    from fail to pass, `to_fail` the other way); `errors` could not be judged."""

    name: str
    about: str
    moved: str  # what a flip is, as the report says it: "verdict changed", "orders disagreed"
    directional: bool = True  # flips of a pass/fail verdict: toward pass or toward fail
    n: int = 0
    flips: int = 0
    to_pass: int = 0
    to_fail: int = 0
    errors: int = 0
    error_messages: list[str] = field(default_factory=list)

    def count(self, before: Any, after: Any, error: str = "") -> None:
        """One item's verdicts (pass/fail, or a pair's "win"/"tie"/"loss"); None: not judged."""
        if error or before is None or after is None:
            self.errors += 1
            if error and error not in self.error_messages and len(self.error_messages) < 3:
                self.error_messages.append(error)
            return
        self.n += 1
        if before != after:
            self.flips += 1
            self.to_pass += after is True
            self.to_fail += after is False

    def as_dict(self) -> dict[str, Any]:
        return {
            "probe": self.name,
            "about": self.about,
            "moved": self.moved,
            "n": self.n,
            "flips": self.flips,
            "flipRate": self.flips / self.n if self.n else None,
            "toPass": self.to_pass if self.directional else None,
            "toFail": self.to_fail if self.directional else None,
            "errors": self.errors,
            "errorMessages": self.error_messages,
        }


def run_probes(config: Config, judge: str, run_id: str | None = None) -> dict[str, Any]:
    """Probe `judge` on the labelled items of the run (`judge_loop.judge_run`)."""
    run = judge_run(judge, run_id)
    _, experiment, _ = rejudge.prepare(config, run.id, judge)
    evaluator = next(e for e in experiment.evaluators if e.name == judge)
    ids = sorted({row.item_id for row in labels.run_labels(run, evaluator=judge, stale=False)})
    if not ids:
        raise NoLabels(how_to_label(run, judge))
    items = list(ItemResult.objects.filter(id__in=ids).order_by("item_index", "run_index"))
    db = aio.DatabaseThread()
    try:
        env = engine.make_env(config, db, no_cache=True)
        pairwise = evaluator.type == "pairwise"
        probes = aio.run((_pairwise if pairwise else _scoring)(evaluator, items, env))
    finally:
        db.close()
    return {
        "judge": judge,
        "type": evaluator.type,
        "run": run.id,
        "experiment": run.name,
        "items": len(items),
        "probes": [p.as_dict() for p in probes],
    }


async def _scoring(evaluator: Evaluator, items: list[ItemResult], env: Any) -> list[Probe]:
    verbosity = Probe("verbosity", "the output padded with irrelevant text", "verdict changed")
    consistency = Probe(
        "self-consistency", "the same input and output judged twice", "verdict changed"
    )
    mark = evaluator.describe().get("pass_threshold")
    gate = asyncio.Semaphore(CONCURRENCY)

    async def verdict(item: ItemResult, output: Any) -> tuple[bool | None, str]:
        target = EvalTarget(item=item.input, output=output, metadata=item.metadata or {})
        outcome = await evaluate(evaluator, target, env)
        if outcome.status != "ok":
            return None, outcome.error
        return score_verdict(outcome.score, mark).passed, ""

    async def one(item: ItemResult) -> None:
        async with gate:
            first, error = await verdict(item, item.output)
            second, error_2 = await verdict(item, item.output)
            padded, error_3 = await verdict(item, pair_text(item.output) + PADDING)
        consistency.count(first, second, error or error_2)
        verbosity.count(first, padded, error or error_3)

    await asyncio.gather(*(one(item) for item in items))
    return [verbosity, consistency]


async def _pairwise(evaluator: Evaluator, items: list[ItemResult], env: Any) -> list[Probe]:
    position = Probe(
        "position", "the output against the reference, in both orders", "orders disagreed", False
    )
    verbosity = Probe(
        "verbosity", "the output against itself padded", "padded copy preferred", False
    )
    consistency = Probe("self-consistency", "the same pair judged twice", "outcome changed", False)
    reference = evaluator.field or "expected_output"
    gate = asyncio.Semaphore(CONCURRENCY)

    async def outcome(item: ItemResult, baseline: Any, candidate: Any):
        try:
            judged = await judge_pair(
                evaluator, pair_prompt(evaluator, item.input), baseline, candidate, env
            )
        except EvaluationError as exc:
            return None, str(exc)
        return judged, ""

    async def one(item: ItemResult) -> None:
        async with gate:
            padded, error = await outcome(item, item.output, pair_text(item.output) + PADDING)
            verbosity.count(False, None if padded is None else padded.outcome == "win", error)
            if reference not in item.input:
                position.count(None, None, f"the item has no {reference!r} field to compare with")
                return
            first, error = await outcome(item, item.input[reference], item.output)
            again, error_2 = await outcome(item, item.input[reference], item.output)
        position.count(False, None if first is None else first.orders_disagree, error)
        consistency.count(
            None if first is None else first.outcome,
            None if again is None else again.outcome,
            error or error_2,
        )

    await asyncio.gather(*(one(item) for item in items))
    return [position, verbosity, consistency]
