"""Claims: which process executes which item, and recording what it did.

A lane takes pending items with one conditional UPDATE (pending → running, with a lease,
`attempts` + 1) and records their outcomes with `items_record`, which only accepts the claim
that is still current. So an item is recorded once, whoever else claimed it after a lease ran
out and whatever message the broker delivered twice. The embedded mode (SQLite) and team
workers (PostgreSQL) claim and record with the same functions.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from cobalt_app import services, storable
from cobalt_app.models import ItemResult, Run
from cobalt_app.runs import TeamModeError
from cobalt_app.services import ItemSnapshot

RETRY_STATUSES = (ItemResult.Status.ERROR, ItemResult.Status.TIMEOUT, ItemResult.Status.CANCELLED)
UNFINISHED = (ItemResult.Status.PENDING, ItemResult.Status.RUNNING)


def lease_grace() -> float:
    """Seconds a held item survives without a heartbeat (`COBALT_LEASE_GRACE`, default 60)."""
    try:
        return max(0.5, float(os.environ.get("COBALT_LEASE_GRACE") or 60))
    except ValueError:
        raise TeamModeError("COBALT_LEASE_GRACE must be a number of seconds") from None


def item_ids(run_id: str, statuses: Iterable[str] | None = None) -> list[int]:
    items = ItemResult.objects.filter(run_id=run_id)
    if statuses is not None:
        items = items.filter(status__in=list(statuses))
    return list(items.order_by("id").values_list("id", flat=True))


@dataclass
class Claim:
    """An item this worker holds: its snapshot, what is stored of it, and which attempt."""

    item_id: int
    run_id: str
    attempt: int
    snapshot: ItemSnapshot
    stored_row: tuple = ()  # output, metadata, latency, tokens, cost: as the database sent them

    @property
    def stored(self) -> dict[str, Any]:
        """What is stored of the item (a re-judge scores its output again); decoded only then."""
        output, metadata, latency, tokens, cost = self.stored_row or (None, None, None, 0, 0.0)
        return {
            "output": storable.from_json(output),
            "metadata": storable.from_json(metadata) or {},
            "latency_ms": latency,
            "tokens": tokens,
            "cost": cost,
        }


CLAIM_SET = (
    "UPDATE cobalt_app_itemresult SET status = %s, worker = %s, attempts = attempts + 1, "
    "lease_expires_at = %s, started_at = %s"
)
CLAIM_RETURNING = (
    " RETURNING id, run_id, item_index, run_index, item_key, input, output, metadata, "
    "latency_ms, tokens, cost, attempts"
)


def still_pending(*, postgresql: bool) -> str:
    """The claim's condition on the row itself. SQLite would answer it from the index on
    (status, lease), visiting every pending item of every run at each claim, where the ids
    name the rows already (a 20,000-item run claimed 30% slower). The unary `+` keeps it a
    plain condition: SQLite's documented way to rule an index out."""
    return "status = %s" if postgresql else "+status = %s"


def claim_sql(count: int, *, postgresql: bool) -> str:
    """Take these pending items (a conditional UPDATE); on PostgreSQL, start the run too."""
    claim = (
        f"{CLAIM_SET} WHERE id IN ({', '.join(['%s'] * count)}) "
        f"AND {still_pending(postgresql=postgresql)}{CLAIM_RETURNING}"
    )
    if not postgresql:
        return claim
    # The claim and "the run has started" in one round trip.
    return (
        f"WITH claimed AS ({claim}), started AS (UPDATE cobalt_app_run SET status = %s, "
        "started_at = %s WHERE id IN (SELECT run_id FROM claimed) AND status = %s) "
        "SELECT * FROM claimed"
    )


def claim_next_sql(*, postgresql: bool) -> str:
    """Take the run's first few pending items; concurrent lanes skip each other's rows."""
    pick = (
        "SELECT id FROM cobalt_app_itemresult WHERE run_id = %s AND status = %s "
        "ORDER BY id LIMIT %s"
    )
    if not postgresql:  # SQLite: one writer at a time, the subquery runs once
        return (
            f"{CLAIM_SET} WHERE id IN ({pick}) "
            f"AND {still_pending(postgresql=False)}{CLAIM_RETURNING}"
        )
    # A CTE runs once. As `id IN (subquery)` the planner may run the locking subquery again
    # for every row it scans, each time taking the next few items: one lane took them all.
    returning = CLAIM_RETURNING.replace(" id,", " cobalt_app_itemresult.id,", 1)
    return (
        f"WITH next AS ({pick} FOR UPDATE SKIP LOCKED) {CLAIM_SET} FROM next "
        f"WHERE cobalt_app_itemresult.id = next.id AND status = %s{returning}"
    )


