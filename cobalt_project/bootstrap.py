"""Start Django for a command: settings from the project's config, database migrated."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from cobalt.config import Config, active_config, set_active_config

_ready = False


def setup(config: Config | None = None, *, migrate: bool = True) -> Config:
    """Configure and start Django once per process; migrate the embedded database if needed."""
    global _ready
    if config is not None:
        set_active_config(config)
    config = active_config()
    if _ready:
        return config
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cobalt_project.settings")
    import django

    django.setup()
    _ready = True
    if migrate and not config.get("database_url"):
        config.output_dir.mkdir(parents=True, exist_ok=True)
        migrate_if_needed()
    return config


def migrate_if_needed() -> bool:
    """Apply unapplied migrations; returns True when something was applied."""
    if all_applied():
        return False
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    if connection.vendor == "sqlite" and not connection.introspection.table_names():
        create_schema()
        return True

    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if not plan:
        return False
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    return True


def all_applied() -> bool:
    """Whether the database records every migration file of every app as applied.

    One query and a folder listing per app, where Django's own check imports every migration
    module to build its graph (~15 ms on each command). Anything unusual (no migrations table
    yet, a migrations package without source files) answers False, and the caller asks Django.
    """
    from django.apps import apps
    from django.conf import settings
    from django.db import DatabaseError, connection

    on_disk = set()
    for app in apps.get_app_configs():
        module = settings.MIGRATION_MODULES.get(app.label, f"{app.name}.migrations")
        try:
            spec = importlib.util.find_spec(module) if module else None
        except ImportError:
            return False
        if spec is None or not spec.submodule_search_locations:
            continue  # an app without migrations
        names = [
            path.stem
            for folder in spec.submodule_search_locations
            for path in Path(folder).glob("*.py")
            if not path.name.startswith(("_", "~"))
        ]
        if not names:
            return False
        on_disk.update((app.label, name) for name in names)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT app, name FROM django_migrations")
            applied = set(cursor.fetchall())
    except DatabaseError:
        return False
    return on_disk <= applied


def create_schema() -> None:
    """A brand-new SQLite database (the embedded default's first command): every model's
    table created from the models at once, every migration recorded as applied, then what
    `migrate` would do after (`post_migrate`: content types, permissions).

    Replaying the 30-odd migrations of Django's apps and Cobalt's renders the models' state
    again for each (~0.8 s of CPU, on every first run and in every fresh test project); the
    models are that state already (`makemigrations --check` is clean, and
    tests/test_cli_start.py compares the schema built both ways).
    """
    from django.apps import apps
    from django.core.management.sql import emit_post_migrate_signal
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader
    from django.db.migrations.recorder import MigrationRecorder

    from cobalt_app import run_search

    models = [
        model
        for model in apps.get_models()
        if model._meta.managed and not model._meta.proxy and not model._meta.swapped
    ]
    loader = MigrationLoader(connection, ignore_no_migrations=True)
    with connection.schema_editor() as editor:  # one transaction: all or nothing
        for model in models:
            editor.create_model(model)  # its many-to-many tables too
        run_search.create_text_table(connection)  # not a model (migration 0019)
        recorder = MigrationRecorder(connection)
        recorder.ensure_schema()
        recorder.migration_qs.bulk_create(
            recorder.Migration(app=app, name=name) for app, name in sorted(loader.disk_migrations)
        )
    emit_post_migrate_signal(verbosity=0, interactive=False, db=connection.alias)
