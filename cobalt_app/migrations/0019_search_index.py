"""The per-run search index (`run_search`): `SearchIndex` and `ItemField`, and the texts'
table, made by hand: an FTS5 table with the trigram tokenizer on SQLite (3.34+), a table with
a trigram GIN index on PostgreSQL (`pg_trgm`, a trusted extension). Where neither can be made,
searches read the run as before."""

import django.db.models.deletion
from django.db import migrations, models

from cobalt_app.run_search import create_text_table, drop_text_table


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
                (
                    "shared",
                    models.BooleanField(
                        default=False,
                        help_text="SQLite: other runs' items have ids between this run's (its texts are told apart by their run, a slower search).",
                    ),
                ),
                (
                    "folded",
                    models.BooleanField(
                        default=False,
                        help_text="SQLite: some text holds a character the trigram index folds to ASCII (`run_search.FOLDED`): every search compares the texts it finds again.",
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
                    models.Index(
                        fields=["run", "key", "value", "item_id"], name="item_field_value"
                    ),
                ],
            },
        ),
        migrations.RunPython(
            lambda apps, editor: create_text_table(editor.connection),
            lambda apps, editor: drop_text_table(editor.connection),
        ),
    ]