def items_claim(item_ids: list[int], worker: str) -> list[Claim]:
    """Take the items of `item_ids` still pending, in id order; the others are someone else's.

    Every claimed item gets a lease that the worker's heartbeat renews until it is recorded.
    """
    if not item_ids:
        return []
    now = timezone.now()
    params = [*_claim_set_params(worker, now), *item_ids, ItemResult.Status.PENDING]
    together = connection.vendor == "postgresql"
    if together:
        adapt = connection.ops.adapt_datetimefield_value
        params += [Run.Status.RUNNING, adapt(now), Run.Status.QUEUED]
    claims = _claimed(claim_sql(len(item_ids), postgresql=together), params)
    if claims and not together:
        Run.objects.filter(
            id__in={claim.run_id for claim in claims}, status=Run.Status.QUEUED
        ).update(status=Run.Status.RUNNING, started_at=now)
    return claims


def items_claim_next(run_id: str, worker: str, limit: int) -> list[Claim]:
    """Take up to `limit` of the run's pending items, first ones first (a lane going on)."""
    pending = ItemResult.Status.PENDING
    claim, pick = _claim_set_params(worker, timezone.now()), [run_id, pending, limit]
    postgresql = connection.vendor == "postgresql"
    params = [*pick, *claim, pending] if postgresql else [*claim, *pick, pending]
    return _claimed(claim_next_sql(postgresql=postgresql), params)


def _claim_set_params(worker: str, now: Any) -> list[Any]:
    adapt = connection.ops.adapt_datetimefield_value
    lease = adapt(now + timedelta(seconds=lease_grace()))
    return [ItemResult.Status.RUNNING, worker[:200], lease, adapt(now)]


def _claimed(sql: str, params: list[Any]) -> list[Claim]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = sorted(cursor.fetchall())
    claims = []
    for row in rows:
        item_id, run_id, index, repetition, key, item = row[:6]
        snapshot = ItemSnapshot(item_id, index, repetition, key, storable.from_json(item))
        claims.append(Claim(item_id, run_id, row[11], snapshot, row[6:11]))
    return claims


def run_status(run_id: str) -> str | None:
    return Run.objects.filter(id=run_id).values_list("status", flat=True).first()


def items_record(pairs: list[tuple[Claim, Any]]) -> tuple[set[int], set[str]]:
    """Record outcomes whose claims are still current, in one transaction.

    Returns the ids recorded and the runs that may now be complete (their counter reached
    the total). An item is recorded exactly once: a claim that was superseded (its lease ran
    out and another worker took the item) or an item already finished records nothing.
    """
    if not pairs:
        return set(), set()
    ids = [claim.item_id for claim, _ in pairs]
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    with transaction.atomic():
        with connection.cursor() as cursor:
            if lock:
                # Runs before items, as `lifecycle.cancel` takes them: the other order
                # deadlocks against a cancel (the counters below lock the run anyway).
                runs = sorted({claim.run_id for claim, _ in pairs})
                cursor.execute(
                    f"SELECT id FROM cobalt_app_run WHERE id IN ({', '.join(['%s'] * len(runs))})"
                    f" ORDER BY id{lock}",
                    runs,
                )
            cursor.execute(
                f"SELECT id, status, attempts FROM cobalt_app_itemresult "
                f"WHERE id IN ({', '.join(['%s'] * len(ids))}){lock}",
                ids,
            )
            current = {item_id: (status, attempts) for item_id, status, attempts in cursor}
        by_run: dict[str, list[Any]] = {}
        recorded: set[int] = set()
        for claim, outcome in pairs:
            status, attempts = current.get(claim.item_id, (None, None))
            if status is None or status in ItemResult.FINISHED or attempts != claim.attempt:
                continue
            by_run.setdefault(claim.run_id, []).append(outcome)
            recorded.add(claim.item_id)
        for run_id, outcomes in by_run.items():
            # The rows are locked and still ours: no need to check them again inside.
            services.record_item_outcomes(run_id, outcomes, exclusive=True)
        due: set[str] = set()
        if by_run:
            runs = list(by_run)
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT id, finished_items, total_items FROM cobalt_app_run "
                    f"WHERE id IN ({', '.join(['%s'] * len(runs))})",
                    runs,
                )
                due = {run_id for run_id, done, total in cursor if done >= total}
    return recorded, due


def leases_renew(worker: str, ids: list[int]) -> set[int]:
    """Extend the leases of the items this worker still holds; returns those ids."""
    held = set(
        ItemResult.objects.filter(
            id__in=ids, status=ItemResult.Status.RUNNING, worker=worker[:200]
        ).values_list("id", flat=True)
    )
    if held:
        ItemResult.objects.filter(id__in=held, status=ItemResult.Status.RUNNING).update(
            lease_expires_at=timezone.now() + timedelta(seconds=lease_grace())
        )
    return held


def leases_release(worker: str, ids: list[int]) -> int:
    """Hand back items this worker holds (it is shutting down): pending again, for others."""
    return ItemResult.objects.filter(
        id__in=ids, status=ItemResult.Status.RUNNING, worker=worker[:200]
    ).update(status=ItemResult.Status.PENDING, worker="", lease_expires_at=None)
