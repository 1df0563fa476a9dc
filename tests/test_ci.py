"""`cobalt run --ci`: gates, exit codes, JUnit, GitHub Actions output, JSON lines, baselines.

Most tests run the real `cobalt` command in a throwaway project; the boundary of every
metric is also pinned on the plain gate functions.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cobalt.config import ConfigError, define_config, load_config
from cobalt.gates import GateSettings, check_run, resolve_settings
from cobalt.stats import describe, latency_stats
from tests.conftest import REPO

SCORES = [0.1, 0.3, 0.5, 0.7, 0.9]
STATS = describe(SCORES)
COST_PER_ITEM = 0.25

# Two evaluators scoring the same item field: `quality` is gated from cobalt.toml, `strict`
# from the experiment's own thresholds. SHIFT lowers every score; EXTRA adds an item.
EXPERIMENT = """
import os
from cobalt import Dataset, Evaluator, experiment

SCORES = {scores!r}
shift = float(os.environ.get("SHIFT", "0"))
items = [{{"id": f"item-{{n}}", "input": n, "score": round(max(s - shift, 0), 6)}}
         for n, s in enumerate(SCORES)]
if os.environ.get("REVERSE"):
    items.reverse()
if os.environ.get("EXTRA"):
    items.append({{"id": "brand-new", "input": 99, "score": 0.0}})

def run(ctx):
    print("noise from the agent")
    return {{"output": ctx.item["input"], "metadata": {{"cost": {cost}}}}}

