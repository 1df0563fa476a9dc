"""The compare page's groups counted from the runs' score tables (`group_counts`) give what
`page_triage.group_table` counts over every evaluation: the same values in the same order,
items, errors and pass rates, for the fields' values read from the items' JSON and from the
search index, on SQLite and PostgreSQL; ties, missing fields, repetitions, item errors,
evaluation errors and evaluations never written included.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from cobalt_app import group_counts, page_triage, results, run_search, score_tables
from cobalt_app.models import Evaluation, ItemResult, Run
from tests import team_harness as harness
from tests.test_pages import make_run

pytestmark = pytest.mark.django_db

# Dataset fields, a metadata key, what the agent reported, and a field no item has.
FIELDS = ["category", "metadata.tier", "code", "level", "result.model", "absent"]
CATEGORIES = ["refund", "refund", "shipping", "billing", None, "Été", "été", "Zed"]


def odd_keys() -> list[str]:
    """60 keys written out of their order (item ids do not follow the keys), some beyond
    ASCII (bytes order, not a locale's)."""
    names = [f"k{i:03d}" for i in range(54)] + ["éclair", "Ωmega", "Zed", "zed", "a b", "K9"]
    random.Random(4).shuffle(names)
    return names


def odd_run(*, runs: int = 1) -> Run:
    """A run of `odd_keys` (`runs` repetitions; repetition 1 of some keys scored otherwise):
    scores at, above and below the pass mark (0.5), judge errors, item errors (no verdicts),
    verdicts never written; each item labelled by `label`."""
    names = odd_keys()
    scores: dict[str, dict[str, float | None]] = {}
    for i, key in enumerate(names):
        judge = None if i % 7 == 3 else (i % 5) / 4
        scores[key] = {"exact": [0.0, 0.5, 1.0, 0.49][i % 4], "judge": judge}
        if i < 20:
            scores[f"{key}#1"] = {"exact": 1.0 - scores[key]["exact"], "judge": None}
    errors = {names[i]: "RuntimeError: down" for i in range(0, 60, 9)}
    run = make_run(keys=names, scores=scores, errors=errors, runs=runs, finish=False)
    skipped = ItemResult.objects.filter(run=run, item_index__in=[5, 6, 40])
    Evaluation.objects.filter(item__in=skipped, evaluator="judge").delete()
    for item in ItemResult.objects.filter(run=run):
        item.input = {**item.input, **label(item.item_index)}
        item.save(update_fields=["input"])
    results.run_finalise(run.id)
    return Run.objects.get(id=run.id)


def label(i: int) -> dict[str, Any]:
    """Item i's fields: categories with ties and items without one, a tier in the metadata of
    some, 60 codes (more groups than the page shows), a number."""
    found: dict[str, Any] = {"code": f"c{i:02d}", "level": i % 3}
    if CATEGORIES[i % len(CATEGORIES)] is not None:
        found["category"] = CATEGORIES[i % len(CATEGORIES)]
    if i % 4:
        found["metadata"] = {"tier": "gold" if i % 4 == 1 else "silver"}
    return found


def shape(table: page_triage.GroupTable | None) -> Any:
    """What the compare page reads of a run's groups."""
    if table is None:
        return None
    rows = [
        (
            row.value,
            row.items,
            row.broken,
            [(r["name"], r["scored"], r["passed"], r["rate"]) for r in row.rates],
        )
        for row in table.rows
    ]
    return {"evaluators": table.evaluators, "rows": rows, "more": table.more}


def forget() -> None:
    group_counts._positions.clear()
    group_counts._counts.clear()
    page_triage._lists.clear()


def values_at(positions: group_counts.Positions) -> list[str | None]:
    """The value of each table position (`"-"` where none was read)."""
    names = {code: value for value, code in positions.index.items()}
    return [names.get(int(code), "-") for code in positions.codes]


def differences(runs: list[Run]) -> dict[str, Any]:
    """Per run and field, where `group_counts` and the old reads differ (empty: nowhere),
    before and after the runs' search indexes are built; and which fields were read from
    the index."""
    found: dict[str, Any] = {"wrong": [], "indexed": [], "counted": []}
    for built in (False, True):
        for run in runs:
            if built:
                assert run_search.build(run)
            table = score_tables.kept(run)
            for key in FIELDS:
                forget()
                new = group_counts.counted(run, key, table)
                if new is not None:
                    found["counted"].append((run.id, key))
                    if shape(new) != shape(page_triage.group_table(run, key)):
                        found["wrong"].append((run.id, key, built, "counts"))
                read = group_counts.positions(run, key, table)
                if values_at(read) != values_at(group_counts._by_key(run, key, table)):
                    found["wrong"].append((run.id, key, built, "positions"))
                if built and group_counts._indexed(run, key):
                    found["indexed"].append(key)
    return found


def test_counts_from_the_score_tables_are_the_counts_of_every_evaluation():
    single, repeated = odd_run(), odd_run(runs=2)
    found = differences([single, repeated])
    assert found["wrong"] == []
    # The single run is counted from its table for each field, with the index and without;
    # the run with repetitions by `group_table`.
    assert found["counted"] == [(single.id, key) for key in FIELDS] * 2
    assert sorted(set(found["indexed"])) == sorted(set(FIELDS) - {"absent"})
    # What the fixture holds: ties, items without a category, more groups than shown.
    table = page_triage.group_table(single, "category")
    assert [(row.value, row.items) for row in table.rows] == [
        ("refund", 16),
        ("billing", 8),
        ("shipping", 8),
        (None, 7),  # SQLite: NULL first, then the values' UTF-8 bytes
        ("Zed", 7),
        ("Été", 7),
        ("été", 7),
    ]
    assert page_triage.group_table(single, "code").more == 1
    assert sum(row.broken for row in table.rows) == 7
    exact = [r for row in table.rows for r in row.rates if r["name"] == "exact"]
    judge = [r for row in table.rows for r in row.rates if r["name"] == "judge"]
    assert sum(r["scored"] for r in exact) == 53 and sum(r["errors"] for r in judge) > 0


def test_a_run_whose_items_came_after_its_table_is_not_counted_from_it():
    run = odd_run()
    table = score_tables.kept(run)
    forget()
    assert group_counts.counted(run, "category", table) is not None
    ItemResult.objects.create(run=run, item_index=99, run_index=1, item_key="late", input={})
    forget()
    assert group_counts.counted(run, "category", table) is None
    assert group_counts.positions(run, "category", table).single is False
    assert np.array_equal(
        group_counts.positions(run, "category", table).codes,
        group_counts._by_key(run, "category", table).codes,
    )


PG_SCRIPT = r"""
import json
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from tests.test_group_counts import differences, odd_run
from cobalt_app import page_triage

single, repeated = odd_run(), odd_run(runs=2)
out = differences([single, repeated])
out["order"] = [row.value for row in page_triage.group_table(single, "category").rows]
out["single"] = single.id
print(json.dumps(out))
"""


@pytest.fixture
def postgres() -> Iterator[str]:
    with harness.scratch_database(f"cobalt_test_group_counts_{os.getpid()}") as url:
        yield url


def test_on_postgresql_the_counts_are_the_same(postgres, tmp_path):
    out = harness.script_on_postgres(PG_SCRIPT, postgres, tmp_path)
    assert out["wrong"] == []
    assert [tuple(pair) for pair in out["counted"]] == [(out["single"], k) for k in FIELDS] * 2
    assert sorted(set(out["indexed"])) == sorted(set(FIELDS) - {"absent"})
    # Ties in PostgreSQL's order of the values: by its collation, NULL (no category) last
    assert out["order"][:3] == ["refund", "billing", "shipping"] and out["order"][-1] is None
