"""The received traces' foreign keys lose their own indexes: each is the first column of
another (`received_span_once`: trace, span_id; `received_item`: item, received_at), so they
were written at every span and trace stored for nothing. Dropped in place: an `AlterField`
would copy both tables on SQLite."""

import django.db.models.deletion
from django.db import migrations, models

INDEXES = ("cobalt_app_receivedspan_trace_id_9e327423", "cobalt_app_receivedtrace_item_id_fa2cf869")


class Migration(migrations.Migration):
    dependencies = [
        ("cobalt_app", "0017_run_figures"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="receivedspan",
                    name="trace",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="spans",
                        to="cobalt_app.receivedtrace",
                    ),
                ),
                migrations.AlterField(
                    model_name="receivedtrace",
                    name="item",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="received_traces",
                        to="cobalt_app.itemresult",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    [f"DROP INDEX IF EXISTS {name}" for name in INDEXES],
                    reverse_sql=[
                        f"CREATE INDEX {INDEXES[0]} ON cobalt_app_receivedspan (trace_id)",
                        f"CREATE INDEX {INDEXES[1]} ON cobalt_app_receivedtrace (item_id)",
                    ],
                )
            ],
        )
    ]
