"""The experiment engine: execute one item and evaluate it.

`execute_item()` runs the agent on one snapshotted item (with its timeout) and then every
evaluator. It is the per-item step of every run (`cobalt_app.runs.lane.step_for`), whoever
executes it: a lane of the embedded mode or of a team worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from django.utils import timezone

from cobalt.config import Config, parse_ttl
from cobalt.experiments import Experiment, RunContext
from cobalt.intercept import Stub, as_stubs
from cobalt.run_settings import RUN_DEFAULTS, BudgetSettings
from cobalt_app import (
    batch_scoring,
    intercepts,
    recordings,
    runaway,
    socket_guard,
    storable,
    thread_scoring,
    trace_spans,
    trace_store,
    traces,
    transports,
)
from cobalt_app.aio import DatabaseThread, Then, Threads
from cobalt_app.conversation import (
    Conversation,
    ConversationError,
    TurnTimedOut,
    converse,
    is_transcript,
)
from cobalt_app.deadlines import DeadlineExceeded, within
from cobalt_app.evaluators import EvalOutcome, EvalTarget, evaluate, stopped_by_user_code
from cobalt_app.models import ItemResult, Run
from cobalt_app.pricing import agent_cost, agent_usage
from cobalt_app.providers import ProviderHub
from cobalt_app.ratelimit import limiter_for
from cobalt_app.services import ItemSnapshot
from cobalt_app.tracebacks import user_traceback

NOTHING_RETURNED = (
    "the runner returned nothing (the output is None): did it forget to `return` its output?"
)


@dataclass
class ItemOutcome:
    """What happened to one item: the agent's output and every evaluator's verdict."""

    id: int
    item_index: int
    run_index: int
    item_key: str
    status: str
    output: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    traceback: str = ""
    latency_ms: float | None = None
    tokens: int = 0
    cost: float = 0.0
    started_at: datetime | None = None
    finished_at: datetime | None = None
    evaluations: list[EvalOutcome] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)  # steps (see `trace_spans`)
    trace_missing: str = ""  # why the trace was not captured ("" when it was; see `traces`)
    stored: tuple[str, str] | None = None  # output and metadata as JSON, by `storable.prepare`
    stored_trace: str | None = None  # the trace as JSON (None: no step), by `storable.prepare`

    @classmethod
    def of(cls, snapshot: ItemSnapshot, **fields: Any) -> ItemOutcome:
        """The outcome of this item (`ok` unless said otherwise)."""
        fields.setdefault("status", ItemResult.Status.OK)
        return cls(
            id=snapshot.id,
            item_index=snapshot.item_index,
            run_index=snapshot.run_index,
            item_key=snapshot.item_key,
            **fields,
        )


@dataclass
class EvalEnv:
    """What evaluators share during a run: provider clients, judge settings, cache, database."""

    hub: ProviderHub
    judge_config: dict[str, Any]
    cache_enabled: bool
    cache_ttl: float | None
    db: DatabaseThread
    simulator_config: dict[str, Any] = field(default_factory=dict)  # conversations
    trace: traces.TraceSettings = field(default_factory=traces.TraceSettings)
    replay: recordings.ReplaySettings | None = None  # --record / --replay: the run's
    project_dir: Path | None = None  # where `fixtures/` is (stubs' fixture files)
    intercept: list[Stub] = field(default_factory=list)  # the project's `[[intercept]]`


def make_env(config: Config, db: DatabaseThread, *, no_cache: bool = False) -> EvalEnv:
    # Every run: a timed-out item's HTTP requests are refused (`runaway`).
    transports.install(lazily=True)
    judge_config = dict(config.get("judge") or {})
    return EvalEnv(
        hub=ProviderHub(judge_config, limiter=limiter_for(config)),
        judge_config=judge_config,
        cache_enabled=bool(config.get("cache.enabled", True)) and not no_cache,
        cache_ttl=parse_ttl(config.get("cache.ttl")),
        db=db,
        simulator_config=dict(config.get("simulator") or {}),
        trace=traces.TraceSettings.from_config(config),
        project_dir=config.project_dir,
        intercept=as_stubs(config.get("intercept"), "configuration: intercept"),
    )


class Reporter(Protocol):
    def run_started(self, run: Run, experiment: Experiment) -> None: ...
    def item_finished(self, outcome: ItemOutcome, done: int, total: int) -> None: ...
    def run_finished(self, run: Run) -> None: ...


def split_result(value: Any) -> tuple[Any, dict[str, Any]]:
    """A runner returns `{"output", "metadata"}`, or the output itself."""
    if isinstance(value, dict) and "output" in value:
        metadata = value.get("metadata") or {}
        if not isinstance(metadata, dict):
            metadata = {"value": metadata}
        return value["output"], metadata
    return value, {}


async def call_runner(
    experiment: Experiment,
    context: RunContext,
    *,
    timeout: float,
    threads: Threads,
    grace: float = RUN_DEFAULTS.timeout_grace,
    then: Then | None = None,
) -> Any:
    """The runner's value within `timeout`; past it, its code is stopped (`runaway`).
    `then`: what a sync runner's thread does next with its value (`thread_scoring`)."""
    if experiment.is_async:
        return await runaway.async_call(experiment.runner(context), timeout=timeout, grace=grace)
    value = await runaway.sync_call(
        threads, experiment.runner, context, timeout=timeout, grace=grace, then=then
    )
    if inspect.isawaitable(value):
        value = await runaway.async_call(value, timeout=timeout, grace=grace)
    return value


