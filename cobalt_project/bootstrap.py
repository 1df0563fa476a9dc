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
