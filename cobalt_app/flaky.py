"""Flaky items: the items of an experiment whose verdict flips between runs and repetitions.

An *observation* is one finished item result of one run of the experiment (one repetition).
It passes when the agent answered and every scored evaluation reached its evaluator's pass
mark (`cobalt.verdict`: an item fails when any evaluation fails; or one `pass_score` for all,
when asked); it fails when one fell short or the item errored or timed out. Every observation
is judged by the marks of the newest run looked at: a flip says the scores moved, not that a
`pass_threshold` was changed between runs. Observations with no scored evaluation
(evaluator errors only) have no verdict and are left out. Observations are ordered by run
creation, then repetition; an item's *flip rate* is the share of consecutive observations
whose verdict differs, and its *score variance* is the population variance of each
evaluator's scores. An item is flaky when its verdict flipped at least once (or, when asked,
when an evaluator's score stddev reaches `min_stddev`).

`item_flakiness()` is the computation over plain observations; the other functions read the
stored history. Rejudged runs are left out: they score the same outputs again.
"""

from __future__ import annotations

import difflib
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet

from cobalt import verdict
from cobalt.errors import NotFoundError
from cobalt_app.models import Evaluation, ItemResult, Run
from cobalt_app.selectors import experiment_names

HISTORY_RUNS = 20
VERDICT_STATUSES = (ItemResult.Status.OK, ItemResult.Status.ERROR, ItemResult.Status.TIMEOUT)


@dataclass(frozen=True)
class Observation:
    """One repetition of one item in one run: its status, its scored evaluations and the pass
    marks of that run's evaluators."""

    run_id: str
    run_index: int
    key: str
    index: int
    status: str
    scores: dict[str, float] = field(default_factory=dict)
    marks: dict[str, float] = field(default_factory=dict)


@dataclass
class ItemFlakiness:
    key: str
    index: int
    observations: int = 0
    passes: int = 0
    fails: int = 0
    errors: int = 0
    flips: int = 0
    runs: int = 0
    variance: dict[str, float] = field(default_factory=dict)
    flaky: bool = False

    @property
    def flip_rate(self) -> float:
        return self.flips / (self.observations - 1) if self.observations > 1 else 0.0

    @property
    def pass_rate(self) -> float | None:
        return self.passes / self.observations if self.observations else None

    @property
    def max_variance(self) -> tuple[str | None, float]:
        """(evaluator, variance) of the evaluator whose scores vary most."""
        if not self.variance:
            return None, 0.0
        name = max(self.variance, key=lambda n: (self.variance[n], n))
        return name, self.variance[name]

    @property
    def summary(self) -> str:
        """`flipped 3× in 8 observations (pass rate 0.62)` — a tooltip on the run page."""
        rate = self.pass_rate
        text = f"flipped {self.flips}× in {self.observations} observations"
        if rate is not None:
            text += f" (pass rate {rate:.2f})"
        name, variance = self.max_variance
        if name is not None and variance > 0:
            text += f"; {name} stddev {math.sqrt(variance):.2f}"
        return text

    def to_dict(self) -> dict[str, Any]:
        name, variance = self.max_variance
        return {
            "key": self.key,
            "index": self.index,
            "flaky": self.flaky,
            "observations": self.observations,
            "runs": self.runs,
            "passes": self.passes,
            "fails": self.fails,
            "errors": self.errors,
            "flips": self.flips,
            "flipRate": self.flip_rate,
            "passRate": self.pass_rate,
            "scoreVariance": self.variance,
            "maxVariance": {"evaluator": name, "variance": variance},
        }


def observation_passed(observation: Observation, *, pass_score: float | None = None) -> bool | None:
    """True/False, or None when the observation has no verdict (nothing was scored): the
    item's verdict (`cobalt.verdict.item_verdict`) by each evaluator's pass mark, or by
    `pass_score` for every evaluator when given."""
    if observation.status != ItemResult.Status.OK:
        return False
    if not observation.scores:
        return None
    verdicts = (
        verdict.score_verdict(
            score, observation.marks.get(name) if pass_score is None else pass_score
        )
        for name, score in observation.scores.items()
    )
    return verdict.item_verdict(verdicts).passed


