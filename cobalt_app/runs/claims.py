"""Claims: which process executes which item, and recording what it did.

A lane takes pending items with one conditional UPDATE (pending → running, with a lease,
`attempts` + 1) and records their outcomes with `items_record`, which only accepts the claim
that is still current. So an item is recorded once, whoever else claimed it after a lease ran
out and whatever message the broker delivered twice. The embedded mode (SQLite) and team
workers (PostgreSQL) claim and record with the same functions.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from cobalt_app import bulk_sql, services, storable
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
CLAIM_COLUMNS = (
    "id, run_id, item_index, run_index, item_key, input, output, metadata, latency_ms, tokens, "
    "cost, attempts"
)
CLAIM_RETURNING = f" RETURNING {CLAIM_COLUMNS}"


def claim_sql(count: int) -> str:
    """PostgreSQL: take these pending items (a conditional UPDATE) and start their run, in
    one round trip."""
    claim = (
        f"{CLAIM_SET} WHERE id IN ({', '.join(['%s'] * count)}) AND status = %s{CLAIM_RETURNING}"
    )
    return (
        f"WITH claimed AS ({claim}), started AS (UPDATE cobalt_app_run SET status = %s, "
        "started_at = %s WHERE id IN (SELECT run_id FROM claimed) AND status = %s) "
        "SELECT * FROM claimed"
    )


# PostgreSQL: take the run's first few pending items; concurrent lanes skip each other's
# rows. A CTE runs once. As `id IN (subquery)` the planner may run the locking subquery again
# for every row it scans, each time taking the next few items: one lane took them all.
CLAIM_NEXT_SQL = (
    "WITH next AS (SELECT id FROM cobalt_app_itemresult WHERE run_id = %s AND status = %s "
    f"ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) {CLAIM_SET} FROM next "
    "WHERE cobalt_app_itemresult.id = next.id AND status = %s"
    + CLAIM_RETURNING.replace(" id,", " cobalt_app_itemresult.id,", 1)
)


def items_claim(item_ids: list[int], worker: str) -> list[Claim]:
    """Take the items of `item_ids` still pending, in id order; the others are someone else's.

    Every claimed item gets a lease that the worker's heartbeat renews until it is recorded.
    """
    if not item_ids:
        return []
    now = timezone.now()
    pending = ItemResult.Status.PENDING
    if bulk_sql.is_sqlite():
        claims = _claimed_sqlite(SQLITE_PICK_IDS, [json.dumps(item_ids), pending], worker, now)
        if claims:
            Run.objects.filter(
                id__in={claim.run_id for claim in claims}, status=Run.Status.QUEUED
            ).update(status=Run.Status.RUNNING, started_at=now)
        return claims
    adapt = connection.ops.adapt_datetimefield_value
    params = [*_claim_set_params(worker, now), *item_ids, pending]
    params += [Run.Status.RUNNING, adapt(now), Run.Status.QUEUED]
    return _claimed(claim_sql(len(item_ids)), params)


def items_claim_next(run_id: str, worker: str, limit: int) -> list[Claim]:
    """Take up to `limit` of the run's pending items, first ones first (a lane going on)."""
    pending = ItemResult.Status.PENDING
    if bulk_sql.is_sqlite():
        params = [run_id, pending, limit]
        return _claimed_sqlite(SQLITE_PICK_NEXT, params, worker, timezone.now())
    claim = _claim_set_params(worker, timezone.now())
    return _claimed(CLAIM_NEXT_SQL, [run_id, pending, limit, *claim, pending])


# PostgreSQL: take the run's pending items among ids [first, end) (a range of the team's claim
# cursor, `team_cursor`): read by primary key, the run and "still pending" written so that no
# other index serves them (as SQLite's unary `+` below): by the run's index, PostgreSQL
# reads all of the run's items at every claim when the statistics are missing. The range is
# this lane's alone; a row another transaction holds (a cancel, the sweeper) is waited for
# and checked again.
CLAIM_RANGE_SQL = (
    f"{CLAIM_SET} WHERE id >= %s AND id < %s AND run_id || '' = %s AND status || '' = %s"
    f"{CLAIM_RETURNING}"
)
SQLITE_PICK_RANGE = (
    "SELECT json_group_array(id) FROM cobalt_app_itemresult "
    "WHERE id >= %s AND id < %s AND run_id = %s AND +status = %s"
)


def items_claim_range(run_id: str, worker: str, first: int, end: int) -> list[Claim]:
    """Take the run's pending items whose ids are in [first, end) (a range of its cursor)."""
    pending = ItemResult.Status.PENDING
    if bulk_sql.is_sqlite():
        params = [first, end, run_id, pending]
        return _claimed_sqlite(SQLITE_PICK_RANGE, params, worker, timezone.now())
    claim = _claim_set_params(worker, timezone.now())
    return _claimed(CLAIM_RANGE_SQL, [*claim, first, end, run_id, pending])


def _claim_set_params(worker: str, now: Any) -> list[Any]:
    adapt = connection.ops.adapt_datetimefield_value
    lease = adapt(now + timedelta(seconds=lease_grace()))
    return [ItemResult.Status.RUNNING, worker[:200], lease, adapt(now)]


