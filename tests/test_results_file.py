"""The results file: streamed in chunks, a JSON document for small runs, gzipped JSON Lines
above `[results] large_run`, and one loader (`cobalt.load_results`) for every form."""

from __future__ import annotations

import gzip
import json
import math
import re

import pytest

import cobalt
from cobalt.config import ConfigError, load_config
from cobalt.report import ExperimentReport
from cobalt.results_file import Form, choose, load_results, read_results, results_files
from cobalt_app import housekeeping, results
from cobalt_app.runs import lifecycle
from tests.conftest import Project
from tests.test_pages import XSS, keys, make_run

STEP = {"name": "lookup", "kind": "tool", "input": "q", "output": "a"}
HEADER_KEYS = [
    "id",
    "name",
    "timestamp",
    "status",
    "file",
    "tags",
    "gitCommit",
    "parentRunId",
    "replay",
    "traceNotCaptured",
    "serviceSpans",
    "config",
    "summary",
    "labels",
    "calibration",
    "items",
]
# The items of `run` below, as the results file has always written them.
GOLDEN_ITEMS = [
    {
        "index": 0,
        "runIndex": 0,
        "key": "k000",
        "status": "ok",
        "verdict": "fail",
        "error": None,
        "input": {"id": "k000", "input": "question k000", "expected": "answer k000"},
        "output": {"output": "Paris", "metadata": {"model": "m", "note": XSS}},
        "latencyMs": 100.0,
        "tokens": 0,
        "cost": 0.0,
        "evaluations": {
            "exact": {"score": 0.25, "verdict": "fail", "reason": "exact says k000 <b>ok</b>"},
            "judge": {"score": 1.0, "verdict": "pass", "reason": "judge says k000 <b>ok</b>"},
        },
        "trace": [STEP],
        "traceNotCaptured": None,
        "labels": [],
    },
    {
        "index": 1,
        "runIndex": 0,
        "key": "k001",
        "status": "ok",
        "verdict": "error",  # exact passed, the judge errored: not passed (cobalt.verdict)
        "error": None,
        "input": {"id": "k001", "input": "question k001", "expected": "answer k001"},
        "output": {"output": "answer k001", "metadata": {"model": "m", "note": XSS}},
        "latencyMs": 101.0,
        "tokens": 10,
        "cost": 0.0,
        "evaluations": {
            "exact": {"score": 1.0, "verdict": "pass", "reason": "exact says k001 <b>ok</b>"},
            "judge": {"score": None, "verdict": "error", "error": "judge replied prose for k001"},
        },
        "trace": [],
        "traceNotCaptured": None,
        "labels": [],
    },
    {
        "index": 2,
        "runIndex": 0,
        "key": "k002",
        "status": "error",
        "verdict": "error",
        "error": "RuntimeError: agent crashed",
        "input": {"id": "k002", "input": "question k002", "expected": "answer k002"},
        "output": {"output": None, "metadata": {}},
        "latencyMs": 102.0,
        "tokens": 20,
        "cost": 0.0,
        "evaluations": {},
        "trace": [],
        "traceNotCaptured": None,
        "labels": [],
    },
]
ALL_FORMS = [Form(lines, compressed) for lines in (False, True) for compressed in (False, True)]


@pytest.fixture
def run(db):
    return make_run(
        keys=keys(3),
        outputs={"k000": "Paris"},
        traces={"k000": [STEP]},
        scores={"k000": {"exact": 0.25}, "k001": {"judge": None}},
        errors={"k002": "RuntimeError: agent crashed"},
    )


def configured(tmp_path, results_table: str):
    """A project whose cobalt.toml has this `[results]` table; its configuration."""
    (tmp_path / "cobalt.toml").write_text(f"[results]\n{results_table}\n")
    return load_config(tmp_path)


def document(run) -> dict:
    return json.loads("".join(results.results_document(run)))


# The JSON document --------------------------------------------------------------------------


def test_a_small_run_s_results_file_is_the_json_document_it_always_was(run, tmp_path):
    path = results.write_results_file(run, tmp_path)

    assert path.name.endswith(f"_qa_{run.id}.json")
    text = path.read_text(encoding="utf-8")
    written = json.loads(text)
    assert list(written) == HEADER_KEYS
    assert written["items"] == GOLDEN_ITEMS
    assert written["summary"]["totalItems"] == 3 and written["labels"]["labels"] == 0
    # The header indented by two, then one item per line: a file people grep and diff.
    lines = text.splitlines()
    assert lines[:2] == ["{", f'  "id": "{run.id}",']
    assert lines[-2:] == ["  ]", "}"] and text.endswith("}\n")
    items = lines[lines.index('  "items": [') + 1 : -2]
    assert [json.loads(line.strip().removesuffix(",")) for line in items] == GOLDEN_ITEMS