async def execute_item(
    experiment: Experiment,
    snapshot: ItemSnapshot,
    env: EvalEnv,
    *,
    timeout: float,
    threads: Threads,
    grace: float = RUN_DEFAULTS.timeout_grace,
    budget: BudgetSettings | None = None,
    batches: batch_scoring.Batches | None = None,
) -> ItemOutcome:
    """Run the agent on one item, then score its output with every evaluator (its tools'
    stubs, state and `budget`: `intercepts`; `batches`: where the run's async runners' items
    are scored, when `batch_scoring` applies)."""
    outcome = ItemOutcome.of(snapshot, started_at=timezone.now())
    context = RunContext(
        item=snapshot.item,
        index=snapshot.item_index,
        run_index=snapshot.run_index,
        item_key=snapshot.item_key,
        dataset=experiment.dataset,
    )
    started = time.perf_counter()
    scoring = None  # the evaluators scored by the runner's thread (`thread_scoring`)
    if thread_scoring.applies(experiment, env):
        scoring = thread_scoring.Scoring(
            experiment.evaluators, snapshot.item, started, split_result
        )
    handed = False  # `scoring` went with the runner's call
    if env.replay is not None and env.replay.mode == recordings.REPLAY:
        socket_guard.install()  # no other connection goes out either
    async with recordings.item_scope(env, experiment.name, snapshot, outcome):
        with (
            traces.capture_item(env.trace) as collector,
            intercepts.item_scope(env, experiment, snapshot.item, outcome, budget) as scope,
        ):
            if outcome.status == ItemResult.Status.OK:  # its fixtures and state could be made
                handed = scoring is not None and scope is None
                await agent_step(
                    experiment,
                    context,
                    env,
                    outcome,
                    timeout=timeout,
                    threads=threads,
                    grace=grace,
                    then=scoring.then if handed else None,
                )
    outcome.latency_ms = (time.perf_counter() - started) * 1000
    evaluations = None
    if scoring is not None:
        evaluations = await _thread_scored(
            scoring, handed, experiment, snapshot, outcome, env, timeout=timeout
        )
    outcome.finished_at = timezone.now()
    agent_done(experiment, outcome, traces.captured(collector, env.trace))
    if outcome.status == ItemResult.Status.OK and experiment.evaluators:
        if evaluations is None and batches is not None and outcome.output is not None:
            (evaluator,) = experiment.evaluators
            target = eval_target(snapshot.item, outcome)
            evaluations = [await batches.score(evaluator, target)]
        elif evaluations is None:
            with traces.untraced():
                evaluations = await evaluate_item(
                    experiment, snapshot, outcome, env, timeout=timeout
                )
        outcome.evaluations = evaluations
        for evaluation in outcome.evaluations:
            storable.clean_evaluation(evaluation)
        if experiment.conversation is not None:  # per-turn scores were added to its metadata
            outcome.stored = None
            storable.prepare(outcome)
    return outcome