score = lambda ctx: ctx.item["score"]
experiment(
    "scored",
    Dataset(items),
    run,
    evaluators=[
        Evaluator(name="quality", type="function", fn=score),
        Evaluator(name="strict", type="function", fn=score),
    ],
    thresholds={thresholds},
)
"""


def no_github(**extra: str) -> dict[str, str]:
    """Keep an outer GitHub Actions job from changing what the command prints."""
    return {"GITHUB_ACTIONS": "false", "GITHUB_STEP_SUMMARY": "", **extra}


def write_experiment(project, thresholds: dict | None = None) -> None:
    project.write(
        "experiments/scored.cobalt.py",
        EXPERIMENT.format(scores=SCORES, cost=COST_PER_ITEM, thresholds=thresholds),
    )


def toml_table(name: str, values: dict[str, float]) -> str:
    body = "".join(f"{key} = {value!r}\n" for key, value in values.items())
    return f"[{name}]\n{body}"


def write_config(project, *tables: str, ci: str = "") -> None:
    head = 'test_dir = "experiments"\n'
    if ci:
        head += f"[ci]\n{ci}\n"
    project.write("cobalt.toml", head + "\n".join(tables))


FLOORS = {m: STATS[{"pass_rate": "passRate"}.get(m, m)] for m in (
    "avg", "min", "max", "p50", "p95", "p99", "pass_rate"
)}  # fmt: skip
TOTAL_COST = COST_PER_ITEM * len(SCORES)
STRICT_PASS_RATE = 2 / 5  # scores >= 0.7


def test_every_floor_and_ceiling_passes_when_equal_to_its_threshold(project, cobalt_cli):
    write_experiment(project, {"strict": {"pass_rate": STRICT_PASS_RATE, "min_score": 0.7}})
    write_config(
        project,
        toml_table("ci.thresholds.quality", FLOORS),
        toml_table("ci.thresholds.cost", {"total": TOTAL_COST}),
        toml_table("ci.thresholds.latency", {"p50": 60_000.0, "p95": 60_000.0, "max": 60_000.0}),
    )
    result = cobalt_cli(project, "run", "--ci", env=no_github())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "✓ scored: 16 checks passed" in result.stdout
    assert "CI passed" in result.stdout
    assert "noise from the agent" in result.stdout  # the agent's prints are left alone
    assert "Item 1/5" not in result.stdout  # minimal output: no line per passing item


def test_every_floor_and_ceiling_fails_just_past_its_threshold(project, cobalt_cli):
    write_experiment(project, {"strict": {"pass_rate": STRICT_PASS_RATE + 0.01, "min_score": 0.7}})
    above = {metric: value + 0.001 for metric, value in FLOORS.items()}
    write_config(
        project,
        toml_table("ci.thresholds.quality", above),
        toml_table("ci.thresholds.cost", {"total": TOTAL_COST - 0.0001}),
        toml_table("ci.thresholds.latency", {"max": 0.0}),
    )
    junit = project.path / "reports" / "junit.xml"
    summary = project.path / "step-summary.md"
    summary.write_text("earlier step\n")
    result = cobalt_cli(
        project,
        "run",
        "--ci",
        "--junit",
        "reports/junit.xml",
        env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    for metric in ("avg", "min", "max", "p50", "p95", "p99", "pass_rate"):
        assert f"    quality {metric} " in out and f"< {above[metric]:.4g}"[:6] in out, metric
    assert "    quality avg 0.5 < 0.501\n" in out
    assert "    quality p95 0.86 < 0.861\n" in out
    assert "    strict pass_rate 0.4 < 0.41 (min_score 0.7)\n" in out
    assert "    cost total $1.25 > $1.2499\n" in out
    assert "    latency max " in out and "ms > 0ms" in out
    assert "✗ scored: 10 of 14 checks failed" in out
    assert "CI failed: 10 violations (exit 1)" in out

    # JUnit: one test case per evaluator gate and per other gate, failures where violated.
    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites" and root.get("failures") == "4"
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == "scored"
    cases = {case.get("name"): case for case in suite.findall("testcase")}
    assert set(cases) == {"quality", "strict", "run", "latency", "cost", "items"}
    failure = cases["quality"].find("failure")
    assert failure is not None and "quality avg 0.5 < 0.501" in failure.text
    assert cases["strict"].find("failure") is not None
    assert cases["run"].find("failure") is None
    assert cases["items"].find("failure") is None
    assert "$1.25 > $1.2499" in cases["cost"].find("failure").get("message")
    run_id = suite.find("properties/property[@name='run_id']").get("value")
    assert len(run_id) == 12

    # GitHub: an error annotation per violation, a Markdown table appended to the summary.
    errors = [line for line in out.splitlines() if line.startswith("::error ")]
    assert len(errors) == 10
    assert any(
        "file=experiments/scored.cobalt.py" in line
        and line.endswith("scored: quality avg 0.5 < 0.501")
        for line in errors
    )
    text = summary.read_text()
    assert text.startswith("earlier step\n## ❌ Cobalt CI failed (exit 1)")
    assert f"### ❌ scored · run {run_id}" in text
    assert "| quality | 0.50 | 0.10 | 0.50 | 0.86 | 60% | 0 | ❌ |" in text
    assert "- quality avg 0.5 &lt; 0.501" in text


def test_an_evaluator_named_in_thresholds_but_absent_is_a_violation(project, cobalt_cli):
    write_experiment(project, {"tone": {"avg": 0.1}})
    write_config(project, toml_table("ci.thresholds.relevance", {"avg": 0.8}))
    result = cobalt_cli(project, "run", "--ci", "--junit", "junit.xml", env=no_github())
    assert result.returncode == 1, result.stdout + result.stderr
    assert "    tone avg missing < 0.1 (no evaluator named 'tone' in this run)" in result.stdout
    assert "    relevance avg missing < 0.8 ([ci.thresholds.relevance] names an evaluator" in (
        result.stdout
    )
    root = ET.parse(project.path / "junit.xml").getroot()
    setup = root.find("testsuite[@name='cobalt setup']")
    assert setup.find("testcase[@name='relevance']/failure") is not None
    assert root.find("testsuite[@name='scored']/testcase[@name='tone']/failure") is not None


FAILING = """
from cobalt import Dataset, Evaluator, experiment

def run(ctx):
    if ctx.item["id"] in FAIL:
        raise ValueError("agent crashed 100% <b>|x</b>\\n::error::injected")
    return "fine"

