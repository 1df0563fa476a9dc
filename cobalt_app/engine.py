"""The experiment engine: execute an item, evaluate it, record it, finalise the run.

`execute_item()` runs the agent on one snapshotted item (with its timeout) and then every
evaluator. The embedded mode (`execute_run()`) calls it for all pending items of a run with
the configured concurrency and records outcomes in batches; team-mode workers call the same
function for one item per task.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import inspect
import logging
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from django.utils import timezone

from cobalt.config import Config, parse_ttl
from cobalt.experiments import Experiment, RunContext
from cobalt_app import (
    liveness,
    recordings,
    results,
    services,
    storable,
    trace_spans,
    traces,
    webhooks,
)
from cobalt_app.aio import DatabaseThread
from cobalt_app.conversation import (
    Conversation,
    ConversationError,
    TurnTimedOut,
    converse,
    is_transcript,
)
from cobalt_app.evaluators import EvalOutcome, EvalTarget, evaluate, stopped_by_user_code
from cobalt_app.models import ItemResult, Run
from cobalt_app.pricing import agent_cost, agent_usage
from cobalt_app.progress import Progress
from cobalt_app.providers import ProviderHub
from cobalt_app.ratelimit import limiter_for
from cobalt_app.services import ItemSnapshot

logger = logging.getLogger("cobalt.engine")

FLUSH_SIZE = 500
FLUSH_INTERVAL = 0.25
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
    stored: tuple[str, str] | None = None  # output and metadata as JSON, by `storable.prepare`
    stored_trace: str | None = None  # the trace as JSON (None: no step), by `storable.prepare`


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


def make_env(config: Config, db: DatabaseThread, *, no_cache: bool = False) -> EvalEnv:
    judge_config = dict(config.get("judge") or {})
    return EvalEnv(
        hub=ProviderHub(judge_config, limiter=limiter_for(config)),
        judge_config=judge_config,
        cache_enabled=bool(config.get("cache.enabled", True)) and not no_cache,
        cache_ttl=parse_ttl(config.get("cache.ttl")),
        db=db,
        simulator_config=dict(config.get("simulator") or {}),
        trace=traces.TraceSettings.from_config(config),
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


class DeadlineExceeded(Exception):
    """Cobalt's per-item deadline passed (a `TimeoutError` the runner raises is its own error)."""


async def within(awaitable: Any, timeout: float) -> Any:
    """Await within the deadline; `DeadlineExceeded` only when the deadline itself expired."""
    try:
        async with asyncio.timeout(timeout) as deadline:
            return await awaitable
    except TimeoutError:
        if deadline.expired():
            raise DeadlineExceeded from None
        raise


async def call_runner(
    experiment: Experiment, context: RunContext, *, timeout: float, pool: ThreadPoolExecutor
) -> Any:
    if experiment.is_async:
        return await within(experiment.runner(context), timeout)
    loop = asyncio.get_running_loop()
    # In a copy of this context: the thread sees the item's trace collector and OTel context.
    future = loop.run_in_executor(pool, contextvars.copy_context().run, experiment.runner, context)
    value = await within(future, timeout)
    if inspect.isawaitable(value):
        value = await within(value, timeout)
    return value


