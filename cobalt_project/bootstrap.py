"""Start Django for a command: settings from the project's config, database migrated."""

from __future__ import annotations

import os

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
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if not plan:
        return False
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    return True