FAIL = {fail!r}
experiment(
    "flaky",
    Dataset([{{"id": f"q{{n}}"}} for n in range(4)]),
    run,
    evaluators=[Evaluator(name="ok", type="function", fn=lambda ctx: 1.0)],
)
"""


def test_a_run_where_every_item_errored_fails_even_without_fail_on_error(project, cobalt_cli):
    project.write("experiments/flaky.cobalt.py", FAILING.format(fail=["q0", "q1", "q2", "q3"]))
    write_config(project, ci="fail_on_error = false")
    summary = project.path / "summary.md"
    result = cobalt_cli(
        project,
        "run",
        "--ci",
        "--junit",
        "junit.xml",
        env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "    run scored 0 < 1\n" in result.stdout
    assert "items errored" not in result.stdout
    assert "  ✗ item #1 error: ValueError: agent crashed 100% <b>|x</b>\n" in result.stdout
    # Errored items are skipped (not failed) test cases when fail_on_error is off.
    suite = ET.parse(project.path / "junit.xml").getroot().find("testsuite")
    items = [c for c in suite.findall("testcase") if c.get("classname") == "cobalt.flaky.items"]
    assert [c.get("name") for c in items] == [f"item #{n} [q{n - 1}]" for n in range(1, 5)]
    assert all(c.find("skipped") is not None for c in items)
    # Agent text cannot start a workflow command of its own, nor inject HTML in the summary.
    lines = result.stdout.splitlines()
    assert not any(line.startswith("::error::injected") for line in lines)
    warnings = [line for line in lines if line.startswith("::warning ")]
    assert len(warnings) == 4
    assert warnings[0].endswith(
        "flaky: item #1 [q0] error: ValueError: agent crashed 100%25 <b>|x</b>"
    )
    assert "<b>" not in summary.read_text()


def test_errored_items_fail_the_gate_by_default_and_are_junit_errors(project, cobalt_cli):
    project.write("experiments/flaky.cobalt.py", FAILING.format(fail=["q2"]))
    result = cobalt_cli(project, "run", "--ci", "--junit", "junit.xml", env=no_github())
    assert result.returncode == 1, result.stdout + result.stderr
    assert "    items errored 1 > 0\n" in result.stdout
    suite = ET.parse(project.path / "junit.xml").getroot().find("testsuite")
    (case,) = [c for c in suite.findall("testcase") if c.get("classname") == "cobalt.flaky.items"]
    error = case.find("error")
    assert case.get("name") == "item #3 [q2]"
    assert error.get("message").startswith("ValueError: agent crashed")
    assert "Traceback (most recent call last)" in error.text
    assert suite.get("errors") == "1"


def test_max_error_rate_lets_a_share_of_errors_through(project, cobalt_cli):
    project.write("experiments/flaky.cobalt.py", FAILING.format(fail=["q2"]))
    write_config(project, ci="max_error_rate = 0.25")
    result = cobalt_cli(project, "run", "--ci", env=no_github())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "CI passed" in result.stdout


def test_an_experiment_file_that_fails_to_import_exits_2_naming_it(project, cobalt_cli):
    write_experiment(project)
    project.write("experiments/broken.cobalt.py", "import os\nraise RuntimeError('no agent')\n")
    result = cobalt_cli(
        project, "run", "--ci", "--junit", "junit.xml", env={"GITHUB_ACTIONS": "true"}
    )
    assert result.returncode == 2, result.stdout + result.stderr
    expected = "experiments/broken.cobalt.py failed to import: RuntimeError: no agent"
    assert expected in result.stdout
    assert expected in result.stderr
    assert "✓ scored:" in result.stdout  # the other experiments still ran
    lines = result.stdout.splitlines()
    annotation = next(line for line in lines if line.startswith("::error "))
    assert annotation.startswith("::error file=experiments/broken.cobalt.py,line=2,")
    root = ET.parse(project.path / "junit.xml").getroot()
    case = root.find("testsuite[@name='cobalt setup']/testcase[@classname='cobalt.import']")
    assert case.get("name") == "experiments/broken.cobalt.py"
    assert case.find("error").get("message") == "RuntimeError: no agent"
    assert root.get("errors") == "1"


def test_malformed_thresholds_exit_2_before_anything_runs(project, cobalt_cli):
    write_experiment(project, {"quality": {"avg": "high"}})
    result = cobalt_cli(project, "run", "--ci", "--junit", "junit.xml", env=no_github())
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        "experiments/scored.cobalt.py: experiment 'scored' `thresholds.quality.avg` must be "
        "a number from 0 to 1 (got 'high')"
    ) in result.stdout
    assert project.results_files() == []
    root = ET.parse(project.path / "junit.xml").getroot()
    assert root.find(".//testcase[@classname='cobalt.config']/error") is not None

    write_experiment(project)
    write_config(project, toml_table("ci.thresholds.quality", {"avgg": 0.5}))
    result = cobalt_cli(project, "run", "--ci", env=no_github())
    assert result.returncode == 2
    assert "`ci.thresholds.quality.avgg` is not a known metric; use avg, min" in result.stderr


def test_json_reporter_prints_only_json_events_on_stdout(project, cobalt_cli):
    write_experiment(project)
    write_config(project, toml_table("ci.thresholds.quality", {"avg": 0.9}))
    result = cobalt_cli(project, "run", "--ci", "--reporter", "json", env=no_github())
    assert result.returncode == 1, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds == ["run.started", *["item.finished"] * 5, "run.finished"]
    assert events[0]["name"] == "scored" and events[0]["totalItems"] == 5
    assert events[0]["evaluators"] == ["quality", "strict"]
    scores = sorted(e["evaluations"]["quality"]["score"] for e in events[1:-1])
    assert scores == SCORES
    assert events[-1]["summary"]["scores"]["quality"]["avg"] == STATS["avg"]
    assert {e["runId"] for e in events} == {events[0]["runId"]}
    assert "quality avg 0.5 < 0.9" in result.stderr
    assert "noise from the agent" in result.stderr


def test_baseline_gate_fails_on_a_regression_of_items_matched_by_key(project, cobalt_cli):
    write_experiment(project)
    write_config(project, ci="max_regression = 0.1")
    first = cobalt_cli(project, "run", "--ci", "--baseline", "latest", env=no_github())
    assert first.returncode == 0, first.stdout + first.stderr
    assert "no earlier completed run of 'scored'; baseline gate skipped" in first.stdout
    baseline_id = first.stdout.split("· run ")[1].split()[0]

    # Same items in another order, one new item scored 0 (not matched), every score -0.1.
    env = no_github(SHIFT="0.1", REVERSE="1", EXTRA="1")
    equal = cobalt_cli(project, "run", "--ci", "--baseline", baseline_id, env=env)
    assert equal.returncode == 0, equal.stdout + equal.stderr

    second_id = equal.stdout.split("· run ")[1].split()[0]

    # `latest` is the second run: the five matched items average 0.4 there, 0.28 now.
    env = no_github(SHIFT="0.25")
    worse = cobalt_cli(project, "run", "--ci", "--baseline", "latest", "--junit", "j.xml", env=env)
    assert worse.returncode == 1, worse.stdout + worse.stderr
    assert (
        "    quality regression 0.12 > 0.1 (avg 0.4 → 0.28 over 5 items matched with run "
        f"{second_id})\n"
    ) in worse.stdout
    suite = ET.parse(project.path / "j.xml").getroot().find("testsuite")
    assert suite.find("properties/property[@name='baseline_run_id']").get("value") == second_id
    assert "quality regression" in suite.find("testcase[@name='quality']/failure").get("message")


def test_an_unknown_baseline_run_is_a_configuration_error(project, cobalt_cli):
    write_experiment(project)
    result = cobalt_cli(project, "run", "--ci", "--baseline", "nope1234", env=no_github())
    assert result.returncode == 2
    assert "--baseline: no run with id 'nope1234'" in result.stdout
    result = cobalt_cli(project, "run", "--baseline", "latest", env=no_github())
    assert result.returncode == 2
    assert "--baseline needs --ci" in result.stderr


# ---------------------------------------------------------------------------------------------
# The gate functions themselves: every metric at its boundary.


def summary_with(scores: list[float], *, latencies=(100.0, 200.0, 300.0), cost=0.3, failed=0):
    ok = len(latencies)
    return {
        "totalItems": ok + failed,
        "itemStatus": {"ok": ok, "error": failed},
        "latency": latency_stats(list(latencies)),
        "estimatedCost": cost,
        "scores": {"quality": describe(scores)},
    }


@pytest.mark.parametrize("metric", ["avg", "min", "max", "p50", "p95", "p99", "pass_rate"])
def test_score_floors_pass_at_equality_and_fail_below(metric):
    summary = summary_with([0.2, 0.45, 0.7, 0.95])
    actual = summary["scores"]["quality"][{"pass_rate": "passRate"}.get(metric, metric)]
    for threshold, passes in ((actual, True), (actual - 0.01, True), (actual + 1e-6, False)):
        settings = GateSettings(evaluators={"quality": {metric: threshold}})
        (check,) = [c for c in check_run(summary, settings) if c.metric == metric]
        assert check.passed is passes, (metric, threshold)


@pytest.mark.parametrize(
    ("gate", "metric", "actual"),
    [("latency", "p50", 200.0), ("latency", "p95", 290.0), ("latency", "max", 300.0)]
    + [("cost", "total", 0.3)],
)
def test_latency_and_cost_are_ceilings_that_pass_at_equality(gate, metric, actual):
    summary = summary_with([0.5])
    for threshold, passes in ((actual, True), (actual + 1, True), (actual - 1e-6, False)):
        settings = GateSettings(**{gate: {metric: threshold}})
        (check,) = [c for c in check_run(summary, settings) if c.gate == gate]
        assert check.passed is passes, (gate, metric, threshold, check.line())
        assert (">" in check.line()) is not passes


def test_error_rate_is_a_ceiling_and_pass_rate_uses_min_score():
    summary = summary_with([0.5], failed=1, latencies=(1.0, 1.0, 1.0))  # 1 of 4 failed
    for limit, passes in ((0.25, True), (0.2499, False)):
        settings = resolve_settings({"max_error_rate": limit}, None, ["quality"])
        assert settings.fail_on_error is False  # the rate decides when it is set alone
        checks = check_run(summary, settings)
        (check,) = [c for c in checks if c.gate == "items" and c.metric == "error_rate"]
        assert check.passed is passes
    strict = resolve_settings({"fail_on_error": True, "max_error_rate": 0.5}, None, [])
    assert strict.fail_on_error is True
    settings = GateSettings(evaluators={"quality": {"pass_rate": 0.5, "min_score": 0.8}})
    checks = check_run(summary, settings, pass_rate_at=lambda name, floor: 0.5)
    assert [c.line() for c in checks if c.metric == "pass_rate"] == [
        "quality pass_rate 0.5 >= 0.5 (min_score 0.8)"
    ]


def test_experiment_thresholds_override_the_config_metric_by_metric():
    ci = {
        "thresholds": {"quality": {"avg": 0.8, "p95": 0.9}, "other": {"avg": 0.5}},
        "max_regression": 0.05,
    }
    own = {"quality": {"avg": 0.6}, "latency": {"p95": 1000}, "max_regression": 0.2}
    settings = resolve_settings(ci, own, ["quality"])
    assert settings.evaluators == {"quality": {"avg": 0.6, "p95": 0.9}}
    assert settings.latency == {"p95": 1000.0}
    assert settings.max_regression == 0.2


def test_config_validation_names_the_key_and_what_to_do(tmp_path: Path):
    cases = {
        "[ci.thresholds.latency]\np95 = -1\n": "`ci.thresholds.latency.p95` must be milliseconds",
        "[ci.thresholds.cost]\nmean = 1\n": "`ci.thresholds.cost.mean` is not a known metric",
        "[ci]\nfail_on_error = 1\n": "`ci.fail_on_error` must be true or false",
        "[ci]\nmax_regresion = 0.1\n": "`ci.max_regresion` is not a CI setting",
        '[[webhooks]]\nurl = "ftp://x"\n': "`webhooks[0].url` must be an http:// or https://",
        '[[webhooks]]\nurl = "http://x"\nevents = ["run.done"]\n': "`webhooks[0].events`",
        "plugins = 'a.py'\n": "`plugins` must be a list of Python file paths",
    }
    for text, message in cases.items():
        (tmp_path / "cobalt.toml").write_text(text)
        with pytest.raises(ConfigError) as caught:
            load_config(tmp_path)
        assert message in str(caught.value), text
        assert "cobalt.toml" in str(caught.value)


def documented_commands() -> list[str]:
    """Every `cobalt run` line of the CI docs and the README's workflow examples."""
    found = []
    for doc in (REPO / "docs" / "ci.md", REPO / "README.md"):
        for line in doc.read_text().splitlines():
            text = line.strip().removeprefix("- ").removeprefix("run: ")
            if text.startswith("cobalt run --ci") and "#" not in text:
                found.append(text)
    return sorted(set(found))


def test_the_documented_workflow_commands_work_as_documented(project, cobalt_cli):
    commands = documented_commands()
    assert "cobalt run --ci --baseline latest --junit reports/junit.xml" in commands
    write_experiment(project)
    write_config(project, toml_table("ci.thresholds.quality", {"avg": 0.5}))
    for command in commands:
        summary = project.path / "summary.md"
        env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}
        result = cobalt_cli(project, *command.split()[1:], env=env)
        assert result.returncode == 0, (command, result.stdout + result.stderr)
        root = ET.parse(project.path / "reports" / "junit.xml").getroot()
        assert root.get("failures") == "0" and root.get("tests") == "4"
        assert summary.read_text().startswith("## ✅ Cobalt CI passed")
        summary.unlink()


def test_define_config_validates_ci_the_same_way():
    with pytest.raises(ConfigError, match=r"`ci.thresholds.quality.avg` must be a number from 0"):
        define_config(ci={"thresholds": {"quality": {"avg": 1.5}}})
    config = define_config(ci={"thresholds": {"quality": {"passRate": 0.9, "minScore": 0.7}}})
    settings = resolve_settings(config["ci"], None, ["quality"])
    assert settings.evaluators == {"quality": {"pass_rate": 0.9, "min_score": 0.7}}
