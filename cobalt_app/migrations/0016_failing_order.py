from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("cobalt_app", "0015_judge_call"),
    ]

    operations = [
        migrations.AddField(
            model_name="runscoretable",
            name="failing_order",
            field=models.BinaryField(
                default=b"",
                help_text="The ids of the items with a failing verdict, in the failures view's "
                "order (int64, little-endian).",
            ),
        ),
    ]
