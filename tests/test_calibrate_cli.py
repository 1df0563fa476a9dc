"""`cobalt calibrate`, `cobalt rejudge --labelled` and `cobalt compare --pairwise`, run as the
real commands against the fake provider: the disagreements a person fixes a judge with, the
agreement moving after a re-judge of the labelled items, the bias probes' counts, and a
pairwise judge's win rate with its interval."""

from __future__ import annotations

import json

import pytest

from tests.conftest import Project
from tests.helpers import run_id_of

# `strict` passes long answers only ([[pass_if_longer]]: a verbosity-biased judge); `moody`
# answers pass then fail for the same prompt ([[alternate]]); `longer` prefers the longer
# output (a consistent pairwise judge); `first` always prefers the output shown first
# (position bias); `chatty` answers prose.
EXPERIMENT = """
from cobalt import Dataset, Evaluator, experiment

ITEMS = [{"id": f"q{i}", "input": f"question {i}", "expected_output": "ok"} for i in range(12)]
ANSWER = "yes"

@experiment(
    "qa",
    Dataset(items=ITEMS),
    evaluators=[
        Evaluator(name="strict", prompt="Grade: {{output}} @PROMPT@"),
        Evaluator(name="moody", prompt="Grade again: {{output}} [[alternate]]"),
        Evaluator(name="longer", type="pairwise", prompt="Which is better for {{input}}? [[prefer:longer]]"),
        Evaluator(name="first", type="pairwise", prompt="Which is better? [[prefer:first]]"),
        Evaluator(name="chatty", type="pairwise", prompt="[[reply:I like the second one]]"),
    ],
)
def run(ctx):
    return f"{ANSWER} {ctx.index}" + ("!" * 300 if ctx.index < @LONG_BELOW@ else "")
"""


def write(project: Project, *, prompt: str = "[[pass_if_longer:400]]", long_below: int = 5) -> None:
    """The experiment: items q0 … q{long_below - 1} get a long answer, the others "yes N"."""
    text = EXPERIMENT.replace("@PROMPT@", prompt).replace("@LONG_BELOW@", str(long_below))
    project.write("experiments/qa.cobalt.py", text)