def test_chunked_reads_and_writes_change_nothing_in_the_file(db, tmp_path, monkeypatch):
    run = make_run(keys=keys(7), runs=2, errors={"k002": "RuntimeError: agent crashed"})
    whole = results.write_results_file(run, tmp_path / "whole").read_bytes()

    monkeypatch.setattr(results, "EXPORT_CHUNK", 3)
    monkeypatch.setattr(results, "WRITE_BATCH", 2)
    chunked = results.write_results_file(run, tmp_path / "chunked").read_bytes()

    assert chunked == whole
    items = json.loads(chunked)["items"]
    assert [(i["index"], i["runIndex"]) for i in items] == [
        (i, r) for i in range(7) for r in (0, 1)
    ]


def test_an_empty_run_has_an_empty_item_list(db, tmp_path):
    run = make_run(keys=[])
    for form in (Form(), Form(lines=True)):
        path = results.write_results_file(run, tmp_path, form)
        assert load_results(path)["items"] == []


# Big runs: JSON Lines, gzipped ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "items", "suffix"),
    [
        ({}, 20_000, ".json"),
        ({}, 20_001, ".jsonl.gz"),
        ({"large_run": 5}, 6, ".jsonl.gz"),
        ({"format": "jsonl"}, 3, ".jsonl"),
        ({"compress": True}, 3, ".json.gz"),
        ({"format": "json"}, 50_000, ".json.gz"),
        ({"format": "json", "compress": False}, 50_000, ".json"),
        ({"compress": False}, 50_000, ".jsonl"),
    ],
)
def test_the_results_settings_choose_the_form(settings, items, suffix):
    assert choose(settings, items).suffix == suffix


def test_a_run_above_large_run_is_written_as_gzipped_json_lines(run, tmp_path):
    config = configured(tmp_path, "large_run = 2")

    written = lifecycle.write_results(run.id, config)

    path = config.results_dir / f"{results.results_stem(run)}.jsonl.gz"
    assert written.results_path == str(path) and results_files(config.results_dir) == [path]
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    expected = document(run)
    items = expected.pop("items")
    assert json.loads(lines[0]) == expected  # the header: the document without its items
    assert [json.loads(line) for line in lines[1:]] == items == GOLDEN_ITEMS


def test_writing_a_run_again_in_another_form_leaves_one_file(run, tmp_path):
    results.write_results_file(run, tmp_path)
    path = results.write_results_file(run, tmp_path, Form(lines=True, compressed=True))
    assert results_files(tmp_path) == [path]


def test_a_failed_write_leaves_no_file(run, tmp_path, monkeypatch):
    def broken(run):
        yield "{"
        raise RuntimeError("disk full")

    monkeypatch.setattr(results, "results_document", broken)
    with pytest.raises(RuntimeError):
        results.write_results_file(run, tmp_path)
    assert list(tmp_path.iterdir()) == []


# Reading --------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ALL_FORMS, ids=lambda form: form.suffix)
def test_every_reader_reads_every_form(run, tmp_path, form):
    expected = document(run)
    path = results.write_results_file(run, tmp_path, form)
    assert path.name.endswith(form.suffix)

    assert load_results(path) == expected
    assert cobalt.load_results(str(path)) == expected
    header, items = cobalt.read_results(path)
    assert header == {k: v for k, v in expected.items() if k != "items"}
    assert next(items) == GOLDEN_ITEMS[0] and list(items) == GOLDEN_ITEMS[1:]
    report = ExperimentReport.load(path)
    assert (report.id, report.total_items, len(report.items)) == (run.id, 3, 3)
    assert report.results_path == str(path)


def test_reading_a_file_that_is_not_a_results_file_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("{}")
    with pytest.raises(ValueError, match="not a results file"):
        load_results(tmp_path / "notes.txt")


def test_cobalt_clean_deletes_results_files_of_every_form(db, tmp_path):
    config = configured(tmp_path, "")
    for form in ALL_FORMS:
        results.write_results_file(make_run(keys=keys(1)), config.results_dir, form)
    (config.results_dir / "notes.txt").write_text("kept")

    files, runs = housekeeping.delete_results(config)

    assert (files, runs) == (4, 4)
    assert [p.name for p in config.results_dir.iterdir()] == ["notes.txt"]


def test_cobalt_run_writes_a_big_run_as_gzipped_json_lines(project: Project, cobalt_cli):
    project.write("cobalt.toml", 'test_dir = "experiments"\n\n[results]\nlarge_run = 3\n')
    project.write_jsonl("datasets/qa.jsonl", [{"id": f"k{i}", "input": f"q{i}"} for i in range(5)])
    project.write(
        "experiments/qa.cobalt.py",
        """
        from cobalt import Dataset, Evaluator, experiment

        @experiment("qa", Dataset.from_file("datasets/qa.jsonl"), evaluators=[
            Evaluator(name="one", type="function", fn=lambda ctx: 1.0),
        ])
        def run(ctx):
            return ctx.item["input"]
        """,
    )

    ran = cobalt_cli(project, "run")

    assert ran.returncode == 0, ran.stderr
    (path,) = results_files(project.path / ".cobalt" / "results")
    assert path.name.endswith(".jsonl.gz") and f"Results saved to .cobalt/results/{path.name}" in (
        " ".join(ran.stdout.split())
    )
    header, items = read_results(path)
    assert header["summary"]["totalItems"] == 5
    assert [item["output"]["output"] for item in items] == [f"q{i}" for i in range(5)]


