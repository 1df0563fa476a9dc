from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("cobalt_app", "0013_trace_estimated_usage"),
    ]

    operations = [
        migrations.AddField(
            model_name="receivedtrace",
            name="tokens",
            field=models.BigIntegerField(
                db_default=0, help_text="Its model calls' tokens, counted in its item's."
            ),
        ),
        migrations.AddField(
            model_name="receivedtrace",
            name="cost",
            field=models.FloatField(
                db_default=0.0, help_text="Its model calls' cost, counted in its item's."
            ),
        ),
    ]
