import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("cobalt_app", "0014_received_usage"),
    ]

    operations = [
        migrations.CreateModel(
            name="JudgeCall",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("evaluator", models.CharField(max_length=100)),
                ("data", models.JSONField()),
                (
                    "item",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="judge_calls",
                        to="cobalt_app.itemresult",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("item", "evaluator"), name="judge_call_unique")
                ],
            },
        ),
    ]
