"""One verdict rule (`cobalt.verdict`) at every door.

The rule on its own first; then an evaluator with `pass_threshold=0.8` that scores 0.6 on four
items, read through each door: the terminal, the summary and the results file, exports, JUnit
and GitHub annotations, a CI gate, MCP, the API, `ExperimentReport`, the pytest plugin, flaky
detection and the run page. 0.6 passes the default mark (0.5), so a door that forgot the
evaluator's own mark says pass where the rule says fail. Last, a run stored before pass rates
counted each evaluator's mark reads correctly after the migration.
"""

from __future__ import annotations

import csv
import importlib
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from django.apps import apps as django_apps
from django.test import Client

from cobalt import Dataset, Evaluator, gates, stats, verdict
from cobalt.experiments import Experiment
from cobalt.report import ExperimentReport, _why
from cobalt.verdict import Verdict
from cobalt_app import flaky, results
from cobalt_app.flaky import Observation, item_flakiness
from cobalt_app.models import Run
from cobalt_cli.mcp.reports import item_problems
from tests.conftest import Project
from tests.helpers import execute, run_id_of
from tests.test_api import api, token, user  # noqa: F401 (fixtures)
from tests.test_mcp import run_session, text_of
from tests.test_pages import row_keys
from tests.test_pytest_plugin import pytest_in

CLOSE_CALL = """
from cobalt import Dataset, Evaluator, experiment

dataset = Dataset(items=[{"id": f"q{i}", "input": i} for i in range(4)])


def nearly(ctx):
    return {"score": 0.6, "reason": "close, not quite"}


@experiment("close-call", dataset, evaluators=[
    Evaluator(name="quality", type="function", fn=nearly, pass_threshold=0.8),
])
def run(ctx):
    return f"answer {ctx.item['input']}"
"""
KEYS = ["q0", "q1", "q2", "q3"]


# The rule ------------------------------------------------------------------------------------


def test_a_score_passes_at_or_above_its_mark_and_is_borderline_within_the_margin():
    assert verdict.pass_mark(None) == verdict.DEFAULT_PASS_THRESHOLD == 0.5
    assert verdict.pass_mark(0.8) == 0.8
    assert [verdict.score_verdict(s, 0.8) for s in (0.6, 0.79, 0.8, 0.89, 0.9, 1.0)] == [
        "fail",
        "fail",
        "borderline",
        "borderline",
        "pass",
        "pass",
    ]
    assert verdict.score_verdict(0.6) == "pass"  # the default mark: the old rule's 0.5
    assert verdict.score_verdict(0.5) == "borderline"
    assert verdict.score_verdict(None, 0.8) is Verdict.NONE
    assert verdict.score_verdict(1.0, 0.95) is Verdict.PASS  # a perfect score is never borderline
    assert verdict.passes(0.6, 0.8) is False and verdict.passes(0.8, 0.8) is True
    assert verdict.passes(None) is None


def test_an_evaluation_error_is_neither_a_pass_nor_a_fail():
    assert verdict.evaluation_verdict(0.9, 0.8, error=True) is Verdict.ERROR
    assert verdict.evaluation_verdict(None, 0.8) is Verdict.ERROR
    assert verdict.evaluation_verdict(0.6, 0.8) is Verdict.FAIL
    assert Verdict.ERROR.passed is None and Verdict.NONE.passed is None
    assert Verdict.BORDERLINE.passed is True and Verdict.FAIL.passed is False


def test_an_item_fails_when_any_evaluation_fails():
    item = verdict.item_verdict
    assert item([Verdict.PASS, Verdict.FAIL]) is Verdict.FAIL
    assert item([Verdict.PASS, Verdict.BORDERLINE]) is Verdict.BORDERLINE
    assert item([Verdict.PASS, Verdict.ERROR]) is Verdict.ERROR  # a check could not run
    assert item([Verdict.ERROR, Verdict.FAIL]) is Verdict.FAIL
    assert item([Verdict.ERROR]) is Verdict.ERROR
    assert item([]) is Verdict.NONE
    assert item([Verdict.PASS], errored=True) is Verdict.ERROR


