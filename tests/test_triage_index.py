"""A finished run's search index (`run_search`), built apart from the run: a search or a field
filter answered by it finds exactly the items reading the run finds (`page_triage.item_scope`),
on SQLite here and on PostgreSQL in a subprocess; the run page uses it with pinned queries;
deleting the run (a clean) deletes its rows; `cobalt serve` builds it on a run's first visit."""

from __future__ import annotations

import os
import re
import string
import time
from collections.abc import Iterator

import httpx
import pytest
from django.db import connection

from cobalt.config import load_config
from cobalt_app import page_triage, retention, run_search
from cobalt_app.models import Evaluation, ItemField, ItemResult, Run, SearchIndex
from tests import team_harness as harness
from tests.conftest import cobalt_run, new_project, served
from tests.test_triage import HTMX, make_run, row_keys, support_items
from tests.test_triage import client as client  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db


# Texts that LIKE and FTS5 read specially, escaped forms of JSON, other scripts and cases.
ODD = {
    "t01": 'a 100% "sure" answer_with_underscores',
    "t02": "back\\slash and it's a 50%_off deal",
    "t03": "Où est l'été ? ÉTÉ ! Straße 🙂 ok",
    "t04": "line one\nline two\ttabbed",
    "t05": "nothing special",
}
SEARCHES = [
    "100%",
    "0%_",
    "%_o",
    "_with_",
    '"sure"',
    'a 100% "sure',
    "back\\slash",
    "\\sl",
    "it's",
    "été",
    "ÉTÉ",
    "OÙ EST",
    "straße",
    "🙂 ok",
    "\\u00e9",
    "line one\nline",
    "\\nline",
    "\ttab",
    "answer 10",
    "ANSWER",
    "judge on t08",
    "on t0",
    "refund",
    '"category": "refund"',
    "question",
    "no such text",
    "%%%",
    "___",
    '"""',
    "   ",
    "kelvin",
    "\u212aelvin",
    "LONG S",
    "the long \u017f",
]


def odd_run(runs: int = 1) -> Run:
    items = support_items()
    for key, text in ODD.items():
        items[int(key[1:])]["input"] = text
    return make_run(
        items,
        outputs={"t06": "I cannot HELP with 5% of that", "t09": {"nested": "Où_100%"}},
        errors={"t07": "RuntimeError: Refund tool DOWN for o017"},
        scores={"t08": {"judge": 0.1}, "t10": {"judge": 0.3}},
        runs=runs,
    )


def scanned(run: Run, q: str = "", key: str = "", value: str = "") -> set[int]:
    state = page_triage.ListState(view="all", q=q, key=key, value=value)
    return set(page_triage.item_scope(run, state).values_list("id", flat=True))


def interleave(run: Run, other: Run) -> None:
    """Give one of `run`'s item ids to an item of `other` (as concurrent team runs do)."""
    taken = run.items.order_by("id")[3]
    ItemResult.objects.filter(id=taken.id).delete()
    moved = other.items.order_by("id").first()
    ItemResult.objects.filter(id=moved.id).update(id=taken.id)
    Evaluation.objects.filter(item_id=moved.id).update(item_id=taken.id)


@pytest.mark.parametrize("flavour", ["own ids", "interleaved ids", "folded characters"])
def test_the_index_finds_exactly_what_reading_the_run_finds(flavour: str):
    run = odd_run(runs=2)
    other = odd_run()  # another run's items are never found
    if flavour == "interleaved ids":
        interleave(run, other)
    if flavour == "folded characters":  # the trigram index folds them to k and s, LIKE not
        run.items.filter(item_key="t06").update(error="\u212aelvin and the long \u017f")
    assert run_search.index_of(run) is None and run_search.found_ids(run, "été", "", "") is None
    keys = run_search.field_keys(run)
    assert {"category", "metadata.tier", "result.model"} <= set(keys)
    assert run_search.build(run) and run_search.build(other)
    assert not run_search.build(run)  # built already
    index = run_search.index_of(run)
    assert (index.shared, index.folded) == (
        flavour == "interleaved ids",
        flavour == "folded characters",
    )
    for text in SEARCHES:
        assert run_search.found_ids(run, text, "", "") == scanned(run, text), text
    assert scanned(run, "été") and scanned(run, "100%") and not scanned(run, "___")
    assert run_search.found_ids(run, "ou", "", "") is None  # shorter than a trigram: the scan
    for key in run_search.field_keys(run):
        values = {None, "refund", "gold", "m", "nope", "1"}
        for value in values - {None}:
            found = run_search.found_ids(run, "", key, value)
            assert found == scanned(run, key=key, value=value), (key, value)
            assert run_search.found_ids(run, "answer", key, value) == scanned(
                run, "answer", key, value
            )
    assert run_search.found_ids(run, "", "category", "refund")
    assert run_search.found_ids(run, "", "no_such_field", "x") is None  # not held: the scan