# Settings -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('format = "yaml"', "`results.format` must be one of 'auto', 'json', 'jsonl'"),
        ('compress = "zstd"', "`results.compress` must be true, false or 'auto'"),
        ("large_run = -1", "`results.large_run` must be a whole number of items"),
        ("large_run = 2.5", "`results.large_run` must be a whole number of items"),
        ("jsonl = true", "`results.jsonl` is not a Cobalt setting"),
    ],
)
def test_results_settings_are_checked(tmp_path, table, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        configured(tmp_path, table)


def test_valid_results_settings_are_kept(tmp_path):
    config = configured(tmp_path, 'format = "auto"\ncompress = true\nlarge_run = 0')
    assert config.get("results") == {"format": "auto", "compress": True, "large_run": 0}


def test_an_entry_line_is_the_entry_encoded_with_its_stored_json_as_it_is():
    from cobalt_app.results_json import entry_line
    from cobalt_app.trace_store import Trace

    def encoded(value):
        return json.dumps(value, ensure_ascii=False)

    values = [
        {"answer": 'é "quoted" \\ back\nline\t\x00', "n": [1, 2.5, None, True], "empty": {}},
        "plain",
        None,
        12345678901234567890,
        {"nested": {"deep": ["x", {"y": 1e-7}]}},
    ]
    numbers = [0.0, -0.0, 0.1 + 0.2, 1e-7, 5e-324, 1e300, float("nan"), float("inf"), None, 7]
    evaluations = [
        {},
        {"fn": results.evaluation_entry(0.6, "why \x00", "ok", "", False, mark=0.8)},
        {
            "a": results.evaluation_entry(1.0, "", "ok", "", True, "thought", "m", mark=0.5),
            "b": results.evaluation_entry(None, "", "error", "boom\n", False, mark=0.5),
        },
    ]
    traces = [None, Trace([STEP]), Trace(encoded([STEP])), Trace([], 'not sent: "x"')]
    label_lists = [[], [{"label": "pass", "reviewer": "ann \u2603", "stale": False}]]
    for n, value in enumerate(values * 2):
        status = ["ok", "error", "timeout", "pending"][n % 4]
        row = (
            n,
            n,
            n % 3,
            ["k", "é\x00\u2028", 'q"uote'][n % 3],
            status,
            ["", "RuntimeError: x\ny", None][n % 3],
            encoded(value),
            None if n % 4 == 1 else encoded(value),
            encoded({"model": value}),
            numbers[n % len(numbers)],
            n * 10,
            numbers[(n + 3) % len(numbers)],
        )
        evaluated = evaluations[n % 3]
        trace, labelled = traces[n % 4], label_lists[n % 2]
        entry = results.row_entry(row, evaluated, trace)
        judged = results.row_verdict(row, evaluated)
        line = entry_line(row, judged, evaluated, trace, labelled)
        assert line == encoded({**entry, "labels": labelled}), row


def test_items_scored_alike_are_written_as_if_each_was_alone(db, monkeypatch):
    """The file's lines encode each distinct set of evaluation rows once (`results._lines`):
    items scored alike, -0.0 beside 0.0, an evaluation error, a cached judge and a failed
    item read as the entries built item by item."""
    from cobalt_app.models import Evaluation, ItemResult

    run = make_run(keys=keys(12), errors={"k003": "RuntimeError: agent crashed"})
    Evaluation.objects.filter(run=run).update(reason="")
    Evaluation.objects.filter(run=run, item__item_index__in=[0, 2, 4, 6]).update(score=0.0)
    item = ItemResult.objects.filter(run=run)
    Evaluation.objects.filter(item=item.get(item_index=1), evaluator="exact").update(score=-0.0)
    Evaluation.objects.filter(item=item.get(item_index=5), evaluator="judge").update(
        score=None, status="error", error="boom"
    )
    Evaluation.objects.filter(item=item.get(item_index=7), evaluator="judge").update(
        cached=True, tokens=5
    )
    encoded = []
    monkeypatch.setattr(
        results,
        "json_text",
        lambda value: encoded.append(value) or json.dumps(value, ensure_ascii=False),
    )

    lines = list(results.iter_item_entries(run, as_lines=True))
    entries = list(results.iter_item_entries(run))

    assert lines == [json.dumps(entry, ensure_ascii=False) for entry in entries]
    # SQLite stores -0.0 as 0 (so item 1 is encoded as any other); PostgreSQL keeps it.
    kept = math.copysign(1.0, Evaluation.objects.get(item__item_index=1, evaluator="exact").score)
    assert ('"exact": {"score": -0.0' in lines[1]) == (kept < 0)
    assert '"exact": {"score": 0.0' in lines[0]
    assert '"cached": true' in lines[7] and '"error": "boom"' in lines[5]
    # Encoded once: 0, 2, 4 and 6; 8 to 11; 3 (none); 5; 1 unless its -0.0 sets it apart as
    # the judge's call sets 7 apart.
    assert len(encoded) == (4 if kept < 0 else 5)