def test_pass_marks_and_pass_rates_follow_each_evaluator():
    described = [
        {"name": "quality", "type": "function", "pass_threshold": 0.8},
        {"name": "exact", "type": "exact-match"},
        {"type": "nameless"},
    ]
    assert verdict.pass_marks(described) == {"quality": 0.8, "exact": 0.5}
    assert verdict.pass_rate([0.6, 0.6, 0.9, 0.8], 0.8) == 0.5
    assert verdict.pass_rate([0.6, 0.6, 0.9, 0.8]) == 1.0
    assert verdict.pass_rate([]) is None


def test_verdicts_read_as_their_strings_in_json_and_templates():
    assert Verdict.FAIL == "fail" and f"score-{Verdict.BORDERLINE}" == "score-borderline"
    assert json.dumps({"verdict": Verdict.PASS}) == '{"verdict": "pass"}'


def test_describe_counts_the_pass_rate_at_the_given_mark():
    at_mark = stats.describe([0.6] * 4, pass_mark=0.8)
    assert (at_mark["passRate"], at_mark["passMark"]) == (0.0, 0.8)
    default = stats.describe([0.6] * 4)
    assert (default["passRate"], default["passMark"]) == (1.0, 0.5)
    assert stats.describe([], pass_mark=0.8)["passMark"] == 0.8


# Doors through the real `cobalt` command --------------------------------------------------------


@pytest.fixture
def close_call(project: Project) -> Project:
    project.write("experiments/close.cobalt.py", CLOSE_CALL)
    return project


def test_the_terminal_marks_each_item_failed_and_warns_at_the_evaluators_mark(
    close_call, cobalt_cli
):
    result = cobalt_cli(close_call, "run")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for number in range(1, 5):
        assert f"✗ Item {number}/4 — quality: 0.60" in out
    assert "✓ Item" not in out
    assert "⚠ low score (quality < 0.8)" in out
    assert "⚠ 4 items scored below 0.8 on 'quality' (#1, #2, #3, #4)" in out