def agent_done(experiment: Experiment, outcome: ItemOutcome, captured: traces.Captured) -> None:
    """The agent's part of an outcome completed: its trace, usage and cost, made storable
    (before scoring: an output that cannot be stored is not scored)."""
    outcome.trace, outcome.trace_missing = captured.steps, captured.missing
    marked = intercepts.marks(outcome.trace)
    if marked and isinstance(outcome.metadata, dict):  # the results file and the run's badges
        outcome.metadata = {**outcome.metadata, "intercepted": marked}
    if experiment.conversation is None:
        outcome.tokens, outcome.cost = agent_tokens_and_cost(outcome.metadata, outcome.trace)
    elif not outcome.tokens and outcome.trace:  # no turn reported usage: the model calls did
        input_tokens, output_tokens, outcome.cost = trace_spans.usage(outcome.trace)
        outcome.tokens = input_tokens + output_tokens
    storable.prepare(outcome)


async def _thread_scored(
    scoring: thread_scoring.Scoring,
    handed: bool,
    experiment: Experiment,
    snapshot: ItemSnapshot,
    outcome: ItemOutcome,
    env: EvalEnv,
    *,
    timeout: float,
) -> list[EvalOutcome] | None:
    """The verdicts the runner's thread gave (None: score the item as usual); the item's
    latency is the one measured when its runner returned, which its evaluators saw."""
    if not handed or outcome.status != ItemResult.Status.OK:
        scoring.abandon()  # the runner did not return: nothing is scored there
        return None

    async def rest(evaluators: list[Any]) -> list[EvalOutcome]:
        scoped = dataclasses.replace(experiment, evaluators=evaluators)
        with traces.untraced():
            return await evaluate_item(scoped, snapshot, outcome, env, timeout=timeout)

    evaluations = await scoring.outcomes(timeout, rest)
    if scoring.latency_ms is not None:
        outcome.latency_ms = scoring.latency_ms
    return evaluations


async def agent_step(
    experiment: Experiment,
    context: RunContext,
    env: EvalEnv,
    outcome: ItemOutcome,
    *,
    timeout: float,
    threads: Threads,
    grace: float,
    then: Then | None = None,
) -> None:
    """The agent's part of an item: one runner call, or a conversation."""
    if experiment.conversation is not None:
        await converse_item(
            experiment, context, env, outcome, timeout=timeout, threads=threads, grace=grace
        )
    else:
        await run_item(
            experiment, context, outcome, timeout=timeout, threads=threads, grace=grace, then=then
        )


async def rescore_item(
    experiment: Experiment,
    run_config: dict[str, Any],
    snapshot: ItemSnapshot,
    stored: dict[str, Any],
    env: EvalEnv,
    *,
    timeout: float,
) -> ItemOutcome:
    """A re-judge's step: score one stored output again with the run's re-judged evaluators
    (the agent is not called; `rejudge` copied the other verdicts)."""
    selected = run_config.get("rejudge", {}).get("evaluators", [])
    chosen = [e for e in experiment.evaluators if e.name in selected]
    outcome = ItemOutcome.of(
        snapshot,
        output=stored.get("output"),
        metadata=stored.get("metadata") or {},
        latency_ms=stored.get("latency_ms"),
        tokens=stored.get("tokens") or 0,
        cost=stored.get("cost") or 0.0,
        started_at=timezone.now(),
    )
    if chosen:
        # For the evaluators that read the trace; stored already (copied with the item).
        outcome.trace, outcome.trace_missing = await env.db(stored_trace, snapshot.id)
        scoped = dataclasses.replace(experiment, evaluators=chosen)
        outcome.evaluations = await evaluate_item(scoped, snapshot, outcome, env, timeout=timeout)
        outcome.trace, outcome.trace_missing = [], ""  # not written again
    present = {e.name for e in chosen}
    outcome.evaluations += [
        EvalOutcome.failed(name, f"the experiment file no longer defines evaluator {name!r}")
        for name in selected
        if name not in present
    ]
    outcome.finished_at = timezone.now()
    return outcome


