from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("cobalt_app", "0012_received_traces"),
    ]

    operations = [
        migrations.AddField(
            model_name="itemtrace",
            name="estimated",
            field=models.TextField(
                blank=True,
                default="",
                help_text="The model calls that reported no usage, whose tokens were counted or "
                "estimated (see `token_counts`), as JSON; empty if none.",
            ),
        ),
    ]
