"""The lane: the one loop that executes a run, in every mode.

A lane claims a few of the run's pending items (`claims.items_claim_next`), executes each
with the run's per-item step (`step_for`: the agent and the evaluators, or for a re-judge the
evaluators only), hands each outcome to the recorder, and claims again — until no item is
left, the run was cancelled, or (team mode) its time is up and a continuation takes over.
The embedded mode runs `concurrency` lanes on this process's loop (`embedded`); a team worker
runs one lane per Celery message (`worker_runtime`). A lane whose step is all sync hands its
items to a runner thread in batches instead (`sync_items`), in both modes.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from cobalt.experiments import Experiment
from cobalt.run_settings import RunSettings
from cobalt_app import batch_scoring, engine, sync_items
from cobalt_app.aio import Threads
from cobalt_app.models import ItemResult, Run
from cobalt_app.runs.claims import Claim, items_claim, items_claim_next, run_status
from cobalt_app.runs.recorder import Batch, Recorder

Step = Callable[[Claim], Awaitable[Any]]  # a claimed item → its outcome (`ItemOutcome`)
STATUS_TTL = 1.0  # seconds a run's status is trusted before a lane reads it again
# An all-sync step (`sync_items`): a runner thread runs BATCH of a lane's items at a time,
# once no more than BACKLOG batches of the lane's outcomes wait for their commit (`_caught_up`)
BATCH = 50
BACKLOG = 2


def worker_name() -> str:
    """Who holds a claim: this host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def step_for(
    experiment: Experiment, run_config: dict[str, Any], env: Any, threads: Threads
) -> Step:
    """The run's per-item step: execute the item, or re-score its stored output (re-judge)."""
    settings = RunSettings.from_run_config(run_config)
    timeout, grace = settings.timeout, settings.timeout_grace
    if run_config.get("rejudge"):

        async def rescore(claim: Claim) -> Any:
            return await engine.rescore_item(
                experiment, run_config, claim.snapshot, claim.stored, env, timeout=timeout
            )

        return rescore

    batches = batch_scoring.Batches(timeout) if batch_scoring.applies(experiment, env) else None

    async def execute(claim: Claim) -> Any:
        return await engine.execute_item(
            experiment,
            claim.snapshot,
            env,
            timeout=timeout,
            threads=threads,
            grace=grace,
            budget=settings.budget,
            batches=batches,
        )

    return execute


def sync_items_for(
    experiment: Experiment, run_config: dict[str, Any], env: Any, threads: Threads
) -> sync_items.SyncItems | None:
    """The run's items on runner threads, one after another, when every part of their step
    is sync (`sync_items`); None: each item through the loop (`step_for`)."""
    if run_config.get("rejudge") or not sync_items.applies(experiment, env):
        return None
    settings = RunSettings.from_run_config(run_config)
    return sync_items.SyncItems(
        experiment,
        env,
        threads,
        timeout=settings.timeout,
        grace=settings.timeout_grace,
        budget=settings.budget,
    )


def failing_step(message: str) -> Step:
    """Every item an error saying `message` (the run's experiment cannot be loaded here)."""

    async def fail(claim: Claim) -> Any:
        return engine.ItemOutcome.of(
            claim.snapshot, status=ItemResult.Status.ERROR, error=message, latency_ms=0.0
        )

    return fail


@dataclass
class Held:
    """A claimed item while its lane holds it."""

    claim: Claim
    task: asyncio.Future | None = None  # while its step runs
    dropped: bool = False  # cancelled, or its lease went to another worker
    batch: sync_items.Batch | None = None  # the runner thread's batch it is part of

    def drop(self, *, started: bool | None = None) -> bool:
        """On the loop: drop the item (its lease went to another worker, or the worker hands
        it back) — `started` given: only if it has (not) begun. Its step is cancelled: a
        batch's thread does not begin it, or stops its agent; whatever lands of it is not
        recorded (`_execute_batch`). Whether it was dropped."""
        if self.batch is not None:
            if not self.batch.drop(self.claim, started=started):
                return False
        elif started is not None and (self.task is not None) != started:
            return False
        self.dropped = True
        if self.task is not None:
            self.task.cancel()
        return True


class RunStatuses:
    """Whether a run was cancelled (or ended), from a read at most STATUS_TTL old: read once
    a second per run whoever asks (40 lanes must not send 40 queries), and read again in the
    background once the answer is half that old, so that a lane seldom waits for it (behind
    a batch being committed on the one SQLite writer, a read waited ~30 ms, every lane with it)."""

    def __init__(self, db: Callable[..., Awaitable[Any]]) -> None:
        self.db = db
        self.known: dict[str, tuple[float, bool]] = {}  # run → (when its read began, stopped)
        self.reading: dict[str, asyncio.Future] = {}

    async def stopped(self, run_id: str) -> bool:
        known = self.known.get(run_id)
        age = time.monotonic() - known[0] if known is not None else math.inf
        if age > STATUS_TTL / 2 and run_id not in self.reading:
            read = self.reading[run_id] = asyncio.ensure_future(self._read(run_id))
            read.add_done_callback(_retrieved)
        if known is not None and age <= STATUS_TTL:
            return known[1]
        return await asyncio.shield(self.reading[run_id])

    async def _read(self, run_id: str) -> bool:
        began = time.monotonic()
        try:
            status = await self.db(run_status, run_id)
        finally:
            del self.reading[run_id]
        stopped = status is None or status in Run.FINISHED
        self.known[run_id] = (began, stopped)
        return stopped