def test_the_summary_and_the_results_file_count_the_evaluators_mark(close_call, cobalt_cli):
    result = cobalt_cli(close_call, "run", "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    (path,) = close_call.results_files()
    document = json.loads(path.read_text())
    quality = document["summary"]["scores"]["quality"]
    assert (quality["avg"], quality["passRate"], quality["passMark"]) == (0.6, 0.0, 0.8)
    assert [item["verdict"] for item in document["items"]] == ["fail"] * 4
    assert document["items"][0]["evaluations"]["quality"] == {
        "score": 0.6,
        "verdict": "fail",
        "reason": "close, not quite",
    }


def test_exports_carry_each_item_and_evaluation_verdict(close_call, cobalt_cli):
    ran = cobalt_cli(close_call, "run", "--quiet")
    run_id = run_id_of(ran.stdout)

    written = cobalt_cli(close_call, "export", run_id, "--format", "csv", "--output", "out.csv")
    assert written.returncode == 0, written.stderr
    rows = list(csv.DictReader((close_call.path / "out.csv").open(encoding="utf-8")))
    assert [(r["key"], r["verdict"], r["quality_score"], r["quality_verdict"]) for r in rows] == [
        (key, "fail", "0.6", "fail") for key in KEYS
    ]

    exported = cobalt_cli(close_call, "export", run_id, "--format", "json")
    document = json.loads(exported.stdout)
    assert document["summary"]["scores"]["quality"]["passRate"] == 0.0
    assert {item["evaluations"]["quality"]["verdict"] for item in document["items"]} == {"fail"}

    markdown = cobalt_cli(close_call, "export", run_id, "--format", "md").stdout
    assert "| quality | 0.60 | 0.60 | 0.60 | 0.60 | 0.60 | 0% (≥ 0.8) | 4 | 0 |" in markdown
    assert '| #1 | q0 | ok | fail | {"id": "q0", "input": 0} | answer 0 | 0.60 fail |' in markdown


def test_junit_and_github_report_the_pass_rate_at_the_evaluators_mark(close_call, cobalt_cli):
    close_call.write(
        "cobalt.toml", 'test_dir = "experiments"\n[ci.thresholds.quality]\npass_rate = 0.5\n'
    )
    summary = close_call.path / "step-summary.md"
    result = cobalt_cli(
        close_call,
        "run",
        "--ci",
        "--junit",
        "junit.xml",
        env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert result.returncode == 1, result.stdout + result.stderr
    gate = "quality pass_rate 0 < 0.5 (pass mark 0.8)"
    below = "quality: 4 of 4 scores below its pass mark 0.8 (pass rate 0%)"
    assert f"    {gate}\n" in result.stdout

    root = ET.parse(close_call.path / "junit.xml").getroot()
    case = root.find("testsuite[@name='close-call']/testcase[@name='quality']")
    assert case.find("failure").get("message") == gate
    assert below in case.find("system-out").text

    lines = result.stdout.splitlines()
    errors = [line for line in lines if line.startswith("::error ")]
    warnings = [line for line in lines if line.startswith("::warning ")]
    assert any(line.endswith(f"::close-call: {gate}") for line in errors), errors
    assert any(line.endswith("::close-call: " + below.replace("%", "%25")) for line in warnings)
    assert "| quality | 0.60 | 0.60 | 0.60 | 0.60 | 0% (≥ 0.8) | 0 | ❌ |" in summary.read_text()


def test_json_lines_carry_each_item_and_evaluation_verdict(close_call, cobalt_cli):
    result = cobalt_cli(close_call, "run", "--ci", "--reporter", "json", env={"GITHUB_ACTIONS": ""})
    events = [json.loads(line) for line in result.stdout.splitlines()]
    finished = [e for e in events if e["event"] == "item.finished"]
    assert len(finished) == 4
    assert {e["verdict"] for e in finished} == {"fail"}
    assert {e["evaluations"]["quality"]["verdict"] for e in finished} == {"fail"}
    assert events[-1]["summary"]["scores"]["quality"]["passRate"] == 0.0


def test_mcp_lists_every_item_below_its_evaluators_mark_as_failing(
    close_call, cobalt_cli, fake_provider_server
):
    run_id = run_id_of(cobalt_cli(close_call, "run", "--quiet").stdout)
    seen = {}

    async def scenario(session) -> None:
        seen["run"] = await session.call_tool("cobalt_results", {"runId": run_id})
        for status in ("failing", "passing"):
            arguments = {"runId": run_id, "status": status}
            seen[status] = await session.call_tool("cobalt_results", arguments)

    run_session(close_call, fake_provider_server, scenario)
    document = seen["run"].structured_content
    assert document["itemCounts"]["failing"] == 4 and document["itemCounts"]["passing"] == 0
    assert "4 of 4 items failing:" in text_of(seen["run"])
    failing = seen["failing"].structured_content
    assert failing["page"]["matched"] == 4
    assert [item["problems"] for item in failing["items"]] == [
        ["quality 0.60 — close, not quite"]
    ] * 4
    assert seen["passing"].structured_content["page"]["matched"] == 0


def test_the_pytest_plugin_fails_each_item_below_its_evaluators_mark(close_call):
    result = pytest_in(close_call, "-v", "experiments")
    assert result.returncode == 1, result.stdout + result.stderr
    for key in KEYS:
        assert f"experiments/close.cobalt.py::close-call[{key}] FAILED" in result.stdout
    assert "quality scored 0.60 (pass mark 0.80): close, not quite" in result.stdout
    assert "4 failed" in result.stdout


HALF_CHECKED = """
from cobalt import Dataset, Evaluator, experiment

dataset = Dataset(items=[{"id": "q0", "input": 0}])


def broken(ctx):
    raise RuntimeError("the judge's rubric file is missing")


@experiment("half-checked", dataset, evaluators=[
    Evaluator(name="exact", type="function", fn=lambda ctx: 1.0),
    Evaluator(name="rubric", type="function", fn=broken),
])
def run(ctx):
    return "answer"
"""


def test_every_door_reads_an_item_one_of_whose_checks_errored_as_not_passed(
    project, cobalt_cli, fake_provider_server
):
    project.write("experiments/half.cobalt.py", HALF_CHECKED)
    result = cobalt_cli(project, "run")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "⚠ Item 1/1 — exact: 1.00 | rubric: eval error" in result.stdout
    assert "✓ Item" not in result.stdout
    (path,) = project.results_files()
    (entry,) = json.loads(path.read_text())["items"]
    assert entry["verdict"] == "error"
    seen = {}

    async def scenario(session) -> None:
        arguments = {"runId": run_id_of(result.stdout), "status": "failing"}
        seen["failing"] = await session.call_tool("cobalt_results", arguments)

    run_session(project, fake_provider_server, scenario)
    assert seen["failing"].structured_content["page"]["matched"] == 1
    tested = pytest_in(project, "-v", "experiments")
    assert "experiments/half.cobalt.py::half-checked[q0] FAILED" in tested.stdout, tested.stdout


# Doors in this process (the engine, then the reads) ------------------------------------------


def close_call_experiment(scores=(0.6,), runs: int = 1) -> Experiment:
    """`close-call` in-process: repetition n scores `scores[n]` against a mark of 0.8."""

    def answer(ctx):
        return {"output": f"answer {ctx.item['input']}", "metadata": {"repetition": ctx.run_index}}

    def nearly(ctx):
        score = scores[ctx.metadata["repetition"] % len(scores)]
        return {"score": score, "reason": "close, not quite"}

    quality = Evaluator(name="quality", type="function", fn=nearly, pass_threshold=0.8)
    dataset = Dataset(items=[{"id": key, "input": key} for key in KEYS])
    return Experiment("close-call", dataset, answer, [quality], runs=runs)


def test_a_ci_gate_counts_the_pass_rate_at_the_evaluators_mark():
    summary = {"scores": {"quality": stats.describe([0.6] * 4, pass_mark=0.8)}, "totalItems": 4}
    rate = gates.GateSettings(evaluators={"quality": {"pass_rate": 0.5}})
    (check,) = [c for c in gates.check_run(summary, rate) if c.metric == "pass_rate"]
    assert not check.passed and check.line() == "quality pass_rate 0 < 0.5 (pass mark 0.8)"
    # Another `min_score` asks the scores again, by the same rule.
    lenient = gates.GateSettings(evaluators={"quality": {"pass_rate": 0.5, "min_score": 0.5}})
    checks = gates.check_run(
        summary, lenient, pass_rate_at=lambda name, floor: verdict.pass_rate([0.6] * 4, floor)
    )
    (check,) = [c for c in checks if c.metric == "pass_rate"]
    assert check.passed and check.line() == "quality pass_rate 1 >= 0.5 (min_score 0.5)"


@pytest.mark.django_db(transaction=True)
def test_the_api_exposes_each_evaluation_and_item_verdict(project, api, settings):  # noqa: F811
    settings.TEAM_MODE = False
    (run,) = execute(project, close_call_experiment())
    items = api.get(f"/api/runs/{run.id}/items/").json()["results"]
    assert [(i["key"], i["verdict"]) for i in items] == [(key, "fail") for key in KEYS]
    assert items[0]["evaluations"]["quality"] == {
        "score": 0.6,
        "verdict": "fail",
        "reason": "close, not quite",
    }
    detail = api.get(f"/api/runs/{run.id}/").json()
    assert detail["summary"]["scores"]["quality"]["passRate"] == 0.0


@pytest.mark.django_db(transaction=True)
def test_experiment_report_failures_are_the_items_below_their_mark(project):
    (run,) = execute(project, close_call_experiment())
    report = ExperimentReport(results.run_results(run))
    failures = report.failures()
    assert [item["key"] for item in failures] == KEYS
    assert _why(failures[0]) == "quality 0.60: close, not quite"
    assert report.statistics["quality"]["passRate"] == 0.0


@pytest.mark.django_db(transaction=True)
def test_flaky_detection_judges_each_run_by_its_evaluators_mark(project):
    # 0.6 then 0.9: both pass at 0.5, only the second at 0.8 — every item flips.
    execute(project, close_call_experiment(scores=(0.6, 0.9), runs=2))
    report = flaky.flaky_report("close-call")
    assert [(item.key, item.flips, item.pass_rate) for item in report.flaky] == [
        (key, 1, 0.5) for key in KEYS
    ]
    assert flaky.flaky_report("close-call", pass_score=0.5).flaky == []  # one mark for all


def test_an_observation_passes_only_when_every_evaluation_reaches_its_own_mark():
    marks = {"quality": 0.8, "exact": 0.5}
    observed = [
        Observation("r1", 0, "a", 0, "ok", {"quality": 0.6, "exact": 1.0}, marks),
        Observation("r2", 0, "a", 0, "ok", {"quality": 0.8, "exact": 0.5}, marks),
    ]
    found = item_flakiness(observed)["a"]
    assert (found.passes, found.fails, found.flips) == (1, 1, 1)


@pytest.mark.django_db(transaction=True)
def test_the_run_page_shows_the_scores_as_failures(project):
    (run,) = execute(project, close_call_experiment())
    client = Client(HTTP_HOST="127.0.0.1")
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert row_keys(page) == KEYS  # the failures view lists every item
    assert 'class="chip score-chip score-fail"' in page
    assert "0% pass" in page
    everything = client.get(f"/runs/{run.id}/?view=all").content.decode()
    assert everything.count('score-cell score-fail" data-verdict="fail"') == 4


# A run stored before --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_run_stored_with_pass_rates_at_half_reads_at_its_evaluators_mark(project):
    (run,) = execute(project, close_call_experiment())
    (plain,) = execute(project, close_call_experiment())
    Run.objects.filter(id=plain.id).update(config={**plain.config, "evaluators": []})
    for stored in (run, plain):  # as finalised before: every pass rate counted at 0.5
        summary = json.loads(json.dumps(stored.summary))
        summary["scores"]["quality"] = stats.describe([0.6] * 4)
        del summary["scores"]["quality"]["passMark"]
        Run.objects.filter(id=stored.id).update(summary=summary)
    before_plain = Run.objects.get(id=plain.id).summary

    migration = importlib.import_module("cobalt_app.migrations.0008_verdict_pass_marks")
    migration.recount_pass_rates(django_apps, None)

    quality = Run.objects.get(id=run.id).summary["scores"]["quality"]
    assert (quality["passRate"], quality["passMark"]) == (0.0, 0.8)
    assert Run.objects.get(id=plain.id).summary == before_plain  # no mark declared: untouched
    rate = gates.GateSettings(evaluators={"quality": {"pass_rate": 0.5}})
    (check,) = [
        c
        for c in gates.check_run(Run.objects.get(id=run.id).summary, rate)
        if c.metric == "pass_rate"
    ]
    assert not check.passed
    page = Client(HTTP_HOST="127.0.0.1").get(f"/runs/{run.id}/").content.decode()
    assert "0% pass" in page


def test_mcp_problems_read_the_entry_verdicts():
    entry = {
        "status": "ok",
        "evaluations": {
            "quality": {"score": 0.6, "verdict": "fail", "reason": "close"},
            "exact": {"score": 1.0, "verdict": "pass", "reason": "same"},
            "judge": {"score": None, "verdict": "error", "error": "prose"},
        },
    }
    assert item_problems(entry) == ["quality 0.60 — close", "judge could not score it (prose)"]
    assert item_problems(entry, "exact") == []


def test_results_entries_state_the_verdict_of_what_did_not_run(tmp_path: Path):
    failed = ("error", None, "error", "judge replied prose", False)
    assert results.evaluation_entry(*failed) == {
        "score": None,
        "verdict": "error",
        "error": "judge replied prose",
    }
    row = (1, 0, 0, "k", "timeout", "late", "{}", "null", "{}", None, 0, 0.0)
    assert results.row_entry(row, {})["verdict"] == "error"
    pending = (1, 0, 0, "k", "pending", "", "{}", "null", "{}", None, 0, 0.0)
    assert results.row_entry(pending, {})["verdict"] == "none"


@pytest.mark.parametrize("threshold", [None, 0.0, 0.3, 0.5, 0.8, 1.0])
def test_the_pass_rate_of_sorted_scores_counts_as_the_one_at_a_time(threshold):
    import numpy as np

    marks = [0.0, 0.3, 0.4, 0.4999999, 0.5, 0.7999999, 0.8, 0.9, 1.0, float("nan")]
    for n in range(len(marks) * 3):
        scores = np.sort(np.array([marks[(n * k) % len(marks)] for k in range(n)], dtype=float))
        expected = verdict.pass_rate(scores, threshold)
        assert verdict.sorted_pass_rate(scores, threshold) == expected, (scores, threshold)
