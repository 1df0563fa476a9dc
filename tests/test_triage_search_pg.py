"""The run page's text search on PostgreSQL: the trigram indexes (migration 0018) are made,
the search finds the same items as on SQLite (input, output, error, reasons, any case,
quotes) and PostgreSQL looks them up in the indexes instead of reading the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import cli_env

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

SEARCH = r"""
import json
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.db import connection, transaction
from cobalt_app import page_triage
from cobalt_app.models import Evaluation, ItemResult, Run

run = Run.objects.create(name="qa", file="qa.py", status="completed", config={})
other = Run.objects.create(name="qa", file="qa.py", status="completed", config={})
for owner in (run, other):
    items = ItemResult.objects.bulk_create(
        ItemResult(
            run=owner, item_index=i, item_key=f"k{i:04d}", status="error" if i == 7 else "ok",
            input={"input": f"Question number {i}?", "category": "refund"},
            output=None if i == 7 else f'Answer {i}: the "parcel" ships today',
            error="RuntimeError: Refund tool DOWN" if i == 7 else "",
        )
        for i in range(3000)
    )
    Evaluation.objects.bulk_create(
        Evaluation(
            item=item, run=owner, evaluator="judge", score=1.0,
            reason="mentions a voucher" if item.item_index == 11 else "fine",
        )
        for item in items
    )
connection.cursor().execute("ANALYZE")

def found(text):
    scope = page_triage.item_scope(run, page_triage.ListState(view="all", q=text))
    return sorted(scope.values_list("item_key", flat=True))

out = {
    "input": found("NUMBER 42?"),
    "output": found('"parcel" ships today')[:2],
    "error": found("tool down"),
    "reason": found("Voucher"),
    "nothing": found("no such text"),
}
TABLES = "('cobalt_app_itemresult', 'cobalt_app_evaluation')"
with transaction.atomic(), connection.cursor() as cursor:
    # The plan of a big table on this small one: without the indexes on the run alone (put
    # back after), a search that reads the run's rows to filter them would scan the table.
    cursor.execute(
        "SELECT conname, conrelid::regclass::text FROM pg_constraint "
        f"WHERE contype = 'u' AND conrelid::regclass::text IN {TABLES}"
    )
    for name, table in cursor.fetchall():
        cursor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
    cursor.execute(
        f"SELECT indexname FROM pg_indexes WHERE tablename IN {TABLES} "
        "AND indexname NOT LIKE '%%_trgm' AND indexname NOT LIKE '%%_pkey'"
    )
    for (name,) in cursor.fetchall():
        cursor.execute(f'DROP INDEX "{name}"')
    cursor.execute("SET LOCAL enable_seqscan = off")
    scope = page_triage.item_scope(run, page_triage.ListState(view="all", q="number 42"))
    sql, params = scope.order_by().values_list("id", flat=True).query.sql_with_params()
    cursor.execute("EXPLAIN " + sql, params)
    out["plan"] = "\n".join(row[0] for row in cursor.fetchall())
    transaction.set_rollback(True)
with connection.cursor() as cursor:
    cursor.execute("SELECT indexname FROM pg_indexes WHERE indexname LIKE '%%_trgm'")
    out["indexes"] = sorted(row[0] for row in cursor.fetchall())
print(json.dumps(out))
"""


@pytest.fixture
def postgres() -> Iterator[str]:
    name = f"cobalt_test_search_{os.getpid()}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_search_on_postgresql_looks_up_its_trigram_indexes(postgres, tmp_path):
    env = cli_env(
        {"DJANGO_SETTINGS_MODULE": "cobalt_project.settings", "COBALT_DATABASE_URL": postgres}
    )
    done = subprocess.run(
        [sys.executable, "-c", SEARCH],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["indexes"] == ["evaluation_reason_trgm", "item_search_trgm"]
    assert out["input"] == ["k0042"]
    assert out["output"] == ["k0000", "k0001"]
    assert out["error"] == ["k0007"]
    assert out["reason"] == ["k0011"]
    assert out["nothing"] == []
    assert "item_search_trgm" in out["plan"] and "evaluation_reason_trgm" in out["plan"]
