"""Batches written to SQLite in one statement each.

Python's sqlite3 releases the GIL around every step of a statement: `executemany` of 1,000
rows, or an `UPDATE ... RETURNING` of 250, is a thousand (or 250) hand-overs of the GIL, and
while the event loop thread is busy each one waits for it (a claim measured 2.5 ms alone and
124 ms beside a busy thread). Here a batch travels as one JSON parameter that SQLite unpacks
with `json_each`: one step per statement, whatever the batch's size. PostgreSQL keeps the
statements of a row each for small batches; a big batch travels as one array per column,
unpacked with `unnest` (an `executemany` is one statement executed per row: PostgreSQL
parses, plans and runs each, several times the CPU of one statement for the batch). Team
workers record a batch as one JSON parameter too (`json_to_recordset`, `_records`): psycopg
dumps an array parameter value by value in Python.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from itertools import repeat
from typing import Any

from django.db import connection


def is_sqlite() -> bool:
    return connection.vendor == "sqlite"


def datetime_adapter() -> Callable[[datetime | None], Any]:
    """How a datetime parameter is sent: Django's adapter, but on SQLite a UTC datetime (what
    `timezone.now()` gives) directly as the text Django would store (5 µs less each; formatted
    by `isoformat`, a third less again than a naive copy's `str`)."""
    adapt = connection.ops.adapt_datetimefield_value
    if not is_sqlite() or connection.timezone is not UTC:
        return adapt

    def quick(value: datetime | None) -> Any:
        if value is not None and value.tzinfo is UTC:
            return value.isoformat(" ")[:-6]  # without "+00:00": as `str` of the naive one
        return adapt(value)

    return quick


def _columns(names: Sequence[str]) -> str:
    """`json_extract(value, '$[i]')` for each column, in order."""
    return ", ".join(_extracted(names).values())


def _extracted(names: Sequence[str]) -> dict[str, str]:
    return {name: f"json_extract(value, '$[{i}]') AS {name}" for i, name in enumerate(names)}


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
    if not is_sqlite():
        return _items_update_postgres(rows, finished)
    same = _sent_once(rows, ITEM_COLUMNS[:-1])
    sets = ", ".join(f"{n} = %s" if n in same else f"{n} = v.{n}" for n in ITEM_COLUMNS[:-1])
    varying = [name for name in ITEM_COLUMNS[:-1] if name not in same]
    sql = (
        f"UPDATE cobalt_app_itemresult SET {sets}, lease_expires_at = NULL "
        f"FROM (SELECT {_columns([*varying, 'id'])} FROM json_each(%s)) AS v "
        f"WHERE cobalt_app_itemresult.id = v.id "
        f"AND cobalt_app_itemresult.status NOT IN ({', '.join(['%s'] * len(finished))})"
    )
    packed = _packed(_without(rows, ITEM_COLUMNS, same))
    with connection.cursor() as cursor:
        cursor.execute(sql, [*same.values(), packed, *finished])
        return max(cursor.rowcount, 0)


def _sent_once(rows: Sequence[Sequence[Any]], names: Sequence[str]) -> dict[str, Any]:
    """The columns of `names` whose value is the same in every row, with it: sent once as
    a parameter, not in each row's JSON. SQLite's `json_extract` parses a row's JSON again for
    each column it reads (~0.6 µs a column a row); a batch's items mostly share their status,
    error, tokens, cost, and their evaluations all but the item and the score (issue 41)."""
    same: dict[str, Any] = {}
    if len(rows) < 2:
        return same
    for name, column in zip(names, zip(*rows, strict=False), strict=False):
        if _all_same(column):
            same[name] = column[0]
    return same


def _all_same(column: tuple) -> bool:
    """Whether every value is the first, of the same type (1 is not 1.0 nor True) and, for a
    zero, of the same sign (0.0 is not -0.0). Values a parameter would store otherwise than
    the JSON (NaN, infinities, integers beyond 64 bits) stay in the JSON."""
    first = column[0]
    # Most columns that differ do at the end; `count` compares by identity first (a batch's
    # shared values are mostly the same object), a set would hash each value.
    if column[-1] != first or column.count(first) != len(column):
        return False
    if len(set(map(type, column))) != 1:
        return False
    if isinstance(first, float):
        if not math.isfinite(first):
            return False
        return first != 0 or len(set(map(math.copysign, repeat(1.0), column))) == 1
    return not isinstance(first, int) or -(2**63) <= first < 2**63


def _without(rows: Sequence[Sequence[Any]], names: Sequence[str], same: dict) -> Any:
    """The rows without the columns sent once."""
    if not same:
        return rows
    kept = [i for i, name in enumerate(names) if name not in same]
    return [[row[i] for i in kept] for row in rows]


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
    if not is_sqlite():
        _evaluations_upsert_postgres(rows)
        return
    same = _sent_once(rows, EVALUATION_COLUMNS)
    same.pop("item_id", None)  # the evaluators of one item: in each row all the same
    extracted = _extracted([name for name in EVALUATION_COLUMNS if name not in same])
    selected = ", ".join(f"%s AS {n}" if n in same else extracted[n] for n in EVALUATION_COLUMNS)
    updates = ", ".join(f"{name} = excluded.{name}" for name in EVALUATION_COLUMNS[3:])
    sql = (
        f"INSERT INTO cobalt_app_evaluation ({', '.join(EVALUATION_COLUMNS)}) "
        f"SELECT {selected} FROM json_each(%s) WHERE true "
        f"ON CONFLICT (item_id, evaluator) DO UPDATE SET {updates}"
    )
    packed = _packed(_without(rows, EVALUATION_COLUMNS, same))
    with connection.cursor() as cursor:
        cursor.execute(sql, [*same.values(), packed])


# PostgreSQL: one array per column, unpacked by `unnest` into the rows of one statement.
ITEM_TYPES = ("text", "jsonb", "jsonb", "text", "text", "float8", "int4", "float8")
ITEM_TYPES += ("timestamptz", "timestamptz", "int8")
EVALUATION_TYPES = ("int8", "text", "text", "float8", "text", "text", "text", "bool", "int4")
EVALUATION_TYPES += ("float8", "text", "text")


def _unnest(names: Sequence[str], types: Sequence[str]) -> str:
    """`unnest(%s::text[], ...) AS v(name, ...)`: the columns' arrays as rows. jsonb travels
    as text (the JSON Cobalt stored) and is parsed once it is a row."""
    arrays = ", ".join(f"%s::{'text' if kind == 'jsonb' else kind}[]" for kind in types)
    return f"unnest({arrays}) AS v({', '.join(names)})"


def _value(name: str, kind: str) -> str:
    return f"v.{name}::jsonb" if kind == "jsonb" else f"v.{name}"


def _arrays(rows: Sequence[Sequence[Any]], types: Sequence[str]) -> list[list[Any]]:
    """The rows' columns (psycopg dumps a list of one Python type only: 0 and 0.5 together
    become floats)."""
    columns = zip(*(row[: len(types)] for row in rows), strict=True)
    arrays = []
    for kind, column in zip(types, columns, strict=True):
        convert = float if kind == "float8" else int if kind in ("int4", "int8") else None
        if convert is None:
            arrays.append(list(column))
        else:
            arrays.append([None if value is None else convert(value) for value in column])
    return arrays


def _items_update_postgres(rows: Sequence[Sequence[Any]], finished: Sequence[str]) -> int:
    columns = zip(ITEM_COLUMNS[:-1], ITEM_TYPES[:-1], strict=True)
    sets = ", ".join(f"{name} = {_value(name, kind)}" for name, kind in columns)
    sql = (
        f"UPDATE cobalt_app_itemresult SET {sets}, lease_expires_at = NULL "
        f"FROM {_unnest(ITEM_COLUMNS, ITEM_TYPES)} WHERE cobalt_app_itemresult.id = v.id "
        f"AND cobalt_app_itemresult.status NOT IN ({', '.join(['%s'] * len(finished))})"
    )
    with connection.cursor() as cursor:
        # One row per item: as one statement per row would, the first one counts.
        once = list({row[len(ITEM_COLUMNS) - 1]: row for row in reversed(rows)}.values())
        cursor.execute(sql, [*_arrays(once, ITEM_TYPES), *finished])
        return max(cursor.rowcount, 0)


def _evaluations_upsert_postgres(rows: Sequence[Sequence[Any]]) -> None:
    updates = ", ".join(f"{name} = excluded.{name}" for name in EVALUATION_COLUMNS[3:])
    sql = (
        f"INSERT INTO cobalt_app_evaluation ({', '.join(EVALUATION_COLUMNS)}) "
        f"SELECT * FROM {_unnest(EVALUATION_COLUMNS, EVALUATION_TYPES)} "
        f"ON CONFLICT (item_id, evaluator) DO UPDATE SET {updates}"
    )
    # One row per (item, evaluator): ON CONFLICT cannot touch a row twice in a statement;
    # as one statement per row would, the last one counts.
    once = list({(row[0], row[2]): row for row in rows}.values())
    with connection.cursor() as cursor:
        cursor.execute(sql, _arrays(once, EVALUATION_TYPES))


def items_record_claimed(
    run_id: str,
    rows: Sequence[Sequence[Any]],
    attempts: Sequence[int],
    evaluations: Sequence[Sequence[Any]],
    finished: Sequence[str],
) -> tuple[set[int], bool]:
    """PostgreSQL, team mode: store the run's finished items (`ITEM_COLUMNS` each) whose
    claims are still current (`attempts`, each item's: not finished, not claimed again since),
    their evaluations and the run's counter, in one statement; returns the ids stored and
    whether the run's counter reached its total.

    One statement, not five: while a batch is being recorded it holds the run's row, and
    between two statements of a transaction the recorder's thread waits for the worker's GIL
    (a busy event loop): the lock was held for that long, and the other processes' recorders
    queued behind it. The run is locked first, as `lifecycle.cancel` locks it (the `run` CTE
    is joined by the items' UPDATE: no item row is locked before it).
    """
    once = list(
        {
            row[len(ITEM_COLUMNS) - 1]: (*row, attempt)
            for row, attempt in zip(reversed(rows), reversed(attempts), strict=True)
        }.values()
    )
    item_names, item_types = (*ITEM_COLUMNS, "attempt"), (*ITEM_TYPES, "int4")
    columns = zip(ITEM_COLUMNS[:-1], ITEM_TYPES[:-1], strict=True)
    sets = ", ".join(f"{name} = {_value(name, kind)}" for name, kind in columns)
    updates = ", ".join(f"{name} = excluded.{name}" for name in EVALUATION_COLUMNS[3:])
    evaluated = _recordset(EVALUATION_COLUMNS, EVALUATION_TYPES)
    sql = (
        "WITH run AS (SELECT id FROM cobalt_app_run WHERE id = %s FOR UPDATE), "
        f"stored AS (UPDATE cobalt_app_itemresult AS i SET {sets}, lease_expires_at = NULL "
        f"FROM run, {_recordset(item_names, item_types)} WHERE i.id = ANY(%s::int8[]) "
        "AND i.id = v.id "
        f"AND i.attempts = v.attempt AND i.status NOT IN ({', '.join(['%s'] * len(finished))})"
        " RETURNING i.id), "
        f"scored AS (INSERT INTO cobalt_app_evaluation ({', '.join(EVALUATION_COLUMNS)}) "
        f"SELECT * FROM {evaluated} WHERE v.item_id IN (SELECT id FROM stored) "
        f"ON CONFLICT (item_id, evaluator) DO UPDATE SET {updates}), "
        "counted AS (UPDATE cobalt_app_run SET finished_items = finished_items + "
        "(SELECT count(*) FROM stored) WHERE id IN (SELECT id FROM run) "
        "AND EXISTS (SELECT 1 FROM stored) RETURNING finished_items >= total_items AS done) "
        "SELECT ARRAY(SELECT id FROM stored), (SELECT done FROM counted)"
    )
    scores = list({(row[0], row[2]): row for row in evaluations}.values())
    items = _records(once, item_names, item_types)
    # The ids again, as `id = ANY(...)`: the items read by primary key. Joined by id alone,
    # the planner reads every unfinished item of the table (or of the run) and hashes them.
    ids = "{" + ",".join(str(int(row[len(ITEM_COLUMNS) - 1])) for row in once) + "}"
    params = [run_id, items, ids, *finished, _records(scores, EVALUATION_COLUMNS, EVALUATION_TYPES)]
    stored, done = _bound_row(sql, params)
    return set(stored), bool(done)


def _recordset(names: Sequence[str], types: Sequence[str]) -> str:
    """`json_to_recordset(%s::json) AS v(name type, ...)`: the rows of one JSON parameter
    (`_records`); jsonb travels as text (the JSON Cobalt stored), parsed once it is a row."""
    columns = ", ".join(
        f"{name} {'text' if kind == 'jsonb' else kind}"
        for name, kind in zip(names, types, strict=True)
    )
    return f"json_to_recordset(%s::json) AS v({columns})"


def _records(rows: Sequence[Sequence[Any]], names: Sequence[str], types: Sequence[str]) -> str:
    """The rows as one JSON array of objects (`_recordset`). psycopg dumps an array parameter
    value by value in Python: the columns' arrays of a recorded batch were about a third of
    a team worker's recording CPU (issue 41, `py-spy --gil`); `json.dumps` is one C call.
    Non-finite floats travel as the strings PostgreSQL reads them from."""
    if not rows:
        return "[]"
    columns = _arrays(rows, types)
    for position, kind in enumerate(types):
        if kind == "float8":
            columns[position] = [_finite(value) for value in columns[position]]
        elif kind == "timestamptz":
            columns[position] = [_timestamp(value) for value in columns[position]]
    records = [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]
    return json.dumps(records, ensure_ascii=False, separators=(",", ":"))


def _finite(value: float | None) -> float | str | None:
    if value is None or value - value == 0:
        return value
    return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")


def _timestamp(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _bound_row(sql: str, params: list[Any]) -> tuple[Any, ...]:
    """One statement's first row, its parameters bound by the server (sent apart from the SQL
    as `$1`, `$2`, ...). Django's psycopg cursors bind on the client: each array's values
    quoted into the SQL text, which was about a tenth of a team worker's CPU for a recorded
    batch's arrays (issue 41, `py-spy --gil`). Not prepared: PgBouncer's transaction pooling
    keeps working."""
    import psycopg  # team mode: PostgreSQL only

    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(sql, params, prepare=False)
        return cursor.fetchone()
