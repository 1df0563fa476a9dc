"""A finished run's search index, built by the dashboard, never on the item write path.

A new search text reads every item's input and output (their JSON as text), error and
evaluation reasons: ~100 ms of CPU per 100,000 items on SQLite, three times that on
PostgreSQL; a new field filter value reads every item's JSON. Indexes on the item tables
would serve both but make every item write dearer (team throughput), so the texts and each
short field's values are copied once into tables of their own when the run has finished:

- the texts (`cobalt_app_itemtext`, made by migration 0019): on SQLite an FTS5 table with the
  trigram tokenizer, on PostgreSQL a table with a trigram GIN index over `upper(text)`;
- each item's value of the run's fields (`field_keys`) in `ItemField`, by (run, key, value).

`cobalt serve`'s workers build a run's index in a thread on the first visit of its page
(`prepare`); until it is ready, and for what it cannot answer (a search shorter than three
characters, a field it does not hold), the pages read the run as before. A search of the index
finds exactly the items that read finds: the same texts, compared the same way (`LIKE` on
SQLite, `UPPER(…) LIKE UPPER(…)` on PostgreSQL, the user's `%`, `_` and `\\` escaped), the
trigram index finding the rows to compare; on SQLite, where its trigrams fold ASCII letters as
`LIKE` does, a search of ASCII text is answered from the index alone (`_sqlite_matching`).
Deleting a run deletes its `SearchIndex` row, which deletes its texts (a trigger, a foreign
key), and its `ItemField` rows.

Measured at 100,000 items on SQLite (`bench/bench_dashboard.py`, docs/concepts/scale.md): a
new search ~80 ms of CPU reading the run, 1-10 ms from the index (80 ms when every item
matches); a new filter value ~55 ms, ~1-10 ms; the build ~5 s of CPU, apart.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connection, connections, transaction
from django.db.models import (
    ExpressionWrapper,
    F,
    Func,
    IntegerField,
    Max,
    Min,
    Q,
    QuerySet,
    TextField,
    Value,
    Window,
)
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Cast, Length, RowNumber
from django.utils import timezone

from cobalt_app.models import Evaluation, ItemField, ItemResult, Run, SearchIndex

logger = logging.getLogger(__name__)

TABLE = "cobalt_app_itemtext"
MIN_CHARS = 3  # a trigram index cannot find less: shorter searches read the run
KEY_SAMPLE = 200  # items read to offer the run's fields and metadata keys
LONG_VALUE = 80  # a field with longer values is text, not a category: not offered nor kept
TEXT_FIELDS = ("id", "input", "expected", "expected_output", "metadata")
CHUNK = 5000  # item ids per build step: one short write transaction each
STALE = timedelta(minutes=15)  # a build claimed longer ago died with its process: claimed again
INPUT, OUTPUT, ERROR, REASON = range(4)  # what a text is (input and output are JSON)
SLOTS = 1024  # SQLite: texts per item in rowids (an item has a reason per evaluator)
# The characters other than ASCII letters that FTS5's trigram tokenizer folds to one (`ſ` to
# s, the Kelvin sign to k), where SQLite's LIKE does not (tests/test_triage_index.py checks).
FOLDED = ("\u017f", "\u212a")

_background = False
_building: set[str] = set()
_lock = threading.Lock()
_ready: OrderedDict[str, tuple[Any, SearchIndex]] = OrderedDict()  # run id: (finished_at, index)
KEPT = 1000


# Fields to filter and group by --------------------------------------------------------------


def field_value(key: str, prefix: str = "") -> Cast:
    """A dataset field (`category`), a key of the dataset item's metadata (`metadata.tier`)
    or of what the agent reported (`result.model`), as text; `prefix` reaches the item from
    another model (`"item__"` from an evaluation)."""
    column, path = f"{prefix}input", [key]
    if key.startswith("result."):
        column, path = f"{prefix}metadata", [key.removeprefix("result.")]
    elif key.startswith("metadata."):
        path = ["metadata", key.removeprefix("metadata.")]
    if connection.vendor == "sqlite":
        # One JSON_EXTRACT (a string's text as it is) instead of Django's key transform, which
        # parses each row's JSON three times: grouping 100k items by a field is a third faster.
        steps = "".join(f".{json.dumps(step)}" for step in path)
        return Cast(Func(F(column), Value(f"${steps}"), function="JSON_EXTRACT"), TextField())
    value: Any = column
    for step in path[:-1]:
        value = KeyTransform(step, value)
    return Cast(KeyTextTransform(path[-1], value), TextField())


def field_keys(run: Run) -> list[str]:
    """The fields and metadata keys of the run's first items that hold short plain values (a
    category, a tier, a model), to filter and group by."""
    rows = ItemResult.objects.filter(run=run, run_index=0).order_by("item_index")
    found: dict[str, None] = {}
    for item_input, metadata in rows.values_list("input", "metadata")[:KEY_SAMPLE]:
        item_input = item_input if isinstance(item_input, dict) else {}
        nested = item_input.get("metadata")
        for prefix, values in (
            ("", {k: v for k, v in item_input.items() if k not in TEXT_FIELDS}),
            ("metadata.", nested if isinstance(nested, dict) else {}),
            ("result.", metadata if isinstance(metadata, dict) else {}),
        ):
            for name, value in values.items():
                if _categorical(value):
                    found.setdefault(f"{prefix}{name}")
    return list(found)


def _categorical(value: Any) -> bool:
    if isinstance(value, str):
        return 0 < len(value) <= LONG_VALUE
    return isinstance(value, bool | int | float)


# The texts' table ---------------------------------------------------------------------------

SQLITE = (
    # A text's rowid is its item's id × SLOTS + what it is (`INPUT`…, reasons from `REASON`).
    "CREATE VIRTUAL TABLE cobalt_app_itemtext USING fts5("
    "run_id UNINDEXED, text, tokenize = 'trigram')",
    # A run's texts go with its index's row (deleted with the run, or before a rebuild).
    "CREATE TRIGGER cobalt_app_searchindex_texts AFTER DELETE ON cobalt_app_searchindex "
    "BEGIN DELETE FROM cobalt_app_itemtext "
    "WHERE rowid BETWEEN OLD.low AND OLD.high AND run_id = OLD.run_id; END",
)
POSTGRESQL = (
    "CREATE TABLE cobalt_app_itemtext (run_id varchar(32) NOT NULL "
    "REFERENCES cobalt_app_searchindex (run_id) ON DELETE CASCADE, "
    "item bigint NOT NULL, part smallint NOT NULL, text text NOT NULL)",
    "CREATE INDEX item_text_run ON cobalt_app_itemtext (run_id)",
    "CREATE INDEX item_text_trgm ON cobalt_app_itemtext USING gin (upper(text) gin_trgm_ops)",
)


def create_text_table(connection: Any) -> None:
    """Make the texts' table (migration 0019, and a new embedded database's schema)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            try:
                with transaction.atomic(using=connection.alias):
                    cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
            except DatabaseError as exc:  # not allowed here: searches read the run
                logger.warning("text search stays unindexed: %s", exc)
                return
            statements = POSTGRESQL
        elif connection.vendor == "sqlite":
            statements = SQLITE
        else:
            return
        try:
            with transaction.atomic(using=connection.alias):
                for statement in statements:
                    cursor.execute(statement)
        except DatabaseError as exc:  # no FTS5 or no trigram tokenizer (SQLite < 3.34)
            logger.warning("text search stays unindexed: %s", exc)