def _retrieved(read: asyncio.Future) -> None:
    """A read nobody awaited failed: the next one is awaited (and raises) if it fails too."""
    if not read.cancelled():
        read.exception()


def _nothing(entries: list[Held]) -> None:
    return None


@dataclass
class LaneHost:
    """Where lanes run: the claiming worker's name, its database calls and its recorder; a
    team worker also tracks what it holds (to renew leases and hand items back at shutdown)."""

    name: str
    db: Callable[..., Awaitable[Any]]  # an ORM function and its arguments, awaited
    recorder: Recorder
    statuses: RunStatuses
    stopping: Callable[[], bool] = lambda: False  # a warm shutdown: claim nothing more
    drops_items: bool = False  # a team worker drops an item whose lease it lost
    # Team: a lane holds no more than it claimed, its records committed before it claims
    # again (workers share the run fairly). Embedded lanes go on while the recorder commits.
    records_before_claims: bool = False
    hold: Callable[[list[Held]], None] = _nothing
    release: Callable[[list[Held]], None] = _nothing
    make_way: Callable[[], None] = lambda: None  # between items: for the database threads
    # (run, worker, limit) → the run's next claims, on a database thread (team: its cursor)
    claim_next: Callable[[str, str, int], list[Claim]] = items_claim_next
    # Embedded: up to n of the run's claimed items, from the lanes' shared pool (None: claim)
    take: Callable[[int], Awaitable[list[Claim]]] | None = None
    # An all-sync step: the claimed items run by a runner thread, one after another
    batches: sync_items.SyncItems | None = None


@dataclass
class LaneEnd:
    executed: int = 0  # items whose step ran
    recorded: int = 0  # of those, recorded (not superseded by another claim)
    more: bool = False  # it stopped with work left: its continuation must be enqueued


async def run_lane(
    run_id: str,
    step: Step,
    host: LaneHost,
    *,
    size: Callable[[], int],
    first: list[int] | None = None,
    deadline: float | None = None,
    on_outcome: Callable[[Any], Awaitable[None]] | None = None,
) -> LaneEnd:
    """Claim (`first`, else `size()` of the run's next pending items; embedded lanes take them
    from their pool, `LaneHost.take`); execute, record, claim again; returns once every outcome
    it handed over is committed (team: then the message is acknowledged). `size()` of 0: no
    claim after the first. `deadline` (monotonic): past it, the lane stops and says `more`."""
    end = LaneEnd()
    handed: dict[int, tuple[Batch, list[int]]] = {}  # the batches recording its items
    try:
        claims = await _first_claim(run_id, host, size, first)
        while True:
            await _execute_claims(run_id, claims, step, host, end, handed, on_outcome)
            end.recorded += _settled(handed)
            if host.records_before_claims:
                await _committed(host, handed)
            if await host.statuses.stopped(run_id):
                break
            if host.stopping() or (deadline is not None and time.monotonic() > deadline):
                end.more = True
                break
            claims = await _claim_next(run_id, host, size())
            if not claims:
                break
    finally:
        # What was handed over is committed before the lane ends, cancelled or not.
        await asyncio.shield(_committed(host, handed))
    end.recorded += _recorded(handed)
    return end


async def _first_claim(
    run_id: str, host: LaneHost, size: Callable[[], int], first: list[int] | None
) -> list[Claim]:
    """The lane's first items: those of `first` still pending, else the run's next ones."""
    if host.stopping():
        return []
    if first:
        return await host.db(items_claim, first, host.name)
    return await _claim_next(run_id, host, size())


def _settled(handed: dict[int, tuple[Batch, list[int]]]) -> int:
    """How many of the lane's items the batches already committed recorded; those batches are
    let go (issue 41: a lane kept every batch of a run, each with its items' ids, to its end).
    A batch that failed stays, for `_recorded` to raise when the lane ends."""
    recorded = 0
    for key, (batch, item_ids) in list(handed.items()):
        if batch.done.done() and batch.done.exception() is None:
            done = batch.done.result()
            if not any(i in done.failed for i in item_ids):
                recorded += len(done.ids.intersection(item_ids))
                del handed[key]
    return recorded


