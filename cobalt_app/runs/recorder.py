"""Finished items recorded in batches: one transaction for many items, in every mode.

Lanes hand over (claim, outcome) and go on with their next item; the recorder's thread
commits whatever arrived meanwhile as one batch (`items_record`), finalises a run whose last
item it recorded (`lifecycle.finish_if_done`) and resolves each item's future. A batch the
database refuses is recorded item by item, and an outcome refused alone is recorded as an
item error saying why: one bad value never rolls back its neighbours.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from cobalt.config import Config
from cobalt_app import aio, services
from cobalt_app.runs import lifecycle
from cobalt_app.runs.claims import Claim, items_record

logger = logging.getLogger("cobalt.runs")


@dataclass
class Recorded:
    """What a commit did: the items recorded (the others' claims were superseded: another
    worker has them) and those that could not be recorded even as an error, with why."""

    ids: set[int] = field(default_factory=set)
    failed: dict[int, BaseException] = field(default_factory=dict)


def record_batch(pairs: list[tuple[Claim, Any]], *, config: Config | None = None) -> Recorded:
    """Record the outcomes of these claims in one transaction, else one by one."""
    try:
        return Recorded(_commit(pairs, config))
    except Exception:  # noqa: BLE001 - one bad outcome must not sink the others
        logger.warning("a batch of %d items failed; recording them one by one", len(pairs))
    done = Recorded()
    for claim, outcome in pairs:
        try:
            done.ids |= _commit_alone(claim, outcome, config)
        except Exception as exc:  # noqa: BLE001 - the lane waiting on it fails with it
            done.failed[claim.item_id] = exc
    return done


def _commit_alone(claim: Claim, outcome: Any, config: Config | None) -> set[int]:
    try:
        return _commit([(claim, outcome)], config)
    except Exception as exc:  # noqa: BLE001 - stored as the item's error below
        logger.exception("could not record item %s of run %s", claim.item_id, claim.run_id)
        failure = services.unstorable_outcome(outcome, f"the result could not be stored: {exc}")
    # An error the item shows, rather than a retry that fails the same way.
    return _commit([(claim, failure)], config)


def _commit(pairs: list[tuple[Claim, Any]], config: Config | None) -> set[int]:
    """Record; a run whose last item this was is finalised."""
    recorded, due = aio.guarded(items_record, pairs)
    for run_id in due:
        aio.guarded(lifecycle.finish_if_done, run_id, config=config)
    return recorded


class Batch:
    """Outcomes committed together; `done` resolves to `Recorded` once they are.

    Lanes share the batch being filled: one future per commit, not one per item (a no-op
    item costs a few microseconds; a thread-safe wake-up of the loop per item would not)."""

    def __init__(self) -> None:
        self.pairs: list[tuple[Claim, Any]] = []
        self.done: concurrent.futures.Future = concurrent.futures.Future()


class Recorder:
    """The batching thread. `commit_on`: the executor every write goes through (the embedded
    mode's one SQLite connection), else this thread's own connection; `announce`: told which
    runs moved after each batch (team mode wakes `cobalt run` and `cobalt watch` waiting)."""

    MAX_BATCH = 1000
    LINGER = 0.05  # seconds a batch waits for more outcomes: a few commits a second

    def __init__(
        self,
        *,
        config: Config | None = None,
        commit_on: Executor | None = None,
        announce: Callable[[Iterable[str]], None] | None = None,
        linger: float = LINGER,
    ) -> None:
        self.config = config
        self.linger = linger
        self.commit_on = commit_on
        self.announce = announce
        self._ready = threading.Condition()
        self._filling = Batch()
        self._full: collections.deque[Batch] = collections.deque()
        self._closed = False
        self._now = False  # a lane waits for its outcomes: commit without lingering
        self.thread = threading.Thread(target=self._serve, name="cobalt-recorder", daemon=True)
        self.thread.start()

    def submit(self, claim: Claim, outcome: Any) -> Batch:
        """The batch that will record this outcome (its `done` resolves once committed)."""
        with self._ready:
            if len(self._filling.pairs) >= self.MAX_BATCH:
                self._full.append(self._filling)
                self._filling = Batch()
            batch = self._filling
            batch.pairs.append((claim, outcome))
            if len(batch.pairs) in (1, self.MAX_BATCH):  # a wake-up per batch, not per item
                self._ready.notify()
        return batch

    def flush(self) -> None:
        """Commit what is waiting now (a lane is about to wait for its outcomes)."""
        with self._ready:
            self._now = True
            self._ready.notify()

    def close(self, *, wait: bool = True) -> None:
        """Stop once what was submitted is recorded."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        if wait:
            self.thread.join(timeout=30)

    def _serve(self) -> None:
        while True:
            with self._ready:
                while not (self._full or self._filling.pairs or self._closed):
                    self._ready.wait()
                lingering = time.monotonic() + self.linger
                while not (self._full or self._closed or self._now):
                    left = lingering - time.monotonic()
                    if left <= 0:
                        break
                    self._ready.wait(left)
                self._now = False
                if self._full:
                    batch = self._full.popleft()
                elif self._filling.pairs:
                    batch, self._filling = self._filling, Batch()
                else:
                    return  # closed, nothing left
            self._record(batch)

    def _record(self, batch: Batch) -> None:
        pairs = batch.pairs
        try:
            if self.commit_on is None:
                results = record_batch(pairs, config=self.config)
            else:
                results = self.commit_on.submit(record_batch, pairs, config=self.config).result()
        except BaseException as exc:  # noqa: BLE001 - every lane waiting learns of it
            batch.done.set_exception(exc)
            return
        finally:
            batch.pairs = []  # the lanes keep the batch until they end, not its outcomes
        if self.announce is not None:
            self.announce({claim.run_id for claim, _ in pairs})
        batch.done.set_result(results)
