"""Exports of a run (CSV, Markdown, JSON, JSON Lines): from the run's page and via
`cobalt export`."""

from __future__ import annotations

import csv
import gzip
import io
import json

import pytest
from django.test import Client

from cobalt.results_file import load_results
from cobalt_app import exports, results
from tests.test_pages import XSS, keys, make_run

FORMULA = '=HYPERLINK("http://evil.example","click")'


@pytest.fixture
def run(db):
    return make_run(
        keys=keys(3),
        outputs={"k000": FORMULA, "k001": f"line one | {XSS}\nline two"},
        scores={"k001": {"judge": None}, "k000": {"exact": 0.0}},
        errors={"k002": "RuntimeError: agent crashed"},
    )


def text(run, fmt: str) -> str:
    return "".join(exports.export(run, fmt))


def test_csv_has_a_row_per_item_with_scores_reasons_and_errors(run):
    rows = list(csv.DictReader(io.StringIO(text(run, "csv"))))
    assert [r["key"] for r in rows] == ["k000", "k001", "k002"]
    first, second, failed = rows
    assert list(first)[:7] == ["index", "run_index", "key", "status", "input", "output", "metadata"]
    assert first["exact_score"] == "0.0" and first["judge_score"] == "1.0"
    assert first["judge_reason"] == "judge says k000 <b>ok</b>"
    assert json.loads(first["input"]) == {
        "id": "k000",
        "input": "question k000",
        "expected": "answer k000",
    }
    # A spreadsheet must not run an agent's output as a formula.
    assert first["output"] == "'" + FORMULA
    assert second["judge_score"] == "" and second["judge_reason"].startswith("error: judge")
    assert failed["status"] == "error" and failed["error"] == "RuntimeError: agent crashed"
    assert failed["exact_score"] == "" and failed["output"] == ""


def test_markdown_has_the_summary_and_one_escaped_line_per_item(run):
    md = text(run, "md")
    assert md.startswith(f"# qa — run `{run.id}`")
    assert "| exact | 0.50 | 0.00 | 1.00 | 0.50 | 0.95 | 50% | 2 | 0 |" in md
    assert "| judge | 1.00 | 1.00 | 1.00 | 1.00 | 1.00 | 100% | 1 | 1 |" in md
    item_lines = [line for line in md.splitlines() if line.startswith("| 0") or "| k00" in line]
    assert len(item_lines) == 3
    line = next(line for line in item_lines if "k001" in line)
    assert "line one \\| &lt;script&gt;alert(1)&lt;/script&gt; line two" in line
    assert XSS not in md
    assert "error: RuntimeError: agent crashed" in md


def test_json_is_the_results_document(run):
    document = json.loads(text(run, "json"))
    assert document == json.loads(json.dumps(results.run_results(run), default=str))
    assert [i["key"] for i in document["items"]] == ["k000", "k001", "k002"]


def test_json_lines_are_the_header_then_one_item_per_line(run):
    lines = text(run, "jsonl").splitlines()
    document = json.loads(text(run, "json"))
    assert json.loads(lines[0]) == {k: v for k, v in document.items() if k != "items"}
    assert [json.loads(line) for line in lines[1:]] == document["items"]


def test_an_export_bigger_than_a_chunk_is_complete_and_in_order(db, monkeypatch):
    monkeypatch.setattr(results, "EXPORT_CHUNK", 3)
    monkeypatch.setattr(results, "WRITE_BATCH", 2)
    big = make_run(keys=keys(8), runs=2, errors={"k005": "RuntimeError: agent crashed"})
    expected = [(i, r) for i in range(8) for r in (0, 1)]

    rows = list(csv.DictReader(io.StringIO(text(big, "csv"))))
    assert [(int(r["index"]), int(r["run_index"])) for r in rows] == expected
    md = [
        line
        for line in text(big, "md").splitlines()
        if line.startswith("| #") and "Key" not in line
    ]
    assert [line.split(" | ")[0] for line in md] == [
        f"| #{i + 1}" + (f" run {r + 1}" if r else "") for i, r in expected
    ]
    for items in (
        json.loads(text(big, "json"))["items"],
        [json.loads(line) for line in text(big, "jsonl").splitlines()[1:]],
    ):
        assert [(i["index"], i["runIndex"]) for i in items] == expected
        assert items[10]["status"] == "error" and items[10]["key"] == "k005"