def _recorded(handed: dict[int, tuple[Batch, list[int]]]) -> int:
    """How many of the lane's items its batches recorded; a batch that failed, or an item
    that could not be recorded even as an error, fails the lane."""
    recorded = 0
    for batch, item_ids in handed.values():
        failure = batch.done.exception()
        if failure is None:
            done = batch.done.result()
            failure = next((done.failed[i] for i in item_ids if i in done.failed), None)
            recorded += len(done.ids.intersection(item_ids))
        if failure is not None:
            raise RuntimeError(f"recording finished items failed: {failure}") from failure
    return recorded


async def _committed(host: LaneHost, handed: dict[int, tuple[Batch, list[int]]]) -> None:
    """Until the batches recording this lane's outcomes are committed (or failed)."""
    waits = [asyncio.wrap_future(b.done) for b, _ in handed.values() if not b.done.done()]
    if waits:
        host.recorder.flush()
        await asyncio.gather(*waits, return_exceptions=True)


async def _claim_next(run_id: str, host: LaneHost, count: int) -> list[Claim]:
    if count < 1 or host.stopping():
        return []
    if host.take is not None:
        return await host.take(count)
    return await host.db(host.claim_next, run_id, host.name, count)


async def _execute_claims(
    run_id: str,
    claims: list[Claim],
    step: Step,
    host: LaneHost,
    end: LaneEnd,
    handed: dict[int, tuple[Batch, list[int]]],
    on_outcome: Callable[[Any], Awaitable[None]] | None,
) -> None:
    """The claimed items one after another; the others wait their turn, leased."""
    if host.batches is not None:
        left: list[Claim] = []
        for start in range(0, len(claims), BATCH):
            if start and (await host.statuses.stopped(run_id) or host.stopping()):
                return
            part = claims[start : start + BATCH]
            left += await _execute_batch(run_id, part, host, end, handed, on_outcome)
        claims = left
    entries = [Held(claim) for claim in claims]
    host.hold(entries)
    try:
        for position, held in enumerate(entries):
            stopped = bool(position) and await host.statuses.stopped(run_id)
            if stopped or held.dropped or host.stopping():
                continue  # cancelled: already finished; handed back: pending again
            if host.drops_items:  # its own task, which the worker may cancel alone
                held.task = asyncio.ensure_future(step(held.claim))
                try:
                    outcome = await held.task
                except asyncio.CancelledError:
                    if not held.dropped:
                        raise  # the lane itself is cancelled, not this item
                    continue
            else:
                outcome = await step(held.claim)
            end.executed += 1
            batch = host.recorder.submit(held.claim, outcome)
            handed.setdefault(id(batch), (batch, []))[1].append(held.claim.item_id)
            host.release([held])  # the recorder has it: no lease to renew, nothing to hand back
            host.make_way()
            if on_outcome is not None:
                await on_outcome(outcome)
    finally:
        host.release(entries)


async def _execute_batch(
    run_id: str,
    claims: list[Claim],
    host: LaneHost,
    end: LaneEnd,
    handed: dict[int, tuple[Batch, list[int]]],
    on_outcome: Callable[[Any], Awaitable[None]] | None,
) -> list[Claim]:
    """The claimed items on a runner thread (`sync_items`), their outcomes recorded and
    reported as they land; returns the items it took back (its thread was left)."""
    await _caught_up(handed)
    # Team: held (leases renewed, handed back at a warm shutdown) until recorded; a dropped
    # item is skipped by the thread, or its agent stopped, and what lands of it let go.
    entries = {claim.item_id: Held(claim) for claim in claims}
    host.hold(list(entries.values()))
    batch = host.batches.start(claims)
    for held in entries.values():
        held.batch = batch

    def record(claim: Claim, outcome: Any) -> bool:
        held = entries[claim.item_id]
        if held.dropped:
            return False
        end.executed += 1
        recording = host.recorder.submit(claim, outcome)
        handed.setdefault(id(recording), (recording, []))[1].append(claim.item_id)
        host.release([held])  # the recorder has it: no lease to renew, nothing to hand back
        return True

    try:
        while (landed := await batch.outcomes()) is not None:
            for claim, outcome in landed:
                if record(claim, outcome) and on_outcome is not None:
                    await on_outcome(outcome)
            if await host.statuses.stopped(run_id) or host.stopping():
                batch.stop()
    except BaseException:
        for claim, outcome in batch.cancel():  # finished before the lane was cancelled
            record(claim, outcome)
        raise
    finally:
        host.release(list(entries.values()))
    return [claim for claim in batch.left if not entries[claim.item_id].dropped]


async def _caught_up(handed: dict[int, tuple[Batch, list[int]]]) -> None:
    """Until no more than BACKLOG of the batches recording this lane's outcomes wait for
    their commit: runner threads run quick sync items faster than the database thread
    records them, and the outcomes waiting for it would grow with the run (issue 41: 305 MB
    at 100,000 items against 212 at 50,000)."""
    waiting = [batch.done for batch, _ in handed.values() if not batch.done.done()]
    if len(waiting) > BACKLOG:
        await asyncio.wait([asyncio.wrap_future(done) for done in waiting[:-BACKLOG]])
