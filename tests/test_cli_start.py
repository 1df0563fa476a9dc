"""`cobalt` starts fast: a command imports what it needs and builds only itself.

`bench/bench_cli.py` measures the start-up times; these tests pin what makes them short.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from tests.conftest import cli_env


def _modules_after(argv: list[str], cwd) -> set[str]:
    """The modules loaded by one `cobalt` command, run in a fresh interpreter."""
    script = (
        "import sys\n"
        f"sys.argv = {['cobalt', *argv]!r}\n"
        "from cobalt_cli.main import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('\\n'.join(sys.modules), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=cwd, env=cli_env(), capture_output=True, text=True
    )
    return set(done.stderr.split())


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["run", "--help"], ["history", "-h"]])
def test_help_and_version_import_neither_django_nor_rich_nor_the_engine(project, argv):
    heavy = {"django", "rich", "pydantic", "opentelemetry", "cobalt.dataset", "cobalt_app.engine"}
    loaded = _modules_after(argv, project.path)
    assert "cobalt_cli.main" in loaded, argv
    assert not heavy & loaded, (argv, heavy & loaded)


def test_history_imports_the_database_layer_and_nothing_it_does_not_read_with(project, cobalt_cli):
    assert cobalt_cli(project, "history").returncode == 0  # creates and migrates the database
    loaded = _modules_after(["history"], project.path)
    assert {"django.db.models", "cobalt_app.selectors", "rich.table"} <= loaded
    unneeded = {
        "pydantic",  # Typer 0.29 coerces parameters through it (~75 ms): Typer is held below
        "numpy",
        "scipy",
        "whitenoise",  # the settings name the static folder without the static-files machinery
        "opentelemetry",
        "cobalt_app.engine",
        "django.db.migrations.executor",  # an up-to-date database is not planned again
        "cobalt_app.admin",  # the admin registers its models where the URLs load
    }
    assert not unneeded & loaded, unneeded & loaded
    assert not [name for name in loaded if ".migrations.0" in name]


def test_the_help_lists_every_command_as_the_built_command_describes_itself():
    from cobalt_cli.main import app

    root = typer.main.get_command(app)
    listed = CliRunner().invoke(app, ["--help"], terminal_width=200)
    assert listed.exit_code == 0, listed.output
    assert not root.commands.built, "listing the commands built them"
    names = root.list_commands(None)
    assert {"run", "history", "compare", "token", "recordings", "worker"} <= set(names)
    for name in names:
        built = root.get_command(None, name)
        assert built.name == name
        line = f"  {name.ljust(max(map(len, names)))}  {built.get_short_help_str(200 - 6)}"
        assert line.rstrip() in listed.output.splitlines(), (name, listed.output)


def test_a_mistyped_command_is_refused_with_the_closest_names():
    from cobalt_cli.main import app

    typo = CliRunner().invoke(app, ["histroy"])
    assert typo.exit_code == 2
    assert "No such command 'histroy'. Did you mean 'history'?" in typo.output


@pytest.mark.django_db
def test_the_quick_migration_check_notices_a_migration_that_was_not_applied():
    from django.db import connection

    from cobalt_project.bootstrap import all_applied

    assert all_applied()
    with connection.cursor() as cursor:  # as if an upgrade had brought a new migration file
        cursor.execute(
            "DELETE FROM django_migrations WHERE app = 'cobalt_app' AND name = "
            "(SELECT MAX(name) FROM django_migrations WHERE app = 'cobalt_app')"
        )
    assert not all_applied()


@pytest.mark.django_db
def test_the_admin_still_lists_every_model_though_commands_do_not_register_them(admin_client):
    from django.contrib import admin

    page = admin_client.get("/admin/")
    assert page.status_code == 200
    for model in ("run", "itemresult", "evaluation", "judgecacheentry", "user"):
        assert f"/admin/{'auth' if model == 'user' else 'cobalt_app'}/{model}/" in page.text
    assert admin_client.get("/admin/cobalt_app/run/").status_code == 200
    assert len(admin.site._registry) >= 6