def stored_trace(item_id: int) -> trace_store.Trace:
    """One item's stored trace (no step when none was captured)."""
    return trace_store.read_traces([item_id]).get(item_id, trace_store.Trace([]))


async def run_item(
    experiment: Experiment,
    context: RunContext,
    outcome: ItemOutcome,
    *,
    timeout: float,
    threads: Threads,
    grace: float = RUN_DEFAULTS.timeout_grace,
    then: Then | None = None,
) -> None:
    """Call the runner once; its output, or how it failed, goes on the outcome."""
    try:
        value = await call_runner(
            experiment, context, timeout=timeout, threads=threads, grace=grace, then=then
        )
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt of its code too
        runner_failed(outcome, exc, timeout, grace)
    else:
        outcome.output, outcome.metadata = split_result(value)


def runner_failed(outcome: ItemOutcome, exc: BaseException, timeout: float, grace: float) -> None:
    """How the runner's call failed, on the outcome."""
    if isinstance(exc, DeadlineExceeded):
        outcome.status = ItemResult.Status.TIMEOUT
        outcome.error = timed_out(timeout)
    elif isinstance(exc, runaway.NotStopped):
        outcome.status = ItemResult.Status.TIMEOUT
        outcome.error = runaway.did_not_stop(timeout, grace, str(exc))
    elif isinstance(exc, Exception):
        outcome.status = ItemResult.Status.ERROR
        outcome.error = f"{type(exc).__name__}: {exc}"
        outcome.traceback = user_traceback(exc)
    else:  # SystemExit, KeyboardInterrupt: from the runner's own code
        outcome.status = ItemResult.Status.ERROR
        outcome.error = stopped_by_user_code(exc, "the runner")
        outcome.traceback = user_traceback(exc)


def timed_out(timeout: float) -> str:
    """The error of an item whose runner was stopped at its timeout."""
    return f"timed out after {timeout:g}s (its code was stopped)"


async def converse_item(
    experiment: Experiment,
    context: RunContext,
    env: EvalEnv,
    outcome: ItemOutcome,
    *,
    timeout: float,
    threads: Threads,
    grace: float = RUN_DEFAULTS.timeout_grace,
) -> None:
    """Play the item's conversation (`cobalt_app.conversation`) within the item's timeout;
    the transcript is the output, also when a turn failed or time ran out."""
    turn_timeout = experiment.conversation.turn_timeout or timeout

    async def call(turn_context: RunContext) -> tuple[Any, dict[str, Any]]:
        try:
            value = await call_runner(
                experiment, turn_context, timeout=turn_timeout, threads=threads, grace=grace
            )
        except (DeadlineExceeded, runaway.NotStopped):
            raise TurnTimedOut(turn_timeout) from None
        return split_result(value)

    conversation = Conversation()
    try:
        await within(converse(experiment, context, env, conversation, call=call), timeout)
    except ConversationError as exc:
        outcome.status = exc.status
        outcome.error = str(exc)
        outcome.traceback = exc.traceback_text
    except DeadlineExceeded:
        conversation.ended = "timeout"
        outcome.status = ItemResult.Status.TIMEOUT
        outcome.error = (
            f"timed out after {timeout:g}s, on turn {conversation.turns + 1} "
            "(the item's timeout covers the whole conversation)"
        )
    outcome.output = conversation.transcript
    outcome.metadata = conversation.metadata()
    outcome.tokens, outcome.cost = conversation.agent_usage()


