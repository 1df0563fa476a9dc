"""The output schemas the tools declare (`outputSchema`); their structured content is
validated against them by the SDK before it is sent. Fields not named here may be added."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ItemCounts(Open):
    total: int
    failing: int = Field(
        description="Errors, timeouts, evaluation errors, scores below their evaluator's pass "
        "mark (pass_threshold, 0.5 unless set)."
    )
    passing: int
    notRun: int = Field(description="Cancelled or pending items (not listed).")
    shown: int
    failingShown: int


class Omitted(Open):
    failingItems: int
    otherItems: int
    fieldLimit: int = Field(description="Characters kept of any one string.")
    fetch: list[dict[str, Any]] = Field(description="The cobalt_results calls that fetch them.")
    note: str


class Page(Open):
    filter: dict[str, Any]
    offset: int
    limit: int
    returned: int
    matched: int
    nextOffset: int | None = Field(description="Where the next page starts; null at the end.")
    fieldLimit: int


class Gate(Open):
    passed: bool
    checks: int = Field(description="How many checks `cobalt run --ci` made on the run.")
    violations: list[str] = Field(description="Each failed check: `exact avg 0.5 < 0.8`.")


class RunDocument(Open):
    """One run in the results-file format, its items chosen to fit the token budget."""

    id: str
    name: str
    timestamp: str
    status: str
    file: str | None = None
    summary: dict[str, Any] | None = None
    calibration: dict[str, Any] | None = Field(
        None,
        description="Per judge: agreement with people's labels (κ, TPR/TNR lower bounds), "
        "its certificate (`summary`: calibrated, or the labels still needed) and the pass "
        "rate corrected for its errors.",
    )
    resultsFile: str | None = Field(None, description="Every item, in the project folder.")
    budgetTokens: int
    gate: Gate | None = Field(
        None,
        description="What `cobalt run --ci` decides for this run alone (its thresholds, no "
        "baseline); null while it runs.",
    )
    items: list[dict[str, Any]] = Field(
        description="Items in dataset order; failing ones carry `problems`, shortened ones "
        "`shortened`."
    )
    itemCounts: ItemCounts | None = None
    omitted: Omitted | None = Field(None, description="What did not fit, and how to get it.")
    page: Page | None = None


class Modules(Open):
    projectModulesReimported: int
    outsideProject: list[str] = Field(description="Modules from outside the project in use.")
    reloadedOutsideProject: list[str] = Field(description="Of those, edited and reloaded.")


class RunOutput(Open):
    """`cobalt_run`: one entry in `runs` per experiment run, always a list."""

    runs: list[RunDocument]
    loadErrors: list[str]
    modules: Modules
    orphanedThreads: list[str]


class RunOverview(Open):
    id: str
    name: str
    status: str
    total: int
    avgScore: float | None


class ResultsOutput(Open):
    """`cobalt_results`: with `runId`, that run (a RunDocument); without, `count` and `runs`."""

    count: int | None = None
    runs: list[RunOverview] | None = None
    id: str | None = None
    items: list[dict[str, Any]] | None = None


class ChangesPage(Open):
    offset: int
    returned: int
    total: int
    nextOffset: int | None


class CompareOutput(Open):
    runA: dict[str, Any]
    runB: dict[str, Any]
    evaluators: dict[str, Any]
    matchedItems: int
    regressions: list[dict[str, Any]]
    improvements: list[dict[str, Any]]
    regressionCount: int
    improvementCount: int
    regressionsPage: ChangesPage
    improvementsPage: ChangesPage


class LabelSummary(Open):
    labels: int = Field(description="Current labels (given on the output the run has).")
    stale: int = Field(description="Labels given on an output of the item that changed since.")
    itemsLabelled: int
    reviewers: list[str]
    disagreements: int


class LabelsOutput(Open):
    """`cobalt_labels`: the run's label counts and a page of its labels."""

    runId: str
    name: str
    status: str
    summary: LabelSummary
    filter: dict[str, Any]
    labels: list[dict[str, Any]] = Field(
        description="In item order: reviewer, verdict, score, note, expectedOutput, stale, "
        "judgeScore, judgeVerdict, disagrees."
    )
    page: ChangesPage


class DisagreementsOutput(Open):
    """`cobalt_judge_disagreements`: the agreement and a page of disagreements."""

    judge: str
    run: str
    experiment: str
    labels: int
    agreement: dict[str, Any]
    disagreements: list[dict[str, Any]] = Field(
        description="In item order: input, output, judgeScore, judgeVerdict, judgeReason, "
        "label, reviewer, note."
    )
    page: ChangesPage


class PairwiseOutput(Open):
    """`cobalt_pairwise`: run B's win rate over run A, ties half."""

    judge: str
    runA: str
    runB: str
    n: int
    wins: int
    tied: int
    losses: int
    winRate: float | None
    low: float | None
    high: float | None
    errors: int
    items: list[dict[str, Any]]


class GenerateOutput(Open):
    path: str
    name: str
    agentFile: str
    function: str
    itemCount: int
    overwritten: bool
    verified: bool
    trial: dict[str, Any] | None
    notes: list[str]


class SweepOutput(Open):
    """`cobalt_sweep`: which variant is best and why (`sweeps` empty when there is none)."""

    id: str | None = None
    name: str | None = None
    best: str | None = Field(default=None, description="The best variant's label.")
    default: str | None = None
    ranking: list[str] = Field(default_factory=list)
    pareto: list[str] = Field(default_factory=list, description="Pareto-optimal variants.")
    verdict: str | None = Field(default=None, description="Which is best and why, in words.")
    variants: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Per variant: totals, rank, vsBest (paired test against the best; pHolm).",
    )
