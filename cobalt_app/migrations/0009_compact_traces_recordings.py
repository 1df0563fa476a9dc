"""Traces and recordings stored compressed, what they share stored once (`blob_store`).

Each existing trace's steps and recording's exchanges are packed into the new `data` and
`blobs` columns, a few hundred rows at a time, before the JSON columns go; reversed, the JSON
is restored from them. The new columns are added nullable and made required at the end, when
the JSON columns are gone: SQLite copies the whole table for each column that cannot be added
or dropped in place, and by then the table is small.
"""

from django.db import migrations, models

from cobalt_app import blob_store

CHUNK = 500
TABLES = (("ItemTrace", "item_id", "steps"), ("Recording", "id", "exchanges"))


def _chunks(model, key, fields, db):
    """The rows' `key` and `fields`, CHUNK rows at a time, in key order."""
    rows = model.objects.using(db).order_by(key).values_list(key, *fields)
    last = None
    while True:
        chunk = list((rows if last is None else rows.filter(**{f"{key}__gt": last}))[:CHUNK])
        if not chunk:
            return
        yield chunk
        last = chunk[-1][0]


def pack_rows(apps, schema_editor):
    db = schema_editor.connection.alias
    blob = apps.get_model("cobalt_app", "Blob")
    for name, key, field in TABLES:
        model = apps.get_model("cobalt_app", name)
        table, column = model._meta.db_table, model._meta.get_field(key).column
        for chunk in _chunks(model, key, [field], db):
            blobs = {}
            packed = blob_store.pack([(value, None) for _, value in chunk], blobs)
            blob.objects.using(db).bulk_create(
                [blob(sha256=digest, data=blobs[digest]) for digest in sorted(blobs)],
                ignore_conflicts=True,
            )
            with schema_editor.connection.cursor() as cursor:
                cursor.executemany(
                    f"UPDATE {table} SET data = %s, blobs = %s WHERE {column} = %s",
                    [(data, refs, pk) for (pk, _), (data, refs) in zip(chunk, packed, strict=True)],
                )


def unpack_rows(apps, schema_editor):
    db = schema_editor.connection.alias
    blob = apps.get_model("cobalt_app", "Blob")
    for name, key, field in TABLES:
        model = apps.get_model("cobalt_app", name)
        for chunk in _chunks(model, key, ["data", "blobs"], db):
            digests = {digest for _, _, refs in chunk for digest in blob_store.digests(refs)}
            stored = list(blob.objects.using(db).filter(sha256__in=digests).values_list())
            texts = dict(
                zip(
                    [d for d, _ in stored],
                    blob_store.decompress([b for _, b in stored]),
                    strict=True,
                )
            )
            texts_of_rows = blob_store.decompress([data for _, data, _ in chunk])
            for (pk, _, refs), text in zip(chunk, texts_of_rows, strict=True):
                value = blob_store.unpack(text, refs, texts)
                model.objects.using(db).filter(**{key: pk}).update(**{field: value})


class Migration(migrations.Migration):
    dependencies = [
        ("cobalt_app", "0008_verdict_pass_marks"),
    ]

    operations = [
        migrations.CreateModel(
            name="Blob",
            fields=[
                ("sha256", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("data", models.BinaryField()),
            ],
        ),
        migrations.AddField(
            model_name="itemtrace", name="data", field=models.BinaryField(null=True)
        ),
        migrations.AddField(
            model_name="itemtrace", name="blobs", field=models.BinaryField(null=True)
        ),
        migrations.AddField(
            model_name="recording", name="data", field=models.BinaryField(null=True)
        ),
        migrations.AddField(
            model_name="recording", name="blobs", field=models.BinaryField(null=True)
        ),
        migrations.RunPython(pack_rows, unpack_rows),
        migrations.RemoveField(model_name="itemtrace", name="steps"),
        migrations.RemoveField(model_name="recording", name="exchanges"),
        migrations.AlterField(model_name="itemtrace", name="data", field=models.BinaryField()),
        migrations.AlterField(
            model_name="itemtrace",
            name="blobs",
            field=models.BinaryField(default=b""),
        ),
        migrations.AlterField(model_name="recording", name="data", field=models.BinaryField()),
        migrations.AlterField(
            model_name="recording",
            name="blobs",
            field=models.BinaryField(default=b""),
        ),
    ]