def test_the_characters_the_trigram_index_folds_to_ascii_letters_are_known():
    """`run_search.FOLDED`: every character outside ASCII that the tokenizer finds when asked
    for an ASCII letter (Unicode's basic plane and the next; nothing above folds)."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE VIRTUAL TABLE temp.folds USING fts5(text, tokenize = 'trigram')")
        odd = [(cp, f"#{chr(cp)}#") for cp in range(0x80, 0x20000) if not 0xD800 <= cp <= 0xDFFF]
        cursor.executemany("INSERT INTO temp.folds (rowid, text) VALUES (%s, %s)", odd)
        found = set()
        for letter in string.ascii_letters:
            cursor.execute("SELECT rowid FROM temp.folds WHERE folds MATCH %s", [f'"#{letter}#"'])
            found |= {chr(row[0]) for row in cursor.fetchall()}
        cursor.execute("DROP TABLE temp.folds")
    assert found == set(run_search.FOLDED)


def test_a_run_finalised_again_is_indexed_again():
    run = odd_run()
    assert run_search.build(run)
    built = texts(run.id)
    Run.objects.filter(id=run.id).update(finished_at=run.finished_at.replace(year=2030))
    again = Run.objects.get(id=run.id)
    assert run_search.index_of(again) is None  # built for the run as it was
    assert run_search.build(again)
    assert run_search.found_ids(again, "été", "", "") == scanned(again, "été")
    assert SearchIndex.objects.filter(run=run).count() == 1
    assert texts(run.id) == built  # the old texts went


def texts(run_id: str) -> int:
    table = run_search.TABLE
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table} WHERE run_id = %s", [run_id])
        return cursor.fetchone()[0]


def test_the_run_page_searches_the_index_with_pinned_queries(client, django_assert_num_queries):  # noqa: F811
    run = odd_run()
    assert run_search.build(run)
    url = f"/runs/{run.id}/?view=all&q="
    # run, the index (once a process), the searched texts (the page's count), rows, scores,
    # flaky marks (2), the fields to filter by
    with django_assert_num_queries(8):
        page = client.get(url + "été", **HTMX | {"HTTP_HX_TARGET": "items"}).content.decode()
    assert row_keys(page) == ["t03"]
    with django_assert_num_queries(7):  # a new search: the index is known to this process
        page = client.get(url + "50%_", **HTMX | {"HTTP_HX_TARGET": "items"}).content.decode()
    assert row_keys(page) == ["t02"]
    with django_assert_num_queries(7):  # a new filter value: its items only
        page = client.get(
            f"/runs/{run.id}/?view=all&key=category&value=login",
            **HTMX | {"HTTP_HX_TARGET": "items"},
        ).content.decode()
    assert row_keys(page) == ["t02", "t05", "t08", "t11"]
    failing = client.get(f"/runs/{run.id}/?q=judge+on+t10").content.decode()
    assert row_keys(failing) == ["t10"]
    # The item panel walks what the index found.
    panel = client.get(f"/runs/{run.id}/items/4/?view=all&q=%C3%A9t%C3%A9").content.decode()
    place = re.search(r'id="item-place"[^>]*>([^<]*)<', panel)
    assert place is not None and place.group(1).strip() == "1 of 1 items matching “été”"


@pytest.mark.django_db(transaction=True)
def test_deleting_a_run_deletes_its_index(tmp_path):
    gone, kept = odd_run(), odd_run()
    assert run_search.build(gone) and run_search.build(kept)
    built = texts(kept.id)
    assert texts(gone.id) and ItemField.objects.filter(run=gone).exists()
    Run.objects.filter(id=kept.id).update(created_at=kept.created_at.replace(year=2099))
    (tmp_path / "cobalt.toml").write_text("")
    report = retention.clean([retention.Rule("runs", keep_last=1)], load_config(tmp_path))
    assert report.deleted["runs"]["runs"] == 1
    assert not Run.objects.filter(id=gone.id).exists()
    assert texts(gone.id) == 0 and not ItemField.objects.filter(run_id=gone.id).exists()
    assert not SearchIndex.objects.filter(run_id=gone.id).exists()
    assert texts(kept.id) == built
    assert run_search.found_ids(kept, "été", "", "") == scanned(kept, "été")


# PostgreSQL ---------------------------------------------------------------------------------

PG_SCRIPT = r"""
import json, sys
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from tests.test_triage_index import SEARCHES, odd_run, scanned
from cobalt_app import retention, run_search
from cobalt_app.models import ItemField, Run
from django.db import connection, transaction

