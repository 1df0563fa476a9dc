"""Trigram indexes for the run page's text search, on PostgreSQL only (`page_triage.item_scope`).

Without them a search reads every item of the run and serialises its input and output
(JSONB) to text to look inside: ~300 ms of database CPU at 100,000 items, 1.5 s at 500,000.
With them (GIN over the run and the upper-cased text, as Django's `icontains` compares it) it
is a few index lookups: ~3 ms. They cost writes: storing 20,000 items took ~2.5x as long
(4.3 s against 1.7 s, under load), and building them here takes ~20 s per 300,000 items
(`CONCURRENTLY`: writes go on meanwhile). SQLite has no such index: it reads the run.

`pg_trgm` and `btree_gin` are trusted extensions (PostgreSQL 13+): a database's owner may
create them. Where they cannot be created, the search works as before, without the indexes.
"""

import logging

from django.db import migrations

logger = logging.getLogger(__name__)

INDEXES = (
    (
        "item_search_trgm",
        "cobalt_app_itemresult",
        "run_id, upper(error) gin_trgm_ops, upper((input)::text) gin_trgm_ops, "
        "upper((output)::text) gin_trgm_ops",
    ),
    ("evaluation_reason_trgm", "cobalt_app_evaluation", "run_id, upper(reason) gin_trgm_ops"),
)


def create(apps, schema_editor) -> None:
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        try:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
            cursor.execute("CREATE EXTENSION IF NOT EXISTS btree_gin")
        except Exception as exc:  # not allowed here: search without the indexes
            logger.warning("text search stays unindexed: %s", exc)
            return
        for name, table, columns in INDEXES:
            cursor.execute(
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} USING gin ({columns})"
            )


def drop(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for name, _, _ in INDEXES:
            cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("cobalt_app", "0017_run_figures"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
