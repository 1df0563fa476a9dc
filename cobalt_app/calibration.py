"""A judge's calibration against human labels, as every door shows it.

A judge is keyed by a hash of what decides its verdicts (`judge_key`): its type, prompt, the
model and provider it actually called, its pass mark and options. The key is stored with the
run (`config["judgeKeys"]`, computed where the project's `[judge]` defaults are known); runs
stored before it derive it from their evaluator descriptions. Labels pool across every run of
the experiment whose judge has the same key, so a judge whose prompt or model changed starts
again with no calibration until its labelled items are re-judged (`cobalt rejudge`).

A label counts when the output it was given on was judged by this judge (a run with the same
key scored it); labels on outputs this judge never saw are excluded and counted: "older
output" when the item's output changed since it was labelled, "other judge" when only another
version of the judge scored it. Several reviewers' labels on one output count once, by
majority; a split output is left out and counted. The statistics are `cobalt.calibration`'s.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from cobalt import calibration as stats
from cobalt.verdict import evaluation_verdict, pass_marks
from cobalt_app.labels import output_hash
from cobalt_app.models import Evaluation, ItemResult, Label, Run

JUDGE_TYPES = ("llm-judge", "pairwise")
UNKEYED = ("name", "base_url", "api_key_env")  # where the judge is reached, not what it says


def judge_key(described: Mapping[str, Any], judge_config: Mapping[str, Any] | None = None) -> str:
    """A hash of what decides an evaluator's verdicts: its description (name and endpoint
    aside) with, for an LLM judge, the provider and model it calls under `judge_config`
    (the project's `[judge]` table)."""
    from cobalt_app.evaluators.llm_judge import judge_settings

    keyed = {k: v for k, v in described.items() if k not in UNKEYED}
    if described.get("type") in JUDGE_TYPES:
        given = {k: described.get(k) for k in ("provider", "model", "base_url", "api_key_env")}
        target = judge_settings(SimpleNamespace(**given), dict(judge_config or {}))
        keyed.update(provider=target["provider"], model=target["model"])
    text = json.dumps(keyed, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def judge_keys(
    evaluators: Iterable[Mapping[str, Any]], judge_config: Mapping[str, Any] | None
) -> dict[str, str]:
    """`judge_key` of each described evaluator, by name (stored as `config["judgeKeys"]`)."""
    return {e["name"]: judge_key(e, judge_config) for e in evaluators if e.get("name")}


def run_judge_key(run: Run, evaluator: str) -> str | None:
    """The key of the run's `evaluator`: stored with the run, or derived from its description."""
    stored = (run.config or {}).get("judgeKeys") or {}
    if evaluator in stored:
        return stored[evaluator]
    for described in (run.config or {}).get("evaluators", []):
        if described.get("name") == evaluator:
            return judge_key(described, (run.config or {}).get("judge"))
    return None


def calibration_settings(run: Run) -> tuple[int, float]:
    """`[calibration] min_labels, min_rate` as the run was given them (defaults before)."""
    table = (run.config or {}).get("calibration") or {}
    return (
        int(table.get("min_labels", stats.DEFAULT_MIN_LABELS)),
        float(table.get("min_rate", stats.DEFAULT_MIN_RATE)),
    )


@dataclass
class EvaluatorCalibration:
    """One evaluator's calibration as a run shows it."""

    evaluator: str
    judge_key: str | None
    runs: int  # runs of the experiment with this judge key
    agreement: stats.Agreement
    certificate: stats.Certificate
    corrected: stats.CorrectedRate | None
    reviewers: stats.ReviewerAgreement
    excluded: dict[str, int] = field(default_factory=dict)

    @property
    def kappa_text(self) -> str:
        a = self.agreement
        if not a.ok:
            return f"{a.state} (n={a.n})"
        return f"κ {a.kappa:.2f} [{a.kappa_low:.2f}, {a.kappa_high:.2f}] (n={a.n})"

    @property
    def bounds_text(self) -> str:
        a = self.agreement
        return f"TPR ≥ {_fmt(a.tpr.low)}, TNR ≥ {_fmt(a.tnr.low)}"

    @property
    def excluded_text(self) -> str:
        words = {
            "olderOutput": "on an older output",
            "otherJudge": "judged only by another version of the judge",
            "split": "where reviewers split",
            "judgeError": "where the judge errored",
        }
        parts = [f"{n} {words[k]}" for k, n in self.excluded.items() if n]
        return f"labels left out: {', '.join(parts)}" if parts else ""

    @property
    def corrected_text(self) -> str:
        c = self.corrected
        if c is None or c.value is None:
            return ""
        return f"corrected {c.value:.1%} [{c.low:.1%}, {c.high:.1%}]"

    def line(self, *, corrected: bool = True) -> str:
        """One line for the terminal and the CI message."""
        parts = [self.kappa_text, self.bounds_text, self.certificate.summary]
        if corrected:
            parts.append(self.corrected_text)
        if self.reviewers.value is not None:
            parts.append(f"reviewers agree {self.reviewers.method} {self.reviewers.value:.2f}")
        return " · ".join(p for p in [*parts, self.excluded_text] if p)

    def as_dict(self) -> dict[str, Any]:
        return {
            "evaluator": self.evaluator,
            "judgeKey": self.judge_key,
            "runsPooled": self.runs,
            "agreement": self.agreement.as_dict(),
            "certificate": self.certificate.as_dict(),
            "calibrated": self.certificate.calibrated,
            "summary": self.certificate.summary,
            "correctedPassRate": self.corrected.as_dict() if self.corrected else None,
            "reviewerAgreement": self.reviewers.as_dict(),
            "excluded": dict(self.excluded),
            "line": self.line(),
        }


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def evaluator_calibration(
    run_id: str, evaluator: str, *, min_labels: int | None = None, min_rate: float | None = None
) -> EvaluatorCalibration:
    """The calibration of one evaluator of a run (`NotFoundError` when the run is unknown)."""
    from cobalt_app.selectors import run_get

    run = run_get(run_id)
    found = run_calibration(run, [evaluator], min_labels=min_labels, min_rate=min_rate)
    if evaluator not in found:
        from cobalt_app.labels import check_evaluator

        check_evaluator(run, evaluator)
    return found[evaluator]


def run_calibration(
    run: Run,
    evaluators: Iterable[str] | None = None,
    *,
    min_labels: int | None = None,
    min_rate: float | None = None,
) -> dict[str, EvaluatorCalibration]:
    """The calibration of the run's judges (LLM judges, and any evaluator with labels), by
    evaluator; `evaluators`: these instead. Thresholds: the run's `[calibration]` unless given."""
    names = list(run.evaluator_names if evaluators is None else evaluators)
    if not names:
        return {}
    stored_labels, stored_rate = calibration_settings(run)
    min_labels = stored_labels if min_labels is None else min_labels
    min_rate = stored_rate if min_rate is None else min_rate
    labels = list(
        Label.objects.filter(experiment=run.name, evaluator__in=names).values_list(
            "evaluator", "item_key", "output_hash", "reviewer", "verdict"
        )
    )
    types = {e.get("name"): e.get("type") for e in (run.config or {}).get("evaluators", [])}
    labelled = {row[0] for row in labels}
    if evaluators is None:
        names = [n for n in names if types.get(n) in JUDGE_TYPES or n in labelled]
    if not names:
        return {}
    judged = _judged_outputs(run, names, {row[1] for row in labels}) if labels else {}
    by_evaluator: dict[str, list[tuple[str, str, str, str]]] = defaultdict(list)
    for name, *rest in labels:
        by_evaluator[name].append(tuple(rest))  # type: ignore[arg-type]
    scores = (run.summary or {}).get("scores") or {}
    return {
        name: _calibrate(
            run,
            name,
            by_evaluator.get(name, []),
            judged.get(name, ({}, set(), 0)),
            scores.get(name) or {},
            min_labels,
            min_rate,
        )
        for name in names
    }


def _judged_outputs(
    run: Run, names: list[str], keys: set[str]
) -> dict[str, tuple[dict[tuple[str, str], tuple[float | None, bool | None]], set, int]]:
    """Per evaluator: the verdicts its judge (this run's key) gave each labelled output (the
    latest run's when several scored it), the outputs other versions judged, and how many
    runs share the key."""
    runs = list(Run.objects.filter(name=run.name).order_by("created_at").only("id", "config"))
    own = {name: run_judge_key(run, name) for name in names}
    keyed = {r.id: {name: run_judge_key(r, name) for name in names} for r in runs}
    marks = {r.id: pass_marks((r.config or {}).get("evaluators", [])) for r in runs}
    order = {r.id: index for index, r in enumerate(runs)}
    items = ItemResult.objects.filter(run_id__in=list(order), item_key__in=list(keys))
    outputs = {
        item_id: (run_id, key, output_hash(output))
        for item_id, run_id, key, output in items.values_list("id", "run_id", "item_key", "output")
    }
    found: dict[str, tuple[dict, set, int]] = {
        name: ({}, set(), sum(1 for r in runs if keyed[r.id][name] == own[name])) for name in names
    }
    rows = Evaluation.objects.filter(item_id__in=list(outputs), evaluator__in=names).values_list(
        "item_id", "evaluator", "score", "status"
    )
    for item_id, name, score, status in sorted(rows, key=lambda r: order[outputs[r[0]][0]]):
        run_id, key, digest = outputs[item_id]
        verdicts, others, _ = found[name]
        if keyed[run_id][name] != own[name]:
            others.add((key, digest))
            continue
        error = status != Evaluation.Status.OK
        passed = evaluation_verdict(score, marks[run_id].get(name), error=error).passed
        verdicts[key, digest] = (score, passed)
    return found


def _calibrate(
    run: Run,
    name: str,
    labels: list[tuple[str, str, str, str]],
    judged: tuple[dict[tuple[str, str], tuple[float | None, bool | None]], set, int],
    scores: Mapping[str, Any],
    min_labels: int,
    min_rate: float,
) -> EvaluatorCalibration:
    verdicts, others, runs = judged
    by_output: dict[tuple[str, str], list[bool]] = defaultdict(list)
    by_reviewer: dict[str, dict[str, bool]] = defaultdict(dict)
    for key, digest, reviewer, verdict in labels:
        by_output[key, digest].append(verdict == "pass")
        by_reviewer[reviewer][f"{key}\x00{digest}"] = verdict == "pass"
    excluded: Counter[str] = Counter()
    judge, human, judge_scores = [], [], []
    for output, given in by_output.items():
        if output not in verdicts:
            excluded["otherJudge" if output in others else "olderOutput"] += len(given)
            continue
        score, passed = verdicts[output]
        votes = sum(given)
        if passed is None:
            excluded["judgeError"] += len(given)
        elif votes * 2 == len(given):
            excluded["split"] += len(given)
        else:
            judge.append(passed)
            human.append(votes * 2 > len(given))
            judge_scores.append(float(score) if score is not None else 0.0)
    result = stats.agreement(judge, human, judge_scores=judge_scores)
    count, rate = int(scores.get("count") or 0), scores.get("passRate")
    corrected = None
    if count and rate is not None:
        seed = int(hashlib.sha256(f"{run.id}:{name}".encode()).hexdigest()[:8], 16)
        corrected = stats.corrected_pass_rate(round(rate * count), count, result, seed=seed)
    return EvaluatorCalibration(
        evaluator=name,
        judge_key=run_judge_key(run, name),
        runs=runs,
        agreement=result,
        certificate=stats.certify(result, min_labels=min_labels, min_rate=min_rate),
        corrected=corrected,
        reviewers=stats.reviewer_agreement(by_reviewer),
        excluded={k: excluded[k] for k in ("olderOutput", "otherJudge", "split", "judgeError")},
    )


def calibration_json(run: Run) -> dict[str, dict[str, Any]]:
    """Every calibrated-or-not judge of the run as JSON, by evaluator (API, MCP, results)."""
    return {name: found.as_dict() for name, found in run_calibration(run).items()}


@dataclass
class JudgeComparison:
    """One judge across two runs (compare): each run's calibration and the corrected delta."""

    evaluator: str
    a: EvaluatorCalibration
    b: EvaluatorCalibration
    raw_a: float | None
    raw_b: float | None
    delta: stats.CorrectedDelta

    @property
    def same_judge(self) -> bool:
        return self.a.judge_key == self.b.judge_key

    @property
    def verdict(self) -> str:
        d = self.delta
        if d.value is None:
            return f"no corrected delta: {d.state}"
        if d.within_error:
            return "within the judge's error"
        return "beyond the judge's error"

    def as_dict(self) -> dict[str, Any]:
        return {
            "evaluator": self.evaluator,
            "sameJudge": self.same_judge,
            "a": self.a.as_dict(),
            "b": self.b.as_dict(),
            "correctedDelta": self.delta.as_dict(),
            "verdict": self.verdict,
        }


def compare_calibration(a: Run, b: Run) -> list[JudgeComparison]:
    """The judges both runs have: raw and corrected pass rates, and whether B's change from A
    is within the judge's error (`cobalt.calibration.corrected_delta`)."""
    found_a, found_b = run_calibration(a), run_calibration(b)
    compared = []
    for name in [n for n in found_a if n in found_b]:
        ca, cb = found_a[name], found_b[name]
        counts = []
        rates = []
        for run in (a, b):
            values = ((run.summary or {}).get("scores") or {}).get(name) or {}
            count, rate = int(values.get("count") or 0), values.get("passRate")
            rates.append(rate)
            counts.append((round((rate or 0.0) * count), count if rate is not None else 0))
        seed = int(hashlib.sha256(f"{a.id}:{b.id}:{name}".encode()).hexdigest()[:8], 16)
        delta = stats.corrected_delta(
            counts[0],
            counts[1],
            ca.agreement,
            cb.agreement,
            shared=ca.judge_key == cb.judge_key,
            seed=seed,
        )
        compared.append(JudgeComparison(name, ca, cb, rates[0], rates[1], delta))
    return compared
