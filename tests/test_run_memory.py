"""A run's memory is bounded per item (issue 41): its score table is built in arrays, and a
dataset read from a file is streamed from it, never held whole. Memory is measured with
`tracemalloc` (Python's and numpy's allocations), at two sizes: what an item adds."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from cobalt import Dataset
from cobalt.dataset import DatasetError
from cobalt_app import failing_ranks, score_tables, services
from cobalt_app.models import Evaluation, ItemResult, Run, RunScoreTable
from cobalt_app.score_tables import STATUSES, ScoreTable
from tests.test_run_summary import record_run

pytestmark = pytest.mark.django_db


def table_by_item_key(run_id: str) -> ScoreTable:
    """The table as `build` made it before issue 41 (statuses and positions in dictionaries,
    each score's row, column and value in lists), kept as the reference to match."""
    statuses = dict(
        ItemResult.objects.filter(run_id=run_id, run_index=0).values_list("item_key", "status")
    )
    ordered = sorted(statuses)
    position = {key: i for i, key in enumerate(ordered)}
    evaluators: dict[str, int] = {}
    rows, columns, values = [], [], []
    scored = Evaluation.objects.filter(
        run_id=run_id, status=Evaluation.Status.OK, score__isnull=False
    ).order_by("id")
    for evaluator, key, score in scored.values_list("evaluator", "item__item_key", "score"):
        if key in position:
            rows.append(evaluators.setdefault(evaluator, len(evaluators)))
            columns.append(position[key])
            values.append(score)
    shape = (len(evaluators), len(ordered))
    totals, counts = np.zeros(shape), np.zeros(shape)
    np.add.at(totals, (rows, columns), values)
    np.add.at(counts, (rows, columns), 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        scores = np.where(counts > 0, totals / counts, np.nan)
    spread = np.zeros((0,))
    if (counts > 1).any():
        lowest, highest = np.full(shape, np.inf), np.full(shape, -np.inf)
        np.minimum.at(lowest, (rows, columns), values)
        np.maximum.at(highest, (rows, columns), values)
        spread = np.where(np.isfinite(lowest), highest - lowest, 0.0)
    keys = np.array([key.encode() for key in ordered], dtype=bytes)
    status = np.array([STATUSES.index(statuses[key]) for key in ordered], dtype=np.int8)
    return ScoreTable(keys, tuple(evaluators), scores, status, spread)


def assert_same_table(built: ScoreTable, expected: ScoreTable) -> None:
    assert built.keys.tolist() == expected.keys.tolist()
    assert built.keys.dtype == expected.keys.dtype
    assert built.evaluators == expected.evaluators
    assert built.status.tolist() == expected.status.tolist()
    # Every score and spread the same, to the last bit (NaN where unscored).
    assert built.scores.tobytes() == expected.scores.tobytes()
    assert built.spread.tobytes() == expected.spread.tobytes()


@pytest.mark.parametrize(("seed", "runs"), [(1, 1), (2, 3)])
def test_the_score_table_is_the_one_built_by_item_key(seed, runs):
    run = record_run(seed, 130, runs=runs)
    built = score_tables.build(run.id)
    assert len(built) == 130 and len(built.evaluators) == 3
    assert bool(built.spread.size) == (runs > 1)
    assert (built.status != STATUSES.index("ok")).any()  # errors and timeouts are in it
    assert_same_table(built, table_by_item_key(run.id))


def test_a_key_shared_by_identical_items_appears_once():
    run = record_run(3, 40)
    # Two items without an id and the same content share a key (`item_key`): one key.
    ItemResult.objects.filter(run=run, item_index__in=[3, 4]).update(item_key="sha256:same")
    built = score_tables.build(run.id)
    assert len(built) == 39 and built.keys.tolist().count(b"sha256:same") == 1
    assert_same_table(built, table_by_item_key(run.id))


def test_the_stored_failing_order_is_the_judged_failures_order():
    run = record_run(4, 200)
    score_tables.store(run.id)
    stored = RunScoreTable.objects.get(run_id=run.id)
    order = list(score_tables.judged_failures(run).values_list("item_id", flat=True))
    assert order and score_tables.failing_order(run) == order
    assert ScoreTable.from_bytes(bytes(stored.data)).keys.tolist() == (
        table_by_item_key(run.id).keys.tolist()
    )


@pytest.mark.parametrize("failing", ["mixed", "one evaluator", "none"])
def test_the_failing_ranks_are_the_sql_rankings(failing):
    run = record_run(5, 120, runs=2)
    if failing != "mixed":  # only `strict` fails (its mark is 0.8), or nothing does
        Evaluation.objects.filter(run=run).update(status="ok", score=0.9, error="")
        low = Evaluation.objects.filter(run=run, evaluator="strict", item__item_index__lt=50)
        low.update(score=0.5 if failing == "one evaluator" else 0.85)
    ranks = failing_ranks.rank(run)
    for name in ["", *run.evaluator_names]:
        expected = list(score_tables.judged_failures(run, name).values_list("item_id", flat=True))
        found = ranks.order if name == "" else ranks.by_evaluator[name]
        assert found.tolist() == expected
        assert ranks.counts()[name] == score_tables.failing_verdicts(run, name).count()
    assert bool(len(ranks.order)) == (failing != "none")


def test_building_and_storing_the_score_table_holds_bytes_an_item_not_objects():
    built, stored = [], []
    for n in (5000, 15000):  # above the rows read at a time, as the summary's test
        run = record_run(n, n, errors=False, batch=1000)
        for what, peaks in ((score_tables.build, built), (score_tables.store, stored)):
            tracemalloc.start()
            what(run.id)
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
    per_item = [(peaks[1] - peaks[0]) / 10000 for peaks in (built, stored)]
    # Three evaluators: sums and counts (36 bytes), the key (6) sorted by an index (8), a
    # status: ~31 bytes measured. Lists and dictionaries of the keys and scores took ~740.
    assert per_item[0] < 60, f"build: {per_item[0]:.0f} bytes an item"
    # Storing adds the archive (the table twice over) and the failing items' order: ~84.
    assert per_item[1] < 120, f"store: {per_item[1]:.0f} bytes an item"


def write_jsonl(path: Path, n: int) -> Path:
    with path.open("w") as file:
        file.writelines(
            json.dumps({"id": i, "input": f"question {i}" * 4}) + "\n" for i in range(n)
        )
    return path


def test_a_dataset_file_is_streamed_and_holds_8_bytes_an_item(tmp_path):
    peaks = []
    for n in (5000, 20000):
        path = write_jsonl(tmp_path / f"items{n}.jsonl", n)
        tracemalloc.start()
        dataset = Dataset.from_file(path)
        held = tracemalloc.get_traced_memory()[0]
        assert sum(1 for _ in dataset) == n  # read again, from the file
        peaks.append((held, tracemalloc.get_traced_memory()[1]))
        tracemalloc.stop()
        assert dataset[n - 1] == {"id": n - 1, "input": f"question {n - 1}" * 4}
    held, peak = ((big - small) / 15000 for small, big in zip(*peaks, strict=True))
    # Kept: where each item starts (8 bytes). At its peak, the check of unique ids (a hash
    # each) too. Parsed items in a list took ~270 bytes an item, twice.
    assert held < 12, f"{held:.0f} bytes an item kept"
    assert peak < 40, f"{peak:.0f} bytes an item at the peak"


def test_a_streamed_dataset_is_its_file_items_and_refuses_a_changed_file(tmp_path):
    path = tmp_path / "qa.csv"
    path.write_text('\ufeffid,input\n1,a\n\n2,"b\nc"\r\n3,d\n', encoding="utf-8")
    dataset = Dataset.from_file(path)
    assert list(dataset) == [
        {"id": "1", "input": "a"},
        {"id": "2", "input": "b\nc"},
        {"id": "3", "input": "d"},
    ]
    assert dataset[1] == {"id": "2", "input": "b\nc"} and dataset[-1]["id"] == "3"
    assert list(dataset.slice(1)) == [{"id": "2", "input": "b\nc"}, {"id": "3", "input": "d"}]
    held = Dataset(list(dataset))  # the same items, in memory: the same sample
    assert dataset.sample(2, seed=3).items == held.sample(2, seed=3).items
    path.write_text("id,input\n1,changed\n", encoding="utf-8")
    with pytest.raises(DatasetError, match="changed after the dataset was loaded") as info:
        list(dataset)
    assert info.value.path == str(path)


def test_a_duplicate_id_in_a_streamed_file_names_both_lines(tmp_path):
    path = tmp_path / "qa.jsonl"
    lines = [json.dumps({"id": i, "input": "x"}) for i in range(50)]
    lines[40] = json.dumps({"id": "7", "input": "again"})
    path.write_text("\n" + "\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DatasetError) as info:
        Dataset.from_file(path)
    assert info.value.line == 42
    assert "item at index 40 has the id '7', already used by the item at index 7 (line 9)" in str(
        info.value
    )


def test_a_run_of_a_streamed_dataset_stores_every_item_in_order(tmp_path):
    from cobalt import Evaluator, experiment
    from cobalt.experiments import collecting

    path = write_jsonl(tmp_path / "items.jsonl", 2500)  # above a batch of inserted rows
    with collecting() as found:
        experiment(
            "streamed",
            Dataset.from_file(path),
            lambda ctx: None,
            evaluators=[Evaluator(name="fn", type="function", fn=lambda ctx: 1.0)],
            runs=2,
        )
    run = services.run_create(
        experiment=found[0], settings={"runs": 2, "concurrency": 4, "timeout": 30}
    )
    assert Run.objects.get(id=run.id).total_items == run.total_items == 5000
    rows = ItemResult.objects.filter(run=run).order_by("item_index", "run_index")
    assert [(r.item_index, r.run_index, r.item_key) for r in rows[:3]] == [
        (0, 0, "0"),
        (0, 1, "0"),
        (1, 0, "1"),
    ]
    last = rows.last()
    assert (last.item_index, last.item_key, last.input) == (
        2499,
        "2499",
        {"id": 2499, "input": "question 2499" * 4},
    )


# Arrays freed while small objects are made and kept (a finalisation's phases): the RSS gained
# is what is kept. glibc otherwise keeps each freed 8 MB array in its heap (47 MB here, measured).
FREED_ARRAYS = """
import numpy as np
from cobalt_app import big_blocks

def rss():
    status = open("/proc/self/status").read().split("VmRSS:")[1]
    return int(status.split()[0]) // 1024

assert big_blocks.given_back()
base, kept = rss(), []
for phase in range(6):
    arrays = [np.ones(1_000_000) for _ in range(3)]
    kept.append([str(i) * 30 for i in range(20000)])
    kept.append(bytearray(200_000))
    del arrays
print(rss() - base)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_arrays_freed_at_the_end_of_a_run_are_given_back_to_the_system():
    found = subprocess.run(
        [sys.executable, "-c", FREED_ARRAYS], capture_output=True, text=True, check=True
    )
    assert int(found.stdout) < 30, found.stdout