def drop_text_table(connection: Any) -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("DROP TRIGGER IF EXISTS cobalt_app_searchindex_texts")
        cursor.execute("DROP TABLE IF EXISTS cobalt_app_itemtext")


# Reading the index --------------------------------------------------------------------------


def index_of(run: Run) -> SearchIndex | None:
    """The run's index when it is built for the run as it is now (finished, not finalised
    again since); remembered by this process once found."""
    if not run.is_finished or run.finished_at is None or not available():
        return None
    kept = _ready.get(run.id)
    if kept is not None and kept[0] == run.finished_at:
        return kept[1]
    found = SearchIndex.objects.filter(run=run, ready=True, finished_at=run.finished_at).first()
    if found is not None:
        _ready[run.id] = (run.finished_at, found)
        while len(_ready) > KEPT:
            _ready.popitem(last=False)
    return found


def found_ids(run: Run, text: str, key: str, value: str) -> set[int] | None:
    """The ids of the items a search for `text` and the filter `key = value` leave (either
    may be empty), from the run's index; None when the index cannot answer."""
    if (text and len(text) < MIN_CHARS) or (key and value and len(value) > LONG_VALUE):
        return None
    index = index_of(run)
    if index is None or (key and value and key not in index.keys):
        return None
    found: set[int] | None = None
    if key and value:
        rows = ItemField.objects.filter(run=run, key=key, value=value)
        found = set(rows.values_list("item_id", flat=True))
    if text and (found is None or found):
        matched = _matching(index, text)
        found = matched if found is None else found & matched
    return found


