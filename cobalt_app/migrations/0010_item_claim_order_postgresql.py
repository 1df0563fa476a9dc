"""PostgreSQL: an index that gives a run's pending items in id order (`claims.CLAIM_NEXT_SQL`).

Ordered by the bare id, the planner walked the primary key from the table's first row; by
`item_run_status` it sorted every pending item of the run at each claim. The claim orders by
`id + 0`, which only this index serves: each claim reads the few items it takes. SQLite's
claim needs none (its `item_run_status` entries are in rowid order already).
"""

from django.db import migrations

INDEX = "item_run_pending_order"


def create(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {INDEX} ON cobalt_app_itemresult (run_id, status, (id + 0))"
        )


def drop(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    dependencies = [("cobalt_app", "0009_compact_traces_recordings")]

    operations = [migrations.RunPython(create, drop)]
