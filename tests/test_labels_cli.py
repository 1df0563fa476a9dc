"""`cobalt labels list|export|import`, run as the real command: a CSV and a JSON Lines file
go out and come back (export → edit → import → the same labels), bad lines are named with
their number and reason while the good ones are kept."""

from __future__ import annotations

import csv
import getpass
import io
import json

import pytest

from tests.conftest import Project

EXPERIMENT = """
from cobalt import Dataset, Evaluator, experiment

ITEMS = [{"id": f"q{i}", "input": f"question {i}", "expected_output": "yes"} for i in range(4)]


@experiment(
    "qa",
    Dataset(items=ITEMS),
    evaluators=[
        Evaluator(name="exact", type="exact-match"),
        Evaluator(name="polite", type="function", fn=lambda ctx: {"score": 0.9, "reason": "ok"}),
    ],
)
def run(ctx):
    return "yes" if ctx.index % 2 == 0 else "no"
"""


@pytest.fixture
def ran(project: Project, cobalt_cli) -> tuple[Project, str]:
    """A project with one finished run of `qa` (q1 and q3 fail `exact`); its run id."""
    project.write("experiments/qa.cobalt.py", EXPERIMENT)
    done = cobalt_cli(project, "run", "--quiet")
    assert done.returncode == 0, done.stderr
    return project, done.stdout.split("Run ID:")[1].split()[0]


def csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text, newline="")))