def _claimed(sql: str, params: list[Any]) -> list[Claim]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return _claims(cursor.fetchall())


# SQLite: which items a claim takes (by id, or the run's next ones), then the claim itself
# and the claimed rows read back, each statement one step (see `bulk_sql`). The unary `+`
# keeps "still pending" a plain condition: planned from an index of the status, it would
# visit every pending item of every run at each claim.
SQLITE_PICK_IDS = (
    "SELECT json_group_array(id) FROM cobalt_app_itemresult "
    "WHERE id IN (SELECT value FROM json_each(%s)) AND +status = %s"
)
SQLITE_PICK_NEXT = (
    "SELECT json_group_array(id) FROM (SELECT id FROM cobalt_app_itemresult "
    "WHERE run_id = %s AND status = %s ORDER BY id LIMIT %s)"
)
SQLITE_CHOSEN = "WHERE id IN (SELECT value FROM json_each(%s))"
SQLITE_CLAIM = f"{CLAIM_SET} {SQLITE_CHOSEN}"
# Each item's input as JSON within the rows' JSON (`json(input)`), not as a string holding
# JSON: parsed once with the rows, not again item by item.
SQLITE_CLAIMED = (
    f"SELECT json_group_array(json_array({CLAIM_COLUMNS.replace(' input,', ' json(input),')})) "
    f"FROM cobalt_app_itemresult {SQLITE_CHOSEN}"
)


def _claimed_sqlite(pick: str, params: list[Any], worker: str, now: Any) -> list[Claim]:
    """SQLite: pick, claim and read back in one transaction (Cobalt's SQLite transactions
    begin IMMEDIATE: no other writer comes in between)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(pick, params)
        ids = cursor.fetchone()[0]
        if ids == "[]":
            return []
        cursor.execute(SQLITE_CLAIM, [*_claim_set_params(worker, now), ids])
        cursor.execute(SQLITE_CLAIMED, [ids])
        return _claims(_rows(cursor), parsed=True)


# SQLite: the claims' items as they are now, as one JSON value (one step of the statement:
# a row per step would hand the GIL over a thousand times a batch, see `bulk_sql`).
SQLITE_CURRENT = (
    "SELECT json_group_array(json_array(id, status, attempts)) FROM cobalt_app_itemresult "
    f"{SQLITE_CHOSEN}"
)


def _rows(cursor: Any) -> list[list[Any]]:
    """The rows a `json_group_array` query sent, as lists."""
    return json.loads(cursor.fetchone()[0])


def _claims(rows: list[Any], *, parsed: bool = False) -> list[Claim]:
    """The claimed rows as claims, in id order; `parsed`: the inputs are values already."""
    claims = []
    for row in sorted(rows):
        item_id, run_id, index, repetition, key, item = row[:6]
        snapshot = ItemSnapshot(
            item_id, index, repetition, key, item if parsed else storable.from_json(item)
        )
        claims.append(Claim(item_id, run_id, row[11], snapshot, tuple(row[6:11])))
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
    if not bulk_sql.is_sqlite():
        return _record_postgres(pairs)
    ids = [claim.item_id for claim, _ in pairs]
    with transaction.atomic():  # SQLite: IMMEDIATE, the one writer (no row locks to take)
        with connection.cursor() as cursor:
            cursor.execute(SQLITE_CURRENT, [json.dumps(ids)])
            current = {item_id: (status, tries) for item_id, status, tries in _rows(cursor)}
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


def _record_postgres(pairs: list[tuple[Claim, Any]]) -> tuple[set[int], set[str]]:
    """`items_record` on PostgreSQL: one statement per run of the batch (runs in id order,
    as a cancel locks them), checking each claim and counting on the run as it stores
    (`bulk_sql.items_record_claimed`)."""
    finished = [str(status) for status in ItemResult.FINISHED]
    by_run: dict[str, list[tuple[Claim, Any]]] = {}
    for claim, outcome in pairs:
        by_run.setdefault(claim.run_id, []).append((claim, outcome))
    recorded: set[int] = set()
    due: set[str] = set()
    prepared = {
        run_id: [storable.prepare(outcome) for _, outcome in by_run[run_id]] for run_id in by_run
    }
    # One run and nothing beside the rows (no trace, no judge's call): its one statement is
    # the whole transaction, without BEGIN and COMMIT's round trips.
    alone = len(prepared) == 1 and not any(
        services.has_extras(outcome) for outcomes in prepared.values() for outcome in outcomes
    )
    with contextlib.nullcontext() if alone else transaction.atomic():
        for run_id in sorted(prepared):
            outcomes = prepared[run_id]
            rows, evaluations = services.outcome_rows(run_id, outcomes)
            attempts = [claim.attempt for claim, _ in by_run[run_id]]
            stored, done = bulk_sql.items_record_claimed(
                run_id, rows, attempts, evaluations, finished
            )
            services.write_extras([outcome for outcome in outcomes if outcome.id in stored])
            recorded |= stored
            if done:
                due.add(run_id)
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
