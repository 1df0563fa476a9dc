import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("cobalt_app", "0016_failing_order"),
    ]

    operations = [
        migrations.CreateModel(
            name="RunFigures",
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
                (
                    "histogram",
                    models.JSONField(
                        default=dict,
                        help_text="Per evaluator, how many scores fall in each tenth of [0, 1].",
                    ),
                ),
                (
                    "failing_at",
                    models.JSONField(
                        default=dict,
                        help_text="Where each evaluator's items are in `failing_orders` "
                        "({'at': {name: [start, count]}}), and the pass marks they were ranked "
                        "with ({'marks': {name: mark}}).",
                    ),
                ),
                (
                    "failing_orders",
                    models.BinaryField(
                        default=b"",
                        help_text="Each evaluator's failing items' ids in its failures view's "
                        "order, one after another (int64, little-endian).",
                    ),
                ),
            ],
        ),
    ]