def _sqlite_matching(index: SearchIndex, forms: list[str], likes: list[str]) -> tuple[str, list]:
    """The query of `_matching` on SQLite: the trigram index finds the texts holding each
    form (its escaped one in inputs and outputs only). For a text of ASCII only, in a run whose
    items' ids are its own and whose texts hold no `FOLDED` character, what it finds is what
    `LIKE` finds (both fold ASCII letters only), read from the rowids alone; else each text
    found is compared again with `LIKE` (reading the texts: ~4x the CPU)."""
    again = index.shared or index.folded or not forms[0].isascii()
    selects, params = [], []
    for number, (form, like) in enumerate(zip(forms, likes, strict=True)):
        sql = (
            f"SELECT rowid / {SLOTS} FROM {TABLE} WHERE {TABLE} MATCH %s "
            "AND rowid BETWEEN %s AND %s"
        )
        params += ['"{}"'.format(form.replace('"', '""')), index.low, index.high]
        if number:  # the escaped form: inputs and outputs (JSON) only
            sql += f" AND rowid %% {SLOTS} <= {OUTPUT}"
        if again:
            sql += " AND run_id = %s AND text LIKE %s ESCAPE '\\'"
            params += [index.run_id, like]
        selects.append(sql)
    return " UNION ".join(selects), params


def _matching(index: SearchIndex, text: str) -> set[int]:
    """Items with `text` in their input or output (as stored JSON, the text or its JSON
    escaped form: SQLite keeps non-ASCII characters and quotes escaped), error or a reason,
    compared as `page_triage.item_scope` compares them."""
    forms = list(dict.fromkeys([text, json.dumps(text)[1:-1]]))
    likes = [f"%{connection.ops.prep_for_like_query(form)}%" for form in forms]
    if connection.vendor == "sqlite":
        sql, params = _sqlite_matching(index, forms, likes)
    else:
        sql = (
            f"SELECT DISTINCT item FROM {TABLE} WHERE run_id = %s "
            "AND (UPPER(text) LIKE UPPER(%s)"
            + " OR (part <= %s AND UPPER(text) LIKE UPPER(%s))" * (len(likes) - 1)
            + ")"
        )
        params = [index.run_id, likes[0]]
        for like in likes[1:]:
            params += [OUTPUT, like]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {row[0] for row in cursor.fetchall()}


_available: dict[str, bool] = {}


def available() -> bool:
    """Whether this database has the texts' table (SQLite with FTS5's trigram tokenizer,
    PostgreSQL where `pg_trgm` could be made)."""
    alias = connection.alias
    if alias not in _available:
        _available[alias] = TABLE in connection.introspection.table_names()
    return _available[alias]


# Building it --------------------------------------------------------------------------------


def build_in_background() -> None:
    """Let this process build the indexes of the runs whose pages it shows (`cobalt serve`)."""
    global _background
    _background = True


def prepare(run: Run) -> None:
    """On a visit of a finished run's page: build its index in a thread of this process when
    it has none yet (only where `build_in_background` was called)."""
    if not _background or not run.is_finished or index_of(run) is not None:
        return
    with _lock:
        if run.id in _building:
            return
        _building.add(run.id)
    threading.Thread(target=_build_apart, args=(run.id,), daemon=True).start()


def _build_apart(run_id: str) -> None:
    try:
        run = Run.objects.filter(id=run_id).first()
        if run is not None:
            build(run)
    except Exception:  # the pages go on reading the run
        logger.exception("building the search index of run %s failed", run_id)
    finally:
        with _lock:
            _building.discard(run_id)
        connections.close_all()  # this thread's connections


