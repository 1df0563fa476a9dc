"""`cobalt` starts fast: a command imports what it needs and builds only itself.

`bench/bench_cli.py` measures the start-up times; these tests pin what makes them short.
"""

from __future__ import annotations

import json
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


SCHEMA = """
import json, re, sqlite3, sys
from cobalt_cli.project import setup
if sys.argv[1] == "migrate":
    setup(migrate=False)
    from django.core.management import call_command
    call_command("migrate", interactive=False, verbosity=0)
else:
    setup()
db = sqlite3.connect(".cobalt/history.db")
tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
schema = {}
for table in tables:
    columns = sorted(map(list, db.execute(f"SELECT name, type, [notnull], dflt_value, pk FROM pragma_table_info('{table}')")))
    indexes = sorted([name, unique, [c[0] for c in db.execute(f"SELECT name FROM pragma_index_info('{name}') ORDER BY seqno")]]
        for name, unique in db.execute(f"SELECT name, [unique] FROM pragma_index_list('{table}')"))
    keys = sorted(map(list, db.execute(f"SELECT [table], [from], [to], on_delete FROM pragma_foreign_key_list('{table}')")))
    sql = db.execute("SELECT sql FROM sqlite_master WHERE name = ?", [table]).fetchone()[0]
    checks = sorted(re.findall(r"CHECK \\(((?:[^()]|\\([^()]*\\))*)\\)", sql))
    schema[table] = [columns, indexes, keys, checks]
rows = {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("django_migrations", "auth_permission", "django_content_type")}
print(json.dumps([schema, rows]))
"""


def test_a_new_database_gets_the_schema_its_migrations_build(tmp_path):
    # A new embedded database is created from the models at once (cobalt_project.bootstrap):
    # the same tables, columns, indexes, keys, checks and recorded migrations as `migrate`.
    built = {}
    for way in ("create", "migrate"):
        folder = tmp_path / way
        folder.mkdir()
        (folder / "cobalt.toml").write_text("")
        done = subprocess.run(
            [sys.executable, "-c", SCHEMA, way],
            cwd=folder,
            env=cli_env(),
            capture_output=True,
            text=True,
            check=True,
        )
        built[way] = json.loads(done.stdout)
    (created, created_rows), (migrated, migrated_rows) = built["create"], built["migrate"]
    assert "cobalt_app_itemresult" in created
    assert sorted(created) == sorted(migrated)
    assert {t: s for t, s in created.items() if s != migrated[t]} == {}
    assert created_rows == migrated_rows
