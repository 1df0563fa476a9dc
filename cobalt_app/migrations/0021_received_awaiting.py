"""An item's received trace records which of its HTTP calls' client spans still await their
service's root span (`awaiting`): the run's OTLP receiver closes once every item's trace is
complete, not after a quiet spell (`otlp_server.wait_for_spans`)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("cobalt_app", "0020_lease_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="receivedtrace",
            name="awaiting",
            field=models.TextField(blank=True, db_default=""),
        ),
    ]
