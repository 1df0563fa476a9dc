"""The per-run search index (`run_search`): `SearchIndex` and `ItemField`, and the texts'
table, made by hand: an FTS5 table with the trigram tokenizer on SQLite (3.34+), a table with
a trigram GIN index on PostgreSQL (`pg_trgm`, a trusted extension). Where neither can be made,
searches read the run as before."""

import logging

import django.db.models.deletion
from django.db import DatabaseError, migrations, models, transaction

logger = logging.getLogger(__name__)

SQLITE = (
    "CREATE VIRTUAL TABLE cobalt_app_itemtext USING fts5("
    "run_id UNINDEXED, item UNINDEXED, part UNINDEXED, text, tokenize = 'trigram')",
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


def create_text_table(apps, schema_editor) -> None:
    connection = schema_editor.connection
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
        for statement in statements:
            cursor.execute(statement)


def drop_text_table(apps, schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        if schema_editor.connection.vendor == "sqlite":
            cursor.execute("DROP TRIGGER IF EXISTS cobalt_app_searchindex_texts")
        cursor.execute("DROP TABLE IF EXISTS cobalt_app_itemtext")


class Migration(migrations.Migration):
    dependencies = [
        ("cobalt_app", "0018_received_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="SearchIndex",
            fields=[
                (
                    "run",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to="cobalt_app.run",
                    ),
                ),
                ("ready", models.BooleanField(default=False)),
                (
                    "finished_at",
                    models.DateTimeField(
                        help_text="The run's `finished_at` it was built for (a new one rebuilds it).",
                        null=True,
                    ),
                ),
                ("started_at", models.DateTimeField(help_text="When its build was claimed.")),
                (
                    "keys",
                    models.JSONField(
                        default=dict,
                        help_text="The fields in `ItemField`, each with whether some of its values were too long to keep.",
                    ),
                ),
                (
                    "low",
                    models.BigIntegerField(
                        default=0, help_text="SQLite: the run's texts' first rowid."
                    ),
                ),
                (
                    "high",
                    models.BigIntegerField(
                        default=-1, help_text="SQLite: the run's texts' last rowid."
                    ),
                ),
            ],
        ),
        migrations.CreateModel(
            name="ItemField",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("key", models.CharField(max_length=200)),
                ("value", models.TextField(null=True)),
                ("item_id", models.BigIntegerField()),
                (
                    "run",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="cobalt_app.run",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["run", "key", "value", "item_id"], name="item_field_value")
                ],
            },
        ),
        migrations.RunPython(create_text_table, drop_text_table),
    ]