run, other = odd_run(runs=2), odd_run()
out = {"before": run_search.found_ids(run, "été", "", "") is None}
out["built"] = run_search.build(run) and run_search.build(other)
out["wrong"] = [t for t in SEARCHES if run_search.found_ids(run, t, "", "") != scanned(run, t)]
out["fields"] = [
    (k, v) for k in run_search.field_keys(run) for v in ("refund", "gold", "m", "1", "nope")
    if run_search.found_ids(run, "", k, v) != scanned(run, key=k, value=v)
]
out["some"] = len(run_search.found_ids(run, "100%", "", ""))
with transaction.atomic(), connection.cursor() as cursor:
    # On a big table the run's rows are many: the run's own index is no way in.
    cursor.execute("DROP INDEX item_text_run")
    cursor.execute("SET LOCAL enable_seqscan = off")
    cursor.execute(
        "EXPLAIN SELECT item FROM cobalt_app_itemtext WHERE run_id = %s "
        "AND UPPER(text) LIKE UPPER(%s)", [run.id, "%été%"]
    )
    out["plan"] = "\n".join(row[0] for row in cursor.fetchall())
    transaction.set_rollback(True)
with connection.cursor() as cursor:
    run.delete()
    cursor.execute("SELECT count(*) FROM cobalt_app_itemtext WHERE run_id = %s", [run.id])
    out["left"] = cursor.fetchone()[0] + ItemField.objects.filter(run_id=run.id).count()
print(json.dumps(out))
"""


@pytest.fixture
def postgres() -> Iterator[str]:
    with harness.scratch_database(f"cobalt_test_search_index_{os.getpid()}") as url:
        yield url


def test_on_postgresql_the_index_finds_what_reading_the_run_finds(postgres, tmp_path):
    out = harness.script_on_postgres(PG_SCRIPT, postgres, tmp_path)
    assert out["before"] and out["built"]
    assert out["wrong"] == [] and out["fields"] == []
    assert out["some"] == 4  # t01's input, t09's output, each twice (two repetitions)
    assert "item_text_trgm" in out["plan"]
    assert out["left"] == 0


# `cobalt serve` builds it -------------------------------------------------------------------

EXPERIMENT = """
from cobalt import Dataset, Evaluator, experiment

@experiment(
    "indexed",
    Dataset(items=[{"id": f"i{i}", "expected": "yes", "category": "refund" if i % 2 else "login"}
                   for i in range(40)]),
    evaluators=[Evaluator(name="exact", type="exact-match", field="expected")],
)
def run(ctx):
    return "yes" if ctx.item["id"] != "i7" else "Où est le 100% colis"
"""


def test_cobalt_serve_builds_a_finished_runs_index_on_its_first_visit(tmp_path_factory):
    project = new_project(tmp_path_factory, "indexed", {"experiments/i.cobalt.py": EXPERIMENT})
    run_id = cobalt_run(project, "experiments/i.cobalt.py", env={})
    with served(project) as url, httpx.Client(base_url=url, timeout=60) as http:
        assert http.get(f"/runs/{run_id}/").status_code == 200
        deadline = time.monotonic() + 60
        while not index_ready(project, run_id):
            assert time.monotonic() < deadline, "the index was not built within a minute"
            time.sleep(0.1)
        found = http.get(f"/runs/{run_id}/?view=all&q=100%25+colis").text
        assert row_keys(found) == ["i7"]


def index_ready(project, run_id: str) -> bool:
    import sqlite3

    with sqlite3.connect(project.db_path) as db:
        row = db.execute(
            "SELECT ready FROM cobalt_app_searchindex WHERE run_id = ?", [run_id]
        ).fetchone()
    return bool(row and row[0])