def item_flakiness(
    observations: Iterable[Observation],
    *,
    pass_score: float | None = None,
    min_stddev: float | None = None,
) -> dict[str, ItemFlakiness]:
    """Per item key: verdict counts, flips, flip rate and score variance, in the given order."""
    result: dict[str, ItemFlakiness] = {}
    last_verdict: dict[str, bool] = {}
    runs_seen: dict[str, set[str]] = defaultdict(set)
    scores: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for observation in observations:
        key = observation.key
        item = result.get(key)
        if item is None:
            item = result[key] = ItemFlakiness(key=key, index=observation.index)
        item.index = observation.index
        runs_seen[key].add(observation.run_id)
        for name, score in observation.scores.items():
            scores[key][name].append(score)
        passed = observation_passed(observation, pass_score=pass_score)
        if passed is None:
            continue
        item.observations += 1
        item.passes += passed
        item.fails += not passed
        item.errors += observation.status != ItemResult.Status.OK
        if key in last_verdict and last_verdict[key] != passed:
            item.flips += 1
        last_verdict[key] = passed
    for key, item in result.items():
        item.runs = len(runs_seen[key])
        item.variance = {name: _variance(values) for name, values in scores[key].items()}
        stddev = math.sqrt(item.max_variance[1])
        noisy = min_stddev is not None and stddev >= min_stddev - 1e-9  # float noise
        item.flaky = item.flips > 0 or noisy
    return result


def _variance(values: Sequence[float]) -> float:
    mean = math.fsum(values) / len(values)
    return math.fsum((v - mean) ** 2 for v in values) / len(values)


def ranked(items: Iterable[ItemFlakiness]) -> list[ItemFlakiness]:
    """Flaky first, then by flip rate, flips and score variance; ties by key."""
    return sorted(
        items,
        key=lambda i: (not i.flaky, -i.flip_rate, -i.flips, -i.max_variance[1], i.key),
    )


# --- reading the history ---------------------------------------------------------------------


class UnknownExperiment(NotFoundError):
    pass


def history(experiment: str, *, last: int = HISTORY_RUNS, until: Run | None = None) -> QuerySet:
    """The ids of the experiment's latest `last` finished runs (not rejudged), newest first."""
    runs = Run.objects.filter(name=experiment, status__in=Run.FINISHED, parent__isnull=True)
    if until is not None:
        runs = runs.filter(created_at__lte=until.created_at)
    return runs.order_by("-created_at", "-id").values("id")[:last]


def history_runs(
    experiment: str, *, last: int = HISTORY_RUNS, until: Run | None = None
) -> list[str]:
    """The ids of the runs `history()` picks, oldest first."""
    ids = history(experiment, last=last, until=until).values_list("id", flat=True)
    return list(reversed(ids))


def observations(
    runs: QuerySet | Sequence[str],
    *,
    keys: Iterable[str] | None = None,
    pass_marks: dict[str, float] | None = None,
) -> list[Observation]:
    """Every finished repetition of the runs' items (only `keys` when given), in run order,
    each with its run's pass marks (`pass_marks` when every run has the same ones).

    The items joined (left) to their evaluations, so an errored item without any evaluation
    is still observed, in one query; the runs' evaluators (for their pass marks) in another,
    unless given. `runs` is a list of run ids or a `history()` subquery.
    """
    marks: dict[str, dict[str, float]] = {}
    if pass_marks is None:
        configured = Run.objects.filter(id__in=runs).values_list("id", "config__evaluators")
        marks = {run_id: verdict.pass_marks(described or []) for run_id, described in configured}
    items = ItemResult.objects.filter(run_id__in=runs, status__in=VERDICT_STATUSES)
    if keys is not None:
        items = items.filter(item_key__in=list(keys))
    rows = items.order_by("run__created_at", "run_id", "run_index", "item_index").values_list(
        "id",
        "run_id",
        "run_index",
        "item_key",
        "item_index",
        "status",
        "evaluations__evaluator",
        "evaluations__score",
        "evaluations__status",
    )
    found: list[Observation] = []
    current_id = None
    for item_id, run_id, run_index, key, index, status, name, score, state in rows.iterator(
        chunk_size=5000
    ):
        if item_id != current_id:
            found.append(
                Observation(
                    run_id, run_index, key, index, status, {}, marks.get(run_id, pass_marks or {})
                )
            )
            current_id = item_id
        if name is not None and state == Evaluation.Status.OK and score is not None:
            found[-1].scores[name] = score
    return found