def write_csv(project: Project, name: str, rows: list[dict[str, str]]) -> None:
    with (project.path / name).open("w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_a_csv_file_goes_to_a_spreadsheet_and_back_with_the_same_labels(ran, cobalt_cli):
    project, run_id = ran
    write_csv(
        project,
        "given.csv",
        [
            {"run": run_id, "itemKey": "q1", "evaluator": "exact", "verdict": "pass", "note": ""},
            {
                "run": run_id,
                "itemKey": "q2",
                "evaluator": "polite",
                "verdict": "pass",
                "note": "kind",
            },
        ],
    )
    imported = cobalt_cli(project, "labels", "import", "given.csv", "--reviewer", "ana")
    assert imported.returncode == 0, imported.stderr
    assert "given.csv: 2 new, 0 changed, 0 unchanged." in imported.stdout

    exported = cobalt_cli(project, "labels", "export", run_id[:6])
    assert exported.returncode == 0, exported.stderr
    rows = csv_rows(exported.stdout)
    assert [(r["itemKey"], r["evaluator"], r["reviewer"], r["verdict"]) for r in rows] == [
        ("q1", "exact", "ana", "pass"),
        ("q2", "polite", "ana", "pass"),
    ]
    first = rows[0]
    assert (first["run"], first["item"], first["repetition"], first["version"]) == (
        run_id,
        "2",
        "0",
        "1",
    )
    assert (first["judgeScore"], first["judgeVerdict"], first["disagrees"]) == (
        "0.0",
        "fail",
        "true",
    )

    # Edited as in a spreadsheet: a note with a comma, a line break and a formula-like start,
    # a corrected score and expected output (JSON text), and a label for a new item.
    rows[0].update(note='=not a formula, "quoted"\nsecond line', expectedOutput='{"answer": "no"}')
    rows[1].update(score="0.3")
    rows.append({**rows[0], "itemKey": "q3", "version": "", "note": "-1 point"})
    write_csv(project, "edited.csv", rows)
    again = cobalt_cli(project, "labels", "import", "edited.csv")
    assert again.returncode == 0, again.stderr
    assert "edited.csv: 1 new, 2 changed, 0 unchanged." in again.stdout

    back = csv_rows(cobalt_cli(project, "labels", "export", run_id).stdout)
    assert [r["itemKey"] for r in back] == ["q1", "q2", "q3"]
    assert back[0]["note"] == '\'=not a formula, "quoted"\nsecond line'  # escaped for a sheet
    assert json.loads(back[0]["expectedOutput"]) == {"answer": "no"}
    assert (back[1]["score"], back[1]["verdict"], back[1]["version"]) == ("0.3", "pass", "2")
    assert back[2]["note"] == "'-1 point" and back[2]["reviewer"] == "ana"
    # The file exported is the file imported: importing it again changes nothing.
    write_csv(project, "back.csv", back)
    same = cobalt_cli(project, "labels", "import", "back.csv")
    assert "back.csv: 0 new, 0 changed, 3 unchanged." in same.stdout
    assert csv_rows(cobalt_cli(project, "labels", "export", run_id).stdout) == back

    listed = cobalt_cli(project, "labels", "list", run_id)
    assert listed.returncode == 0, listed.stderr
    assert "3 labels on 3 items by ana; 2 disagree with the judge." in listed.stdout
    only = cobalt_cli(project, "labels", "list", run_id, "--disagreements").stdout
    assert "q1" in only and "q3" in only and "q2" not in only
    polite = cobalt_cli(project, "labels", "list", run_id, "--evaluator", "polite").stdout
    assert "q2" in polite and "q1" not in polite


def test_a_json_lines_file_round_trips_through_a_file(ran, cobalt_cli):
    project, run_id = ran
    given = [
        {"run": run_id, "itemKey": "q0", "evaluator": "exact", "verdict": "fail", "reviewer": "bo"},
        {
            "run": run_id,
            "itemKey": "q3",
            "evaluator": "exact",
            "score": 1,
            "note": "right after all",
            "expectedOutput": {"answer": ["no", "nope"]},
        },
    ]
    project.write_jsonl("given.jsonl", given)
    imported = cobalt_cli(project, "labels", "import", "given.jsonl")
    assert imported.returncode == 0, imported.stderr

    written = cobalt_cli(project, "labels", "export", run_id, "-o", "out.jsonl")
    assert written.returncode == 0, written.stderr
    assert f"Exported the labels of run {run_id} to" in written.stdout
    rows = [json.loads(line) for line in (project.path / "out.jsonl").read_text().splitlines()]
    assert [(r["itemKey"], r["reviewer"], r["verdict"], r["score"]) for r in rows] == [
        ("q0", "bo", "fail", None),
        ("q3", getpass.getuser(), "pass", 1.0),  # no reviewer: the OS user name
    ]
    assert rows[1]["expectedOutput"] == {"answer": ["no", "nope"]} and rows[1]["disagrees"]

    rows[0]["note"] = "actually fine"
    rows[0]["verdict"] = "pass"
    project.write_jsonl("edited.jsonl", rows)
    again = cobalt_cli(project, "labels", "import", "edited.jsonl")
    assert "edited.jsonl: 0 new, 1 changed, 1 unchanged." in again.stdout
    back = [
        json.loads(line)
        for line in cobalt_cli(
            project, "labels", "export", run_id, "-f", "jsonl"
        ).stdout.splitlines()
    ]
    assert back == [
        {**rows[0], "version": 2, "disagrees": False},
        rows[1],
    ]


def test_bad_lines_are_named_with_their_number_and_the_good_ones_are_kept(ran, cobalt_cli):
    project, run_id = ran
    lines = [
        "run,itemKey,evaluator,verdict,score,note,expectedOutput",
        f'{run_id},q0,exact,fail,,"a note on\ntwo lines",',  # lines 2-3
        f"{run_id},nope,exact,fail,,,",  # 4
        f"{run_id},q1,relevance,fail,,,",  # 5
        f"{run_id},q1,exact,,1.7,,",  # 6
        f"{run_id},q1,exact,pass,,,{{not json",  # 7
        f"{run_id},q2,exact,maybe,,,",  # 8
        "",  # 9: blank, skipped
        "nosuchrun,q2,exact,pass,,,",  # 10
        f'{run_id},q3,exact,Pass,,,"""no"""',  # 11: good
    ]
    (project.path / "mixed.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    imported = cobalt_cli(project, "labels", "import", "mixed.csv", "--reviewer", "cy")
    assert imported.returncode == 1
    errors = [line for line in imported.stderr.splitlines() if line.startswith("✗")]
    assert errors == [
        f"✗ mixed.csv, line 4: item: run {run_id} has no item with key 'nope'",
        f"✗ mixed.csv, line 5: evaluator: run {run_id} has no evaluator 'relevance' "
        "(it has: exact, polite)",
        "✗ mixed.csv, line 6: score: 1.7 is outside 0..1 (a corrected score is 0 to 1)",
        "✗ mixed.csv, line 7: expectedOutput: not JSON (Expecting property name enclosed in "
        'double quotes: line 1 column 2 (char 1)); write text in quotes: "Lyon"',
        "✗ mixed.csv, line 8: verdict: 'maybe' is not 'pass' or 'fail'",
        "✗ mixed.csv, line 10: run: no run with id 'nosuchrun'; `cobalt history` lists runs",
    ], imported.stderr
    assert "mixed.csv: 2 new, 0 changed, 0 unchanged; 6 lines failed." in imported.stdout

    kept = csv_rows(cobalt_cli(project, "labels", "export", run_id).stdout)
    assert [(r["itemKey"], r["verdict"], r["reviewer"], r["expectedOutput"]) for r in kept] == [
        ("q0", "fail", "cy", ""),
        ("q3", "pass", "cy", '"no"'),
    ]
    assert kept[0]["note"] == "a note on\ntwo lines"

    (project.path / "broken.jsonl").write_text(
        f'{{"run": "{run_id}", "itemKey": "q1", "evaluator": "exact", "verdict": "pass"}}\n'
        "[1, 2]\n"
        "{oops\n",
        encoding="utf-8",
    )
    jsonl = cobalt_cli(project, "labels", "import", "broken.jsonl", "--reviewer", "cy")
    assert jsonl.returncode == 1
    assert "broken.jsonl, line 2: not a JSON object" in jsonl.stderr
    assert "broken.jsonl, line 3: not JSON (Expecting property name" in jsonl.stderr
    assert "1 new, 0 changed, 0 unchanged; 2 lines failed." in jsonl.stdout


def test_unusable_files_and_runs_are_usage_errors(ran, cobalt_cli):
    project, run_id = ran
    (project.path / "labels.txt").write_text("run,itemKey\n")
    (project.path / "headless.csv").write_text("verdict,note\npass,fine\n")
    for args, message in (
        (("import", "labels.txt"), "a label file ends in .csv or .jsonl (found '.txt')"),
        (("import", "missing.csv"), "missing.csv: cannot read it"),
        (("import", "headless.csv"), "line 1: the header has no run, itemKey, evaluator column"),
        (("list", "nosuchrun"), "no run with id 'nosuchrun'"),
        (("export", run_id, "--format", "xml"), "--format: 'xml' is not one of csv, jsonl"),
    ):
        done = cobalt_cli(project, "labels", *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert message in " ".join(done.stderr.split()), done.stderr
    empty = cobalt_cli(project, "labels", "list", run_id)
    assert empty.returncode == 0 and f"No labels on run {run_id} (qa)." in empty.stdout
    assert cobalt_cli(project, "labels", "export", run_id).stdout.startswith("run,item,itemKey,")