def test_the_run_page_downloads_each_format(run):
    client = Client(HTTP_HOST="127.0.0.1")
    formats = (("csv", "text/csv"), ("md", "text/markdown"), ("json", "json"))
    for fmt, content_type in (*formats, ("jsonl", "application/x-ndjson")):
        reply = client.get(f"/runs/{run.id}/export.{fmt}")
        assert reply.status_code == 200 and content_type in reply["Content-Type"]
        assert reply["Content-Disposition"] == (
            f'attachment; filename="{exports.filename(run, fmt)}"'
        )
        body = b"".join(reply.streaming_content).decode()
        assert body == text(run, fmt)
    assert client.get(f"/runs/{run.id}/export.xml").status_code == 404


def test_an_empty_run_exports_valid_documents(db):
    empty = make_run(keys=[], evaluators=("judge",))
    assert json.loads(text(empty, "json"))["items"] == []
    assert text(empty, "csv").splitlines() == [
        "index,run_index,key,status,input,output,metadata,latency_ms,tokens,cost,error,verdict,"
        "judge_score,judge_verdict,judge_reason,steps,trace,judge_labels,label_disagreement"
    ]


EXPERIMENT = """
from cobalt import Dataset, Evaluator, experiment

dataset = Dataset(items=[{"id": f"q{i}", "input": f"question {i}"} for i in range(4)])


@experiment("export-me", dataset, evaluators=[
    Evaluator(name="short", type="function", fn=lambda ctx: {"score": 1.0, "reason": "fine"}),
])
def run(ctx):
    return "=1+1" if ctx.index == 0 else f"answer {ctx.index}"
"""


def test_cobalt_export_writes_each_format(project, cobalt_cli):
    project.write("experiments/export.cobalt.py", EXPERIMENT)
    ran = cobalt_cli(project, "run", "--quiet")
    assert ran.returncode == 0, ran.stderr
    run_id = ran.stdout.split("Run ID:")[1].split()[0]

    written = cobalt_cli(project, "export", run_id, "--format", "csv", "--output", "out.csv")
    assert written.returncode == 0, written.stderr
    assert f"Exported run {run_id} (4 items) to" in written.stdout
    rows = list(csv.DictReader((project.path / "out.csv").open(encoding="utf-8")))
    assert [r["output"] for r in rows] == ["'=1+1", "answer 1", "answer 2", "answer 3"]
    assert {r["short_score"] for r in rows} == {"1.0"}

    md = cobalt_cli(project, "export", run_id[:6], "--format", "md")
    assert md.returncode == 0 and md.stdout.startswith(f"# export-me — run `{run_id}`")

    (project.path / "exports").mkdir()
    to_dir = cobalt_cli(project, "export", run_id, "-f", "json", "-o", "exports")
    assert to_dir.returncode == 0, to_dir.stderr
    (saved,) = (project.path / "exports").iterdir()
    assert saved.suffix == ".json" and len(json.loads(saved.read_text())["items"]) == 4

    gzipped = cobalt_cli(project, "export", run_id, "-f", "jsonl", "-o", "out.jsonl.gz")
    assert gzipped.returncode == 0, gzipped.stderr
    with gzip.open(project.path / "out.jsonl.gz", "rt", encoding="utf-8") as fh:
        assert len(fh.read().splitlines()) == 1 + 4
    assert load_results(project.path / "out.jsonl.gz") == json.loads(saved.read_text())

    nowhere = cobalt_cli(project, "export", run_id, "-o", "missing/out.csv")
    assert nowhere.returncode == 2 and "missing does not exist" in nowhere.stderr


def test_cobalt_export_explains_bad_arguments(project, cobalt_cli):
    missing = cobalt_cli(project, "export", "nope")
    assert missing.returncode == 2 and "no run with id 'nope'" in missing.stderr
    bad_format = cobalt_cli(project, "export", "nope", "--format", "xml")
    assert bad_format.returncode == 2 and "'xml' is not one of" in bad_format.stderr