def calibrate(cobalt_cli, project: Project, *args: str) -> dict:
    done = cobalt_cli(project, "calibrate", *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def run(cobalt_cli, project: Project) -> str:
    done = cobalt_cli(project, "run", "--quiet")
    return run_id_of(done)


def label(cobalt_cli, project: Project, run_id: str) -> None:
    """ana labels q0–q9 for every judge: q0–q4 pass, q5–q9 fail."""
    rows = [
        {
            "run": run_id,
            "itemKey": f"q{i}",
            "evaluator": name,
            "verdict": "pass" if i < 5 else "fail",
            "note": f"note {i}",
        }
        for i in range(10)
        for name in ("strict", "moody", "longer", "first")
    ]
    project.write_jsonl("labels.jsonl", rows)
    imported = cobalt_cli(project, "labels", "import", "labels.jsonl", "--reviewer", "ana")
    assert imported.returncode == 0, imported.stderr


def test_calibrate_lists_the_disagreements_and_a_rejudge_of_the_labelled_items_moves_kappa(
    project: Project, cobalt_cli, fake_provider_server
):
    write(project, prompt="[[pass_if_longer:100000]]")  # fails everything: q0–q4 disagree
    run_id = run(cobalt_cli, project)

    unlabelled = cobalt_cli(project, "calibrate", "strict")
    assert unlabelled.returncode == 2
    assert f"no labels of 'strict' on run {run_id}" in unlabelled.stderr
    assert "review page" in unlabelled.stderr and "cobalt labels import" in unlabelled.stderr
    unknown = cobalt_cli(project, "calibrate", "nope")
    assert unknown.returncode != 0
    assert "known judges: chatty, first, longer, moody, strict" in unknown.stderr

    label(cobalt_cli, project, run_id)
    report = calibrate(cobalt_cli, project, "strict", "--run", run_id[:6])
    assert report["run"] == run_id and report["labels"] == 10
    assert report["agreement"]["confusion"] == {"tp": 0, "fn": 5, "fp": 0, "tn": 5}
    first = report["disagreements"][0]
    assert [row["itemKey"] for row in report["disagreements"]] == [f"q{i}" for i in range(5)]
    assert first["input"] == "question 0" and first["output"].startswith("yes 0!!!")
    assert (first["judgeVerdict"], first["judgeScore"], first["label"]) == ("fail", 0.0, "pass")
    assert first["judgeReason"] == "fake judge: longer passes"
    assert (first["reviewer"], first["note"]) == ("ana", "note 0")
    shown = cobalt_cli(project, "calibrate", "strict")
    assert "Disagreements (5)" in shown.stdout
    assert f"cobalt rejudge {run_id} --evaluator strict --labelled" in shown.stdout

    write(project, prompt="[[pass_if_longer:400]]")  # the fixed prompt: long answers pass
    fake_provider_server.reset()
    rejudged = cobalt_cli(project, "rejudge", run_id, "--evaluator", "strict", "--labelled")
    assert rejudged.returncode == 0, rejudged.stderr
    new_run = rejudged.stdout.split("new run")[1].split()[0]
    asked = [r for r in fake_provider_server.requests if "Grade: " in json.dumps(r["json"])]
    assert len(asked) == 10  # the labelled items only, not q10 and q11
    after = calibrate(cobalt_cli, project, "strict", "--run", new_run)
    assert after["agreement"]["confusion"] == {"tp": 5, "fn": 0, "fp": 0, "tn": 5}
    assert after["agreement"]["kappa"] == pytest.approx(1.0)
    assert report["agreement"]["kappa"] < after["agreement"]["kappa"]
    assert after["disagreements"] == []


def test_probes_report_how_far_verdicts_move_with_counts(project: Project, cobalt_cli):
    write(project)  # strict passes long text: q0–q4 pass, padding makes q5–q9 pass too
    run_id = run(cobalt_cli, project)
    label(cobalt_cli, project, run_id)

    probes = {p["probe"]: p for p in calibrate(cobalt_cli, project, "strict", "--probes")["probes"]}
    assert (probes["verbosity"]["n"], probes["verbosity"]["flips"]) == (10, 5)
    assert (probes["verbosity"]["toPass"], probes["verbosity"]["toFail"]) == (5, 0)
    assert probes["self-consistency"]["flips"] == 0
    moody = {p["probe"]: p for p in calibrate(cobalt_cli, project, "moody", "--probes")["probes"]}
    assert (moody["self-consistency"]["n"], moody["self-consistency"]["flips"]) == (10, 10)
    biased = {p["probe"]: p for p in calibrate(cobalt_cli, project, "first", "--probes")["probes"]}
    assert (biased["position"]["n"], biased["position"]["flips"]) == (10, 10)
    assert biased["verbosity"]["flips"] == 0
    longer = {p["probe"]: p for p in calibrate(cobalt_cli, project, "longer", "--probes")["probes"]}
    assert longer["position"]["flips"] == 0 and longer["self-consistency"]["flips"] == 0
    assert longer["verbosity"]["flips"] == 10  # it prefers the padded copy: verbosity bias

    text = cobalt_cli(project, "calibrate", "first", "--probes").stdout
    assert "position          orders disagreed on 10/10 (100%)" in text
    text = cobalt_cli(project, "calibrate", "strict", "--probes").stdout
    assert "verbosity         verdict changed on 5/10 (50%): 5 toward pass, 0 toward fail" in text


def test_compare_with_a_pairwise_judge_gives_the_win_rate_of_b(project: Project, cobalt_cli):
    write(project, long_below=0)
    run_a = run(cobalt_cli, project)
    write(project, long_below=6)  # B answers q0–q5 at length, the rest as A did
    run_b = run(cobalt_cli, project)

    done = cobalt_cli(project, "compare", run_a, run_b, "--pairwise", "longer")
    assert done.returncode == 0, done.stderr
    assert "B wins 6, ties 6 (6 where the orders disagreed), A wins 0" in done.stdout
    assert "win rate of B 0.75 (95%" in done.stdout and "ties count as half a win" in done.stdout
    biased = cobalt_cli(project, "compare", run_a, run_b, "--pairwise", "first")
    assert "B wins 0, ties 12 (12 where the orders disagreed), A wins 0" in biased.stdout

    prose = cobalt_cli(project, "compare", run_a, run_b, "--pairwise", "chatty")
    assert prose.returncode == 1
    assert "12 pairs could not be judged" in prose.stdout
    assert "the pairwise judge 'chatty' did not answer JSON" in prose.stdout
    not_pairwise = cobalt_cli(project, "compare", run_a, run_b, "--pairwise", "strict")
    assert not_pairwise.returncode == 2
    assert "'strict' is of type 'llm-judge', not a pairwise judge" in not_pairwise.stderr
    unknown = cobalt_cli(project, "compare", run_a, run_b, "--pairwise", "nope")
    assert "pairwise judges there: chatty, first, longer" in unknown.stderr