async def execute_item(
    experiment: Experiment,
    snapshot: ItemSnapshot,
    env: EvalEnv,
    *,
    timeout: float,
    pool: ThreadPoolExecutor,
) -> ItemOutcome:
    """Run the agent on one item, then score its output with every evaluator."""
    outcome = ItemOutcome(
        id=snapshot.id,
        item_index=snapshot.item_index,
        run_index=snapshot.run_index,
        item_key=snapshot.item_key,
        status=ItemResult.Status.OK,
        started_at=timezone.now(),
    )
    context = RunContext(
        item=snapshot.item,
        index=snapshot.item_index,
        run_index=snapshot.run_index,
        item_key=snapshot.item_key,
        dataset=experiment.dataset,
    )
    started = time.perf_counter()
    async with recordings.item_scope(env, experiment.name, snapshot, outcome):
        with traces.capture_item(env.trace) as collector:
            if experiment.conversation is not None:
                await converse_item(experiment, context, env, outcome, timeout=timeout, pool=pool)
            else:
                await run_item(experiment, context, outcome, timeout=timeout, pool=pool)
    outcome.latency_ms = (time.perf_counter() - started) * 1000
    outcome.finished_at = timezone.now()
    outcome.trace = traces.steps(collector, env.trace)
    if experiment.conversation is None:
        outcome.tokens, outcome.cost = agent_tokens_and_cost(outcome.metadata, outcome.trace)
    elif not outcome.tokens and outcome.trace:  # no turn reported usage: the model calls did
        input_tokens, output_tokens, outcome.cost = trace_spans.usage(outcome.trace)
        outcome.tokens = input_tokens + output_tokens
    storable.prepare(outcome)  # before scoring: an output that cannot be stored is not scored
    if outcome.status == ItemResult.Status.OK and experiment.evaluators:
        with traces.untraced():
            outcome.evaluations = await evaluate_item(
                experiment, snapshot, outcome, env, timeout=timeout
            )
        for evaluation in outcome.evaluations:
            storable.clean_evaluation(evaluation)
        if experiment.conversation is not None:  # per-turn scores were added to its metadata
            outcome.stored = None
            storable.prepare(outcome)
    return outcome


async def run_item(
    experiment: Experiment,
    context: RunContext,
    outcome: ItemOutcome,
    *,
    timeout: float,
    pool: ThreadPoolExecutor,
) -> None:
    """Call the runner once; its output, or how it failed, goes on the outcome."""
    try:
        value = await call_runner(experiment, context, timeout=timeout, pool=pool)
    except DeadlineExceeded:
        outcome.status = ItemResult.Status.TIMEOUT
        outcome.error = f"timed out after {timeout:g}s (the runner was cancelled)"
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        outcome.status = ItemResult.Status.ERROR
        outcome.error = f"{type(exc).__name__}: {exc}"
        outcome.traceback = traceback.format_exc()
    except BaseException as exc:  # SystemExit, KeyboardInterrupt: from the runner's own code
        outcome.status = ItemResult.Status.ERROR
        outcome.error = stopped_by_user_code(exc, "the runner")
        outcome.traceback = traceback.format_exc()
    else:
        outcome.output, outcome.metadata = split_result(value)


async def converse_item(
    experiment: Experiment,
    context: RunContext,
    env: EvalEnv,
    outcome: ItemOutcome,
    *,
    timeout: float,
    pool: ThreadPoolExecutor,
) -> None:
    """Play the item's conversation (`cobalt_app.conversation`) within the item's timeout;
    the transcript is the output, also when a turn failed or time ran out."""
    turn_timeout = experiment.conversation.turn_timeout or timeout

    async def call(turn_context: RunContext) -> tuple[Any, dict[str, Any]]:
        try:
            value = await call_runner(experiment, turn_context, timeout=turn_timeout, pool=pool)
        except DeadlineExceeded:
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
    _, _, reported_tokens = agent_usage(metadata)
    if reported_tokens or "cost" in metadata or not trace:
        return reported_tokens, agent_cost(metadata)
    input_tokens, output_tokens, cost = trace_spans.usage(trace)
    return input_tokens + output_tokens, cost


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
    target = EvalTarget(
        item=snapshot.item,
        output=outcome.output,
        metadata=outcome.metadata,
        latency_ms=outcome.latency_ms,
        cost=outcome.cost,
        trace=outcome.trace,
    )
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
    reason = (
        f"mean of {len(turns)} turns [{per_turn}]; worst: turn {worst + 1} "
        f"({scores[worst]:.2f}): {turns[worst].reason}"
    )
    return EvalOutcome(
        evaluator.name, sum(scores) / len(scores), reason=reason, tokens=tokens, cost=cost
    )