@dataclass
class FlakyReport:
    experiment: str
    run_ids: list[str]
    items: list[ItemFlakiness]

    @property
    def flaky(self) -> list[ItemFlakiness]:
        return [item for item in self.items if item.flaky]

    def to_dict(self, *, limit: int | None = None) -> dict[str, Any]:
        flaky = self.flaky
        return {
            "experiment": self.experiment,
            "runs": self.run_ids,
            "itemsObserved": len(self.items),
            "flakyCount": len(flaky),
            "flaky": [item.to_dict() for item in flaky[:limit]],
        }


def check_experiment(experiment: str) -> None:
    """Raise UnknownExperiment, with the closest names, when no run has this name."""
    if Run.objects.filter(name=experiment).exists():
        return
    names = experiment_names()
    close = difflib.get_close_matches(experiment, names, n=3)
    hint = f"; did you mean {', '.join(repr(n) for n in close)}?" if close else ""
    known = f" (known: {', '.join(names[:10])})" if names and not close else ""
    raise UnknownExperiment(f"no runs of an experiment named {experiment!r}{hint}{known}")


def flaky_report(
    experiment: str,
    *,
    last: int = HISTORY_RUNS,
    pass_score: float | None = None,
    min_stddev: float | None = None,
    until: Run | None = None,
    keys: Iterable[str] | None = None,
) -> FlakyReport:
    """The items of an experiment ranked by flakiness over its latest `last` runs, judged by
    the pass marks of the newest of them."""
    run_ids = history_runs(experiment, last=last, until=until)
    newest = Run.objects.filter(id__in=run_ids[-1:]).values_list("config__evaluators", flat=True)
    marks = verdict.pass_marks(newest.first() or [])
    found = item_flakiness(
        observations(run_ids, keys=keys, pass_marks=marks),
        pass_score=pass_score,
        min_stddev=min_stddev,
    )
    return FlakyReport(experiment, run_ids, ranked(found.values()))


def flaky_marks(run: Run, keys: Iterable[str]) -> dict[str, ItemFlakiness]:
    """The flaky items among `keys` of a run, judged on its experiment's history up to it, by
    this run's pass marks."""
    keys = list(keys)
    if not keys:
        return {}
    marks = verdict.pass_marks((run.config or {}).get("evaluators", []))
    found = item_flakiness(observations(history(run.name, until=run), keys=keys, pass_marks=marks))
    return {key: item for key, item in found.items() if item.flaky}


def flaky_keys(experiment: str, *, last: int = HISTORY_RUNS) -> set[str]:
    return {item.key for item in flaky_report(experiment, last=last).flaky}


def repetitions(
    experiment: str, keys: Sequence[str], runs: int, repeat_flaky: int | None
) -> list[int]:
    """Repetitions per item for a new run: `runs`, or `repeat_flaky` for the flaky ones."""
    of = repeats(experiment, runs, repeat_flaky)
    return [of(key) for key in keys]


def repeats(experiment: str, runs: int, repeat_flaky: int | None) -> Callable[[str], int]:
    """Repetitions of an item, by its key, for a new run: `runs`, or `repeat_flaky` for the
    flaky ones (the experiment's history is read once, here)."""
    if not repeat_flaky or repeat_flaky <= runs:
        return lambda key: runs
    flaky = flaky_keys(experiment)
    return lambda key: repeat_flaky if key in flaky else runs
