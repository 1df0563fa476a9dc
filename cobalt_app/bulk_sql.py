"""Batches written to SQLite in one statement each.

Python's sqlite3 releases the GIL around every step of a statement: `executemany` of 1,000
rows, or an `UPDATE ... RETURNING` of 250, is a thousand (or 250) hand-overs of the GIL, and
while the event loop thread is busy each one waits for it (a claim measured 2.5 ms alone and
124 ms beside a busy thread). Here a batch travels as one JSON parameter that SQLite unpacks
with `json_each`: one step per statement, whatever the batch's size. PostgreSQL keeps the
plain statements (psycopg sends an `executemany` in one pipeline).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from django.db import connection


def is_sqlite() -> bool:
    return connection.vendor == "sqlite"


def datetime_adapter() -> Callable[[datetime | None], Any]:
    """How a datetime parameter is sent: Django's adapter, but on SQLite a UTC datetime (what
    `timezone.now()` gives) directly as the text Django would store (5 µs less each)."""
    adapt = connection.ops.adapt_datetimefield_value
    if not is_sqlite() or connection.timezone is not UTC:
        return adapt

    def quick(value: datetime | None) -> Any:
        if value is not None and value.tzinfo is UTC:
            return str(value.replace(tzinfo=None))
        return adapt(value)

    return quick


def _columns(names: Sequence[str]) -> str:
    """`json_extract(value, '$[i]')` for each column, in order."""
    return ", ".join(f"json_extract(value, '$[{i}]') AS {name}" for i, name in enumerate(names))


def _packed(rows: Sequence[Sequence[Any]]) -> str:
    return json.dumps(rows, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


ITEM_COLUMNS = (
    "status",
    "output",
    "metadata",
    "error",
    "traceback",
    "latency_ms",
    "tokens",
    "cost",
    "started_at",
    "finished_at",
    "id",
)


def items_update(rows: Sequence[Sequence[Any]], finished: Sequence[str]) -> int:
    """Store finished items (`ITEM_COLUMNS` each) not finished already; returns how many."""
    sets = ", ".join(f"{name} = v.{name}" for name in ITEM_COLUMNS[:-1])
    sql = (
        f"UPDATE cobalt_app_itemresult SET {sets}, lease_expires_at = NULL "
        f"FROM (SELECT {_columns(ITEM_COLUMNS)} FROM json_each(%s)) AS v "
        f"WHERE cobalt_app_itemresult.id = v.id "
        f"AND cobalt_app_itemresult.status NOT IN ({', '.join(['%s'] * len(finished))})"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [_packed(rows), *finished])
        return max(cursor.rowcount, 0)


EVALUATION_COLUMNS = (
    "item_id",
    "run_id",
    "evaluator",
    "score",
    "reason",
    "status",
    "error",
    "cached",
    "tokens",
    "cost",
    "chain_of_thought",
    "unpriced_model",
)


def evaluations_upsert(rows: Sequence[Sequence[Any]]) -> None:
    """Store evaluations (`EVALUATION_COLUMNS` each), replacing an item's earlier one."""
    updates = ", ".join(f"{name} = excluded.{name}" for name in EVALUATION_COLUMNS[3:])
    sql = (
        f"INSERT INTO cobalt_app_evaluation ({', '.join(EVALUATION_COLUMNS)}) "
        f"SELECT {_columns(EVALUATION_COLUMNS)} FROM json_each(%s) WHERE true "
        f"ON CONFLICT (item_id, evaluator) DO UPDATE SET {updates}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [_packed(rows)])