def build(run: Run) -> bool:
    """Build the run's index (texts and fields), a chunk of items per transaction; False when
    another process is building it, it is built already or the run is not finished."""
    if not run.is_finished or run.finished_at is None or not available():
        return False
    claimed = _claim(run)
    if claimed is None:
        return False
    keys = {key: False for key in field_keys(run)}
    bounds = ItemResult.objects.filter(run=run).aggregate(first=Min("id"), last=Max("id"))
    first, last = bounds["first"] or 0, bounds["last"] if bounds["last"] is not None else -1
    SearchIndex.objects.filter(run=run).update(low=first * SLOTS, high=last * SLOTS + SLOTS - 1)
    for start in range(first, last + 1, CHUNK):
        with transaction.atomic():
            _insert_texts(run, start, start + CHUNK)
            items = ItemResult.objects.filter(run=run, id__gte=start, id__lt=start + CHUNK)
            count = items.count()
            for key in keys:
                keys[key] |= _insert_values(items, key) < count
    others = ItemResult.objects.filter(id__gte=first, id__lte=last).exclude(run=run)
    done = SearchIndex.objects.filter(run=run, started_at=claimed).update(
        ready=True, keys=keys, shared=others.exists(), folded=_folded(run, first, last)
    )
    return bool(done)


def _folded(run: Run, first: int, last: int) -> bool:
    """SQLite: whether a text of the run holds a `FOLDED` character (read once, when built)."""
    if connection.vendor != "sqlite":
        return False
    held = " OR ".join("instr(text, %s)" for _ in FOLDED)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT EXISTS (SELECT 1 FROM {TABLE} WHERE rowid BETWEEN %s AND %s "
            f"AND run_id = %s AND ({held}))",
            [first * SLOTS, last * SLOTS + SLOTS - 1, run.id, *FOLDED],
        )
        return bool(cursor.fetchone()[0])


def _claim(run: Run) -> Any:
    """Take the build of the run's index: its `started_at`, or None when it is built for this
    `finished_at` or being built by someone else (and not for too long). An old index (of a
    run finalised again) or a dead build is deleted first, with its rows."""
    now = timezone.now()
    with transaction.atomic():
        current = SearchIndex.objects.select_for_update().filter(run=run).first()
        if current is not None:
            if current.finished_at == run.finished_at and (
                current.ready or current.started_at > now - STALE
            ):
                return None
            current.delete()  # its texts with it
            ItemField.objects.filter(run=run).delete()
        SearchIndex.objects.create(run=run, finished_at=run.finished_at, started_at=now)
    return now


def _insert_texts(run: Run, start: int, end: int) -> None:
    """Copy the texts of the run's items with ids in [start, end)."""
    items = ItemResult.objects.filter(run=run, id__gte=start, id__lt=end)
    reasons = Evaluation.objects.filter(run=run, item_id__gte=start, item_id__lt=end)
    numbered = reasons.exclude(reason="").annotate(
        nth=Window(RowNumber(), partition_by=[F("item_id")], order_by=F("id").asc())
    )
    selects = [
        _texts(items, Value(INPUT), Cast("input", TextField())),
        _texts(items, Value(OUTPUT), Cast("output", TextField())),
        _texts(items.exclude(error=""), Value(ERROR), F("error")),
        _texts(numbered, F("nth") + (REASON - 1), F("reason"), item="item_id"),
    ]
    sqlite = connection.vendor == "sqlite"
    columns = "rowid, run_id, text" if sqlite else "run_id, item, part, text"
    with connection.cursor() as cursor:
        for sql, params in selects:
            cursor.execute(f"INSERT INTO {TABLE} ({columns}) {sql}", params)


def _texts(rows: QuerySet, part: Any, text: Any, item: str = "id") -> tuple[str, Any]:
    found = rows.order_by().annotate(
        text_of=text, part_of=ExpressionWrapper(part, output_field=IntegerField())
    )
    found = found.filter(text_of__isnull=False)
    if connection.vendor == "sqlite":  # more than SLOTS texts an item: the rowids collide
        found = found.annotate(rowid_of=F(item) * SLOTS + F("part_of"))
        return found.values_list("rowid_of", "run_id", "text_of").query.sql_with_params()
    return found.values_list("run_id", item, "part_of", "text_of").query.sql_with_params()


def _insert_values(items: QuerySet, key: str) -> int:
    """Copy the items' values of `key` up to `LONG_VALUE` characters (or none); how many."""
    valued = items.order_by().annotate(field_of=field_value(key), length=Length("field_of"))
    kept = valued.filter(Q(field_of__isnull=True) | Q(length__lte=LONG_VALUE))
    kept = kept.annotate(key_of=Value(key, output_field=TextField()))
    sql, params = kept.values_list("run_id", "key_of", "field_of", "id").query.sql_with_params()
    table = ItemField._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {table} (run_id, key, value, item_id) {sql}", params)
        return cursor.rowcount