def agent_tokens_and_cost(
    metadata: dict[str, Any], trace: list[dict[str, Any]]
) -> tuple[int, float]:
    """The agent's tokens and cost: what its metadata reports, each summed from the model
    calls of its trace when the metadata says nothing of it."""
    if not metadata and not trace:  # most items of most runs: nothing to read
        return 0, 0.0
    _, _, reported_tokens = agent_usage(metadata)
    if reported_tokens or "cost" in metadata or not trace:
        return reported_tokens, agent_cost(metadata)
    input_tokens, output_tokens, cost = trace_spans.usage(trace)
    return input_tokens + output_tokens, cost


def eval_target(item: Any, outcome: ItemOutcome) -> EvalTarget:
    """What an item's evaluators read of it and of its outcome."""
    return EvalTarget(
        item=item,
        output=outcome.output,
        metadata=outcome.metadata,
        latency_ms=outcome.latency_ms,
        cost=outcome.cost,
        trace=outcome.trace,
        trace_missing=outcome.trace_missing,
    )


async def evaluate_item(
    experiment: Experiment,
    snapshot: ItemSnapshot,
    outcome: ItemOutcome,
    env: EvalEnv,
    *,
    timeout: float | None = None,
) -> list[EvalOutcome]:
    """Score one output with every evaluator of the experiment (concurrently), each within
    its own `timeout=` or else `timeout` (the item's).

    An output of None scores nothing: it is an evaluation error for every evaluator (a runner
    that forgot its `return`), never a 0 that reads as a bad answer.
    """
    if outcome.output is None:
        return [EvalOutcome.failed(e.name, NOTHING_RETURNED) for e in experiment.evaluators]
    target = eval_target(snapshot.item, outcome)
    if len(experiment.evaluators) == 1:
        return [await score(experiment.evaluators[0], target, env, timeout=timeout)]
    return list(
        await asyncio.gather(
            *(score(e, target, env, timeout=timeout) for e in experiment.evaluators)
        )
    )


async def score(
    evaluator: Any, target: EvalTarget, env: EvalEnv, *, timeout: float | None
) -> EvalOutcome:
    """One evaluator's verdict; `per_turn=True` on a conversation scores each assistant turn
    (`{{output}}` is that reply) and records their mean, naming the worst turn."""
    if not evaluator.options.get("per_turn") or not is_transcript(target.output):
        return await evaluate(evaluator, target, env, timeout=timeout)
    replies = [m["content"] for m in target.output if m["role"] == "assistant"]
    if not replies:
        return EvalOutcome.failed(evaluator.name, "the conversation has no assistant turn")
    turns = await asyncio.gather(
        *(
            evaluate(evaluator, dataclasses.replace(target, output=reply), env, timeout=timeout)
            for reply in replies
        )
    )
    tokens, cost = sum(t.tokens for t in turns), sum(t.cost for t in turns)
    failed = [(n, t) for n, t in enumerate(turns, 1) if t.status != "ok"]
    if failed:
        number, first = failed[0]
        return EvalOutcome.failed(
            evaluator.name, f"turn {number}: {first.error}", tokens=tokens, cost=cost
        )
    scores = [t.score for t in turns]
    info = target.metadata.get("conversation")
    if isinstance(info, dict):  # shown beside each reply on the item's page
        info.setdefault("turnScores", {})[evaluator.name] = scores
    worst = min(range(len(turns)), key=lambda n: scores[n])
    per_turn = ", ".join(f"{s:.2f}" for s in scores)
    reason = (  # a bare score's turn has no reason to quote
        f"mean of {len(turns)} turns [{per_turn}]; worst: turn {worst + 1} "
        f"({scores[worst]:.2f})" + (f": {turns[worst].reason}" if turns[worst].reason else "")
    )
    return EvalOutcome(
        evaluator.name, sum(scores) / len(scores), reason=reason, tokens=tokens, cost=cost
    )
