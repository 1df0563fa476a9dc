"""`cobalt rejudge RUN [--evaluator NAME]`: score the stored outputs again, without the agent.

A re-judge is a new run linked to the original (`Run.parent`). Its items are copies of the
original's, outputs included. The evaluators (all, or the one named) come from the
experiment file as it is now — say, after a judge prompt changed. The other evaluators'
verdicts are copied (marked cached, costing nothing). Items that errored or timed out have
no output to score and are copied as they were. With `labelled=True` (`--labelled`) only the
items people labelled for the re-judged evaluators are scored again; the others keep every
verdict, copied: the quick step of the alignment loop (edit the prompt, re-judge the labelled
items, see the agreement move, `cobalt calibrate`). Embedded mode scores in this process; team
mode enqueues it, like any team run: the same lanes, whose step re-scores instead of executing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import transaction

from cobalt.config import Config
from cobalt.errors import CobaltError
from cobalt.experiments import Experiment
from cobalt_app import aio, calibration, engine, preflight, services
from cobalt_app.engine import Reporter
from cobalt_app.models import Evaluation, ItemResult, ItemTrace, JudgeCall, Label, Run, RunTag
from cobalt_app.runs import claims, embedded, lifecycle

COPY_BATCH = 2000


class RejudgeError(CobaltError):
    """The run cannot be re-judged; the message says why and what to do."""


def prepare(config: Config, run_id: str, evaluator: str | None = None):
    """(original run, its experiment as the file defines it now, evaluator names to re-run)."""
    from cobalt_app.launcher import load_experiments
    from cobalt_app.selectors import run_get

    parent = run_get(run_id)
    if not parent.is_finished:
        raise RejudgeError(
            f"run {parent.id} is {parent.status}; wait for it (cobalt watch {parent.id}) "
            f"or stop it (cobalt cancel {parent.id}) first"
        )
    if not parent.file:
        raise RejudgeError(
            f"run {parent.id} has no experiment file recorded; it cannot be re-judged"
        )
    experiments, errors, _ = load_experiments(config, [parent.file])
    if errors:
        raise RejudgeError(f"{parent.file} failed to import: {errors[0].error}")
    experiment = next((e for e in experiments if e.name == parent.name), None)
    if experiment is None:
        raise RejudgeError(f"{parent.file} no longer defines an experiment named {parent.name!r}")
    names = [e.name for e in experiment.evaluators]
    if evaluator is not None and evaluator not in names:
        raise RejudgeError(
            f"experiment {parent.name!r} has no evaluator named {evaluator!r}; "
            f"it has: {', '.join(names) or 'none'}"
        )
    selected = [evaluator] if evaluator else names
    if not selected:
        raise RejudgeError(f"experiment {parent.name!r} has no evaluators to run")
    rescored = dataclasses.replace(
        experiment, evaluators=[e for e in experiment.evaluators if e.name in selected]
    )
    try:
        preflight.check([rescored], config)
    except preflight.PreflightError as exc:
        raise RejudgeError(str(exc)) from None
    return parent, experiment, selected


def rejudge_create(
    parent: Run,
    experiment: Experiment,
    selected: list[str],
    *,
    mode: str = Run.Mode.EMBEDDED,
    project_dir: Path | None = None,
    extra_config: dict[str, Any] | None = None,
    judge_config: dict[str, Any] | None = None,
    labelled: bool = False,
) -> Run:
    """The new run: items and outputs copied, the other evaluators' verdicts copied (and,
    with `labelled`, every verdict of the items nobody labelled for `selected`). The
    re-judged evaluators get new judge keys (`judge_config`: the project's `[judge]`)."""
    described = {e.name: e.describe() for e in experiment.evaluators}
    evaluators = [
        described[e["name"]] if e["name"] in selected else e
        for e in parent.config.get("evaluators", [])
    ]
    evaluators += [described[n] for n in selected if n not in {e["name"] for e in evaluators}]
    fresh = calibration.judge_keys([described[n] for n in selected], judge_config)
    config = {
        **parent.config,
        **(extra_config or {}),
        "judgeKeys": {**(parent.config.get("judgeKeys") or {}), **fresh},
        "evaluators": services._json_safe(evaluators),
        "rejudge": {"of": parent.id, "evaluators": selected, "labelled": labelled},
    }
    only = labelled_keys(parent, selected) if labelled else None
    with transaction.atomic():
        run = Run.objects.create(
            name=parent.name,
            file=parent.file,
            mode=mode,
            tags=parent.tags,
            config=config,
            total_items=parent.total_items,
            parent=parent,
            git_commit=services.git_commit(project_dir),
        )
        RunTag.objects.bulk_create([RunTag(run=run, name=t) for t in parent.tags])
        finished = 0
        batch: list[ItemResult] = []
        originals = ItemResult.objects.filter(run=parent).order_by("id")
        for item in originals.iterator(chunk_size=COPY_BATCH):
            scored = item.status == ItemResult.Status.OK and (only is None or item.item_key in only)
            finished += not scored
            batch.append(_copy(item, run, scored))
            if len(batch) >= COPY_BATCH:
                _flush(batch, parent, run, selected)
                batch = []
        _flush(batch, parent, run, selected)
        Run.objects.filter(id=run.id).update(finished_items=finished)
    run.finished_items = finished
    return run


def labelled_keys(parent: Run, selected: list[str]) -> set[str]:
    """The item keys of `parent` with a label for one of `selected`; none is an error."""
    keys = set(
        Label.objects.filter(experiment=parent.name, evaluator__in=selected).values_list(
            "item_key", flat=True
        )
    )
    if not keys:
        raise RejudgeError(
            f"no labels of {', '.join(map(repr, selected))} on experiment {parent.name!r} yet: "
            f"label items on the review page (cobalt dashboard, then run {parent.id} → Review) "
            "or import them with `cobalt labels import FILE`"
        )
    return keys


def _copy(item: ItemResult, run: Run, scored: bool) -> ItemResult:
    return ItemResult(
        run=run,
        item_index=item.item_index,
        run_index=item.run_index,
        item_key=item.item_key,
        input=item.input,
        output=item.output,
        metadata=item.metadata,
        status=ItemResult.Status.PENDING if scored else item.status,
        error=item.error,
        traceback=item.traceback,
        latency_ms=item.latency_ms,
        tokens=item.tokens,
        cost=item.cost,
        started_at=item.started_at,
        finished_at=None if scored else item.finished_at,
    )


def _copy_judge_calls(
    parent: Run,
    created: list[ItemResult],
    new_ids: dict[tuple[int, int], int],
    selected: list[str],
    rescored: set[tuple[int, int]],
) -> None:
    """The judge calls behind the evaluations kept from the parent run, kept with them."""
    calls = JudgeCall.objects.filter(
        item__run=parent,
        item__item_index__gte=created[0].item_index,
        item__item_index__lte=created[-1].item_index,
    ).values_list("item__item_index", "item__run_index", "evaluator", "data")
    JudgeCall.objects.bulk_create(
        [
            JudgeCall(item_id=new_ids[(index, repetition)], evaluator=evaluator, data=data)
            for index, repetition, evaluator, data in calls
            if (index, repetition) in new_ids
            and not (evaluator in selected and (index, repetition) in rescored)
        ],
        batch_size=500,
        ignore_conflicts=True,
    )


def _flush(batch: list[ItemResult], parent: Run, run: Run, selected: list[str]) -> None:
    if not batch:
        return
    created = ItemResult.objects.bulk_create(batch)
    new_ids = {(i.item_index, i.run_index): i.id for i in created}
    kept = Evaluation.objects.filter(
        run=parent,
        item__status=ItemResult.Status.OK,
        item__item_index__gte=created[0].item_index,
        item__item_index__lte=created[-1].item_index,
    ).values_list(
        "item__item_index",
        "item__run_index",
        "evaluator",
        "score",
        "reason",
        "status",
        "error",
        "chain_of_thought",
    )
    rescored = {
        (i.item_index, i.run_index) for i in created if i.status == ItemResult.Status.PENDING
    }
    copies = [
        Evaluation(
            item_id=new_ids[(index, repetition)],
            run=run,
            evaluator=evaluator,
            score=score,
            reason=reason,
            status=status,
            error=error,
            chain_of_thought=thought,
            cached=True,  # reused, not paid for again
        )
        for index, repetition, evaluator, score, reason, status, error, thought in kept
        if (index, repetition) in new_ids
        and not (evaluator in selected and (index, repetition) in rescored)
    ]
    Evaluation.objects.bulk_create(copies, batch_size=1000, ignore_conflicts=True)
    _copy_judge_calls(parent, created, new_ids, selected, rescored)
    traces = ItemTrace.objects.filter(
        item__run=parent,
        item__item_index__gte=created[0].item_index,
        item__item_index__lte=created[-1].item_index,
    ).values_list("item__item_index", "item__run_index", "data", "blobs", "missing", "estimated")
    ItemTrace.objects.bulk_create(  # stored as they are: the blobs they refer to are too
        [
            ItemTrace(
                item_id=new_ids[(index, repetition)],
                data=data,
                blobs=blobs,
                missing=why,
                estimated=estimated,
            )
            for index, repetition, data, blobs, why, estimated in traces
            if (index, repetition) in new_ids
        ],
        batch_size=500,
        ignore_conflicts=True,
    )


def execute_embedded(
    run: Run,
    experiment: Experiment,
    config: Config,
    *,
    reporter: Reporter | None = None,
    no_cache: bool = False,
) -> Run:
    """Score a re-judge run in this process: an embedded run whose lanes' step is the
    evaluators (`runs.lane.step_for`), started, cancelled and finalised as every run."""
    db = aio.DatabaseThread()
    env = engine.make_env(config, db, no_cache=no_cache)
    try:
        return aio.run(embedded.drive_run(run, experiment, config, env, reporter=reporter))
    finally:
        db.close()


def rejudge(
    config: Config,
    run_id: str,
    *,
    evaluator: str | None = None,
    reporter: Reporter | None = None,
    no_cache: bool = False,
    on_notice: Callable[[str], None] | None = None,
    labelled: bool = False,
) -> Run:
    """Create the re-judge run and score it: in this process, or on the workers."""
    parent, experiment, selected = prepare(config, run_id, evaluator)
    if not config.team_mode:
        run = rejudge_create(
            parent,
            experiment,
            selected,
            project_dir=config.project_dir,
            judge_config=config.get("judge"),
            labelled=labelled,
        )
        return execute_embedded(run, experiment, config, reporter=reporter, no_cache=no_cache)
    from cobalt_app import team, team_wait

    team.ensure_schema()
    run = rejudge_create(
        parent,
        experiment,
        selected,
        mode=Run.Mode.TEAM,
        project_dir=config.project_dir,
        extra_config=team.team_settings(no_cache),
        judge_config=config.get("judge"),
        labelled=labelled,
    )
    ids = claims.item_ids(run.id, claims.UNFINISHED)
    team.enqueue(run.id, ids, cursor=True)
    if not ids:
        lifecycle.finish_if_done(run.id, config=config)
    if reporter is not None:
        reporter.run_started(run, experiment)
    try:
        return team_wait.wait(run.id, config, reporter=reporter, ids=ids, on_notice=on_notice)
    except KeyboardInterrupt:
        raise team_wait.Detached(run.id) from None
