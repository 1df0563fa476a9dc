"""Labels become tests: `add_to_dataset` (and `cobalt labels add-to-dataset`) appends a
reviewed item to a JSON Lines dataset of the project, which the next `cobalt run` over that
file runs; files outside the project and ids already in the file are refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cobalt.config import active_config, load_config, set_active_config
from cobalt_app import labels
from cobalt_app.label_datasets import DatasetRefused, ItemAlreadyInDataset, add_to_dataset
from cobalt_app.models import ItemResult
from tests.conftest import Project
from tests.helpers import run_id_of
from tests.test_pages import keys, make_run

QA = """
from cobalt import Dataset, Evaluator, experiment

ITEMS = [{"id": f"q{i}", "input": f"question {i}", "expected_output": "yes"} for i in range(3)]


@experiment("qa", Dataset(items=ITEMS), evaluators=[Evaluator(name="exact", type="exact-match")])
def run(ctx):
    return "yes"
"""

REVIEWED = """
from cobalt import Dataset, Evaluator, experiment


@experiment(
    "reviewed",
    Dataset.from_file("datasets/reviewed.jsonl"),
    evaluators=[Evaluator(name="exact", type="exact-match")],
)
def run(ctx):
    return "no" if ctx.item["input"] == "question 1" else "yes"