class OutcomeWriter:
    """Buffers outcomes and records them in batches on the database thread.

    An outcome is recorded within FLUSH_INTERVAL even when no other item finishes meanwhile
    (a slow next item must not hide it from the dashboard).
    """

    def __init__(self, run_id: str, db: DatabaseThread) -> None:
        self.run_id = run_id
        self.db = db
        self.buffer: list[ItemOutcome] = []
        self.last_flush = time.monotonic()
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task | None = None
        self._failure: BaseException | None = None  # of a timed flush, raised by the next call

    async def add(self, outcome: ItemOutcome) -> None:
        self._raise_failure()
        self.buffer.append(outcome)
        due = time.monotonic() - self.last_flush >= FLUSH_INTERVAL
        if len(self.buffer) >= FLUSH_SIZE or due:
            await self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().create_task(self._flush_later())

    async def _flush_later(self) -> None:
        await asyncio.sleep(FLUSH_INTERVAL)
        self._timer = None  # from here on, flush() no longer cancels this task
        try:
            await self.flush()
        except Exception as exc:  # noqa: BLE001 - nobody awaits this task: hand it over
            self._failure = exc

    async def flush(self) -> None:
        """Record what is buffered; raises if this or an earlier timed flush failed."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()  # still asleep: what it would record is recorded now
        async with self._lock:
            batch, self.buffer = self.buffer, []
            self.last_flush = time.monotonic()
            if batch:
                await self.db(services.record_item_outcomes_apart, self.run_id, batch)
        self._raise_failure()

    def _raise_failure(self) -> None:
        failure, self._failure = self._failure, None
        if failure is not None:
            raise RuntimeError(f"recording finished items failed: {failure}") from failure


Step = Callable[[Any], Awaitable[ItemOutcome]]  # one pending entry → its outcome


async def execute_run(
    run: Run,
    experiment: Experiment,
    env: EvalEnv,
    *,
    reporter: Reporter | None = None,
    on_item: Callable[[ItemOutcome], None] | None = None,
    pending: list[Any] | None = None,
    step: Step | None = None,
) -> None:
    """Execute every pending item of a run in this process (the embedded mode): `concurrency`
    lanes over the pending entries, each outcome reported and recorded in batches.

    By default the pending items' snapshots, each run by `execute_item`; a re-judge passes its
    own `pending` entries and `step` (the evaluators only)."""
    settings = run.config
    concurrency = int(settings.get("concurrency", 5))
    timeout = float(settings.get("timeout", 30))
    if pending is None:
        pending = await env.db(services.item_snapshots, run.id)
    done = run.total_items - len(pending)
    total = run.total_items
    writer = OutcomeWriter(run.id, env.db)
    entries = iter(pending)
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="cobalt-runner")
    progress = Progress(experiment.on_progress, experiment.name) if experiment.on_progress else None
    if step is None:

        async def step(snapshot: ItemSnapshot) -> ItemOutcome:
            return await execute_item(experiment, snapshot, env, timeout=timeout, pool=pool)

    async def work() -> None:
        nonlocal done
        for entry in entries:
            outcome = await step(entry)
            done += 1
            if reporter is not None:
                reporter.item_finished(outcome, done, total)
            if on_item is not None:
                on_item(outcome)
            if progress is not None:
                await progress.notify(done, total)
            await writer.add(outcome)

    try:
        with traces.enabled(env.trace):
            await asyncio.gather(*(work() for _ in range(min(concurrency, len(pending)) or 1)))
    finally:
        await asyncio.shield(writer.flush())
        pool.shutdown(wait=False, cancel_futures=True)


@contextlib.asynccontextmanager
async def keep_alive(run_id: str, db: DatabaseThread) -> AsyncIterator[asyncio.Event]:
    """Touch the run every few seconds while this process executes it: a run whose heartbeat
    stops (the process was killed) reads as `interrupted` (see `liveness`). A beat that finds
    the run ended — cancelled from another process (`cobalt cancel`, the API, the dashboard)
    — cancels the execution here; the yielded event says that is why it was cancelled."""
    executing = asyncio.current_task()
    stopped_elsewhere = asyncio.Event()

    async def beat() -> None:
        while True:
            await asyncio.sleep(liveness.beat_interval())
            try:
                alive = await db(services.run_heartbeat, run_id)
            except Exception as exc:  # noqa: BLE001 - a missed beat is not worth a failed run
                logger.warning("could not record the heartbeat of run %s: %s", run_id, exc)
                continue
            if not alive and executing is not None:
                stopped_elsewhere.set()
                executing.cancel()
                return

    task = asyncio.get_running_loop().create_task(beat())
    try:
        yield stopped_elsewhere
    finally:
        task.cancel()


async def run_experiment(
    experiment: Experiment,
    config: Config,
    *,
    db: DatabaseThread,
    reporter: Reporter | None = None,
    no_cache: bool = False,
    overrides: dict[str, Any] | None = None,
    tags: list[str] | None = None,
    file: str = "",
    resume_run_id: str | None = None,
    on_start: Callable[[str], None] | None = None,
) -> Run:
    """Create (or resume) a run of an experiment, execute it in-process and finalise it.

    `on_start` gets the run's id as soon as it exists (to name it if the run is interrupted).
    """
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    settings = experiment.settings(
        default_concurrency=config.get("concurrency", 5),
        default_timeout=config.get("timeout", 30),
    )
    settings.update(overrides)
    if resume_run_id:
        run = await db(services.run_resume, resume_run_id, grace=liveness.grace())
        await db(
            services.item_reset_for_retry,
            run.id,
            [ItemResult.Status.ERROR, ItemResult.Status.TIMEOUT, ItemResult.Status.CANCELLED],
        )
    else:
        run = await db(
            services.run_create,
            experiment=experiment,
            settings=settings,
            file=file,
            tags=tags or [],
            project_dir=config.project_dir,
        )
    if on_start is not None:
        on_start(run.id)
    env = make_env(config, db, no_cache=no_cache)
    env.replay = recordings.settings_for(config, run.config, run.id)
    return await drive_run(run, experiment, config, env, reporter=reporter)


async def drive_run(
    run: Run,
    experiment: Experiment,
    config: Config,
    env: EvalEnv,
    *,
    reporter: Reporter | None = None,
    pending: Callable[[str], list[Any]] | None = None,
    step: Step | None = None,
) -> Run:
    """The life of an embedded run once it exists, the same for a run and a re-judge: start
    it, execute its pending entries (`execute_run`) while keeping it alive, and finalise it
    whatever happens — `completed`, `cancelled` (Ctrl-C, a client gone, or `cobalt cancel`
    from elsewhere) or `failed` — then send the webhooks."""
    db = env.db
    status = Run.Status.COMPLETED
    stopped_elsewhere = asyncio.Event()
    try:
        started = await db(services.run_start, run.id)
        run = await db(Run.objects.get, id=run.id)
        if reporter is not None:
            reporter.run_started(run, experiment)
        if not started:  # cancelled from elsewhere between its creation and now
            status = Run.Status.CANCELLED
        else:
            async with keep_alive(run.id, db) as stopped_elsewhere:
                entries = None if pending is None else await db(pending, run.id)
                await execute_run(
                    run, experiment, env, reporter=reporter, pending=entries, step=step
                )
    except asyncio.CancelledError:
        status = Run.Status.CANCELLED
        await asyncio.shield(db(services.run_cancel_pending, run.id))
        if not stopped_elsewhere.is_set():
            raise  # Ctrl-C, a client gone: the caller is being cancelled too
        asyncio.current_task().uncancel()  # cancelled by another process: a finished run
    except Exception as exc:
        status = Run.Status.FAILED
        await asyncio.shield(db(services.run_fail, run.id, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        run = await asyncio.shield(
            db(results.run_finalise, run.id, status=status, results_dir=config.results_dir)
        )
        await env.hub.aclose()
        if status == Run.Status.FAILED:
            await webhooks.notify_run(config, run)
    if reporter is not None:
        await db(reporter.run_finished, run)
    await webhooks.notify_run(config, run)  # never raises; delivery failures are logged
    return run