"""


def test_an_item_added_from_a_review_is_run_by_the_next_run_of_that_dataset(
    project: Project, cobalt_cli
):
    project.write("experiments/qa.cobalt.py", QA)
    project.write("experiments/reviewed.cobalt.py", REVIEWED)
    project.write_jsonl(
        "datasets/reviewed.jsonl", [{"id": "seed", "input": "question 9", "expected_output": "yes"}]
    )
    qa = run_id_of(cobalt_cli(project, "run", "experiments/qa.cobalt.py", "--quiet"))
    before = run_id_of(cobalt_cli(project, "run", "experiments/reviewed.cobalt.py", "--quiet"))
    # A reviewer says q1's right answer is "no", not "yes".
    project.write_jsonl(
        "review.jsonl",
        [
            {
                "run": qa,
                "itemKey": "q1",
                "evaluator": "exact",
                "verdict": "fail",
                "note": "the answer is no",
                "expectedOutput": "no",
            }
        ],
    )
    assert (
        cobalt_cli(project, "labels", "import", "review.jsonl", "--reviewer", "ana").returncode == 0
    )

    added = cobalt_cli(
        project, "labels", "add-to-dataset", qa, "q1", "--file", "datasets/reviewed.jsonl"
    )
    assert added.returncode == 0, added.stderr
    assert f"Added item 'q1' of run {qa} to datasets/reviewed.jsonl (line 2)." in added.stdout
    lines = (project.path / "datasets" / "reviewed.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["id"] == "seed"  # the line that was there is untouched
    assert json.loads(lines[1]) == {
        "id": "q1",
        "input": "question 1",
        "expected_output": "no",
        "metadata": {
            "reviewNote": "the answer is no",
            "reviewer": "ana",
            "verdict": "fail",
            "fromRun": qa,
        },
    }

    after = run_id_of(cobalt_cli(project, "run", "experiments/reviewed.cobalt.py", "--quiet"))
    exported = cobalt_cli(project, "export", after, "--format", "json")
    items = json.loads(exported.stdout)["items"]
    assert [(i["key"], i["output"]["output"]) for i in items] == [("seed", "yes"), ("q1", "no")]
    # Scored against the reviewer's expected output: this agent's "no" is now right.
    assert items[1]["evaluations"]["exact"]["score"] == 1.0
    assert len(json.loads(cobalt_cli(project, "export", before).stdout)["items"]) == 1

    # By its number, too; and an id the file already has is refused, nothing written.
    by_number = cobalt_cli(
        project, "labels", "add-to-dataset", qa, "#3", "--file", "datasets/reviewed.jsonl"
    )
    assert "Added item 'q2'" in by_number.stdout and "(line 3)" in by_number.stdout
    text = (project.path / "datasets" / "reviewed.jsonl").read_text()
    twice = cobalt_cli(
        project, "labels", "add-to-dataset", qa, "q1", "--file", "datasets/reviewed.jsonl"
    )
    assert twice.returncode == 1
    assert "already has an item with id 'q1'; nothing was written" in " ".join(twice.stderr.split())
    assert (project.path / "datasets" / "reviewed.jsonl").read_text() == text


def test_files_outside_the_project_or_not_json_lines_are_refused(
    project: Project, cobalt_cli, tmp_path: Path
):
    project.write("experiments/qa.cobalt.py", QA)
    qa = run_id_of(cobalt_cli(project, "run", "--quiet"))
    outside = tmp_path / "outside"
    outside.mkdir()
    (project.path / "datasets").mkdir()
    os.symlink(outside, project.path / "datasets" / "link")
    for path, message in (
        ("../escape.jsonl", "resolves outside the project folder"),
        (str(tmp_path / "elsewhere.jsonl"), "resolves outside the project folder"),
        ("datasets/link/through.jsonl", "resolves outside the project folder"),
        ("datasets/reviewed.json", "is not a .jsonl file"),
    ):
        refused = cobalt_cli(project, "labels", "add-to-dataset", qa, "q0", "--file", path)
        assert refused.returncode == 2, (path, refused.stdout)
        assert message in " ".join(refused.stderr.split()), refused.stderr
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "escape.jsonl").exists() and not (tmp_path / "elsewhere.jsonl").exists()
    missing = cobalt_cli(project, "labels", "add-to-dataset", qa, "q9", "--file", "d/x.jsonl")
    assert missing.returncode == 2 and "has no item with key 'q9'" in missing.stderr
    assert not (project.path / "d").exists()


@pytest.fixture
def active(project: Project):
    previous = active_config()
    set_active_config(load_config(project.path))
    yield project
    set_active_config(previous)


@pytest.mark.django_db
def test_an_item_without_a_label_keeps_its_fields_and_its_own_expected_output(active):
    run = make_run("qa", keys=keys(2), scores={"k001": {"judge": 0.2}})
    item = ItemResult.objects.get(run=run, item_key="k001")
    (active.path / "data").mkdir()
    (active.path / "data" / "set.jsonl").write_text('{"id": "old", "input": "x"}')  # no newline

    added = add_to_dataset(run=run, item_id=item.id, path="data/set.jsonl", reviewer="ben")
    assert (added["file"], added["line"], added["id"]) == ("data/set.jsonl", 2, "k001")
    lines = (active.path / "data" / "set.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {"id": "old", "input": "x"}
    assert json.loads(lines[1]) == {
        "id": "k001",
        "input": "question k001",
        "expected": "answer k001",  # the item's other fields come along
        "expected_output": "answer k001",
        "metadata": {"reviewNote": "", "reviewer": "ben", "verdict": None, "fromRun": run.id},
    }

    # With labels: the one with a corrected expected output wins over a later one without.
    labels.label_save(
        run=run,
        item_id=item.id,
        evaluator="judge",
        reviewer="ana",
        verdict="pass",
        expected_output={"answer": 42},
        note="fine",
    )
    labels.label_save(run=run, item_id=item.id, evaluator="exact", reviewer="ana", verdict="fail")
    again = add_to_dataset(run=run, item_id=item.id, path="data/other.jsonl", reviewer="ana")
    assert again["item"]["expected_output"] == {"answer": 42}
    assert again["item"]["metadata"]["reviewNote"] == "fine"
    only_exact = add_to_dataset(
        run=run, item_id=item.id, path="data/third.jsonl", evaluator="exact"
    )
    assert only_exact["item"]["expected_output"] == "answer k001"
    assert only_exact["item"]["metadata"]["verdict"] == "fail"


@pytest.mark.django_db
def test_a_broken_dataset_file_or_a_duplicate_id_is_refused_and_left_as_it_was(active):
    run = make_run("qa", keys=keys(1))
    item = ItemResult.objects.get(run=run)
    path = active.path / "broken.jsonl"
    path.write_text('{"id": "a"}\n{oops\n')
    with pytest.raises(DatasetRefused, match=r"file: broken.jsonl, line 2: invalid JSON"):
        add_to_dataset(run=run, item_id=item.id, path="broken.jsonl")
    assert path.read_text() == '{"id": "a"}\n{oops\n'

    path.write_text('{"id": "k000", "input": "already here"}\n')
    with pytest.raises(ItemAlreadyInDataset, match="already has an item with id 'k000'"):
        add_to_dataset(run=run, item_id=item.id, path=str(path))  # absolute, inside: allowed
    assert path.read_text() == '{"id": "k000", "input": "already here"}\n'
    with pytest.raises(labels.LabelNotFound, match="has no item with id 0"):
        add_to_dataset(run=run, item_id=0, path="new.jsonl")
    assert not (active.path / "new.jsonl").exists()


@pytest.mark.django_db
def test_an_item_of_a_run_still_going_is_not_added(active):
    running = make_run("qa", keys=keys(2), finish=False)
    item = ItemResult.objects.filter(run=running).first()
    with pytest.raises(labels.LabelConflict, match=f"run {running.id} is still running: add its"):
        add_to_dataset(run=running, item_id=item.id, path="datasets/reviewed.jsonl")
    assert not (active.path / "datasets").exists()
