"""A judge's calibration against people (cobalt_app/calibration.py), as a user meets it: a real
run whose llm judge answers through the fake provider, labels saved through the real service
(`labels.label_save`), and the run page, the API, the terminal summary, MCP, the results file
and `cobalt run --ci` with `[ci] require_calibrated` showing κ, the bounds, the certificate
and the corrected pass rate."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse

from cobalt import Dataset, Evaluator, experiment
from cobalt.calibration import rogan_gladen
from cobalt.experiments import collecting
from cobalt_app import calibration
from cobalt_app.labels import label_save
from cobalt_app.models import ItemResult, Label, Run
from tests.helpers import execute_one

pytestmark = pytest.mark.django_db(transaction=True)

ITEMS = 200
PROMPT = "Is this answer right? {{output}}"


def judge_score(index: int) -> float:
    """The fake judge's score of item `index` (its output carries it, `[[score:…]]`).

    Items 0–61 are right (people say pass): the judge passes all but 60 and 61. Items 62–79
    are wrong: the judge fails all but 79. Items 80–91 are wrong and the judge fails them;
    the rest pass three times in four."""
    if index in (60, 61) or 62 <= index <= 78 or 80 <= index <= 91:
        return 0.2
    if index >= 92 and index % 4 == 0:
        return 0.3
    return 0.9


def human_verdict(index: int) -> str:
    return "pass" if index < 62 else "fail"


def define(prompt: str = PROMPT):
    items = [{"id": f"q{i}", "input": f"question {i}"} for i in range(ITEMS)]
    with collecting() as found:
        experiment(
            "support",
            Dataset(items=items),
            lambda ctx: f"answer {ctx.index} [[score:{judge_score(ctx.index)}]]",
            evaluators=[Evaluator(name="correct", type="llm-judge", prompt=prompt)],
            concurrency=20,
        )
    return found[0]


def label(run: Run, indexes, reviewer: str = "ana") -> None:
    for index in indexes:
        item = ItemResult.objects.get(run=run, item_index=index)
        label_save(
            run=run,
            item_id=item.id,
            evaluator="correct",
            reviewer=reviewer,
            verdict=human_verdict(index),
        )


@pytest.fixture
def labelled(project, fake_provider) -> Run:
    """A run of 200 items, 80 of them labelled: 62 pass, 18 fail."""
    run = execute_one(project, define())
    label(run, range(80))
    return run


def test_the_certificate_counts_the_fail_labels_still_needed_and_corrects_the_pass_rate(labelled):
    found = calibration.evaluator_calibration(labelled.id, "correct")
    agreement = found.agreement
    assert (agreement.n, agreement.tp, agreement.fn, agreement.fp, agreement.tn) == (
        80,
        60,
        2,
        1,
        17,
    )
    # po = 77/80, pe = (62·61 + 18·19)/80²
    assert agreement.kappa == pytest.approx((77 / 80 - 4124 / 6400) / (1 - 4124 / 6400))
    assert agreement.kappa_low < agreement.kappa < agreement.kappa_high
    assert found.certificate.summary == "not calibrated: 12 more 'fail' labels needed"
    raw = labelled.summary["scores"]["correct"]["passRate"]
    corrected = found.corrected
    assert corrected.raw == pytest.approx(raw)
    assert corrected.value == pytest.approx(rogan_gladen(raw, 60 / 62, 17 / 18))
    assert corrected.low <= corrected.value <= corrected.high
    assert found.excluded == {"olderOutput": 0, "otherJudge": 0, "split": 0, "judgeError": 0}


def test_the_run_page_and_the_api_show_kappa_bounds_certificate_and_corrected_rate(
    labelled, client
):
    page = client.get(reverse("cobalt:run", args=[labelled.id])).content.decode()
    assert 'id="judge-calibration"' in page
    assert "not calibrated: 12 more &#x27;fail&#x27; labels needed" in page
    found = calibration.evaluator_calibration(labelled.id, "correct")
    assert f"{found.agreement.kappa:.2f}" in page and f"{found.agreement.tnr.low:.2f}" in page
    assert f"{round(found.corrected.value * 100)}%" in page
    detail = client.get(f"/api/runs/{labelled.id}/").json()
    entry = detail["calibration"]["correct"]
    assert entry["summary"] == "not calibrated: 12 more 'fail' labels needed"
    assert entry["certificate"]["needed"] == {"pass": 0, "fail": 12}
    assert entry["agreement"]["confusion"] == {"tp": 60, "fn": 2, "fp": 1, "tn": 17}
    assert entry["correctedPassRate"]["value"] == pytest.approx(found.corrected.value)


def test_more_labels_certify_the_judge_and_a_new_prompt_loses_the_certificate(
    labelled, project, fake_provider
):
    label(labelled, range(80, 92))
    assert calibration.evaluator_calibration(labelled.id, "correct").certificate.calibrated
    # The next run with the same judge pools the labels: its outputs are the same.
    again = execute_one(project, define())
    pooled = calibration.evaluator_calibration(again.id, "correct")
    assert pooled.certificate.calibrated and pooled.runs == 2 and pooled.agreement.n == 92
    # A changed prompt is another judge, checked again on the labelled outputs it judged:
    # this one passes everything (the fake judge reads the prompt's own score first).
    changed = execute_one(project, define("Be kind [[score:0.9]]. {{output}}"))
    fresh = calibration.evaluator_calibration(changed.id, "correct")
    assert fresh.judge_key != pooled.judge_key and fresh.runs == 1
    assert not fresh.certificate.calibrated and fresh.agreement.tnr.value == 0
    assert "TNR lower bound 0.00 < 0.80" in fresh.certificate.summary
    assert "improve the judge" in fresh.certificate.summary


def test_labels_on_an_older_output_are_left_out_and_counted(labelled):
    Label.objects.filter(item_key="q0").update(output_hash="0" * 64)
    found = calibration.evaluator_calibration(labelled.id, "correct")
    assert found.agreement.n == 79 and found.excluded["olderOutput"] == 1
    assert "1 on an older output" in found.line()


def test_reviewers_who_disagree_are_shown_and_split_outputs_left_out(labelled):
    for index in range(40):  # ben agrees with ana on 30 of 40, disagrees on 10
        item = ItemResult.objects.get(run=labelled, item_index=index + 40)
        flipped = index % 4 == 0
        verdict = human_verdict(index + 40)
        if flipped:
            verdict = "fail" if verdict == "pass" else "pass"
        label_save(
            run=labelled, item_id=item.id, evaluator="correct", reviewer="ben", verdict=verdict
        )
    found = calibration.evaluator_calibration(labelled.id, "correct")
    assert found.reviewers.method == "cohen_kappa" and found.reviewers.disagreements == 10
    assert found.reviewers.value is not None and found.reviewers.value < 0.8
    assert found.excluded["split"] == 20 and found.agreement.n == 70
    assert "reviewers agree cohen_kappa" in found.line()


def test_a_handful_of_labels_says_not_enough_labels(project, fake_provider):
    run = execute_one(project, define())
    label(run, range(5))
    found = calibration.evaluator_calibration(run.id, "correct")
    assert found.agreement.kappa is None and found.kappa_text == "not enough labels (n=5)"
    assert found.corrected.value is None and found.corrected.state == "not enough labels"


def test_the_results_file_and_the_terminal_summary_carry_the_calibration(labelled, project):
    from io import StringIO

    from rich.console import Console

    from cobalt_app.results import run_results
    from cobalt_cli.reporter import print_summary

    document = run_results(labelled)
    entry = document["calibration"]["correct"]
    assert entry["summary"] == "not calibrated: 12 more 'fail' labels needed"
    assert entry["agreement"]["tnr"]["low"] == pytest.approx(
        calibration.evaluator_calibration(labelled.id, "correct").agreement.tnr.low
    )
    json.dumps(document)  # the file is JSON
    out = StringIO()
    print_summary(Console(file=out, width=200, color_system=None), labelled)
    text = out.getvalue()
    assert "correct: pass rate" in text and "raw, corrected" in text
    assert "not calibrated: 12 more 'fail' labels needed" in text and "κ 0.89" in text


def test_compare_shows_corrected_rates_and_says_a_change_is_within_the_judges_error(
    labelled, project, client
):
    again = execute_one(project, define())
    [judge] = calibration.compare_calibration(labelled, again)
    assert judge.same_judge and judge.delta.value == pytest.approx(0.0)
    assert judge.delta.low < 0 < judge.delta.high and judge.verdict == "within the judge's error"
    page = client.get(reverse("cobalt:compare"), {"a": labelled.id, "b": again.id})
    text = page.content.decode()
    assert 'id="judge-deltas"' in text and "within the judge&#x27;s error" in text
    assert "not calibrated: 12 more &#x27;fail&#x27; labels needed" in text


CI_EXPERIMENT = """
from cobalt import Dataset, Evaluator, experiment

def score(index):
    if index in (60, 61) or 62 <= index <= 78 or 80 <= index <= 91:
        return 0.2
    return 0.3 if index >= 92 and index % 4 == 0 else 0.9

experiment(
    "support",
    Dataset(items=[{"id": f"q{i}", "input": f"question {i}"} for i in range(200)]),
    lambda ctx: f"answer {ctx.index} [[score:{score(ctx.index)}]]",
    evaluators=[Evaluator(name="correct", type="llm-judge", prompt="Right? {{output}}")],
    concurrency=20,
)
"""


def write_labels(project, run_id: str, indexes) -> None:
    lines = [
        json.dumps(
            {
                "run": run_id,
                "itemKey": f"q{i}",
                "evaluator": "correct",
                "reviewer": "ana",
                "verdict": human_verdict(i),
            }
        )
        for i in indexes
    ]
    project.write("labels.jsonl", "\n".join(lines) + "\n")


def test_ci_refuses_to_gate_on_an_uncalibrated_judge_until_labels_are_added(
    project, cobalt_cli, fake_provider_server
):
    from tests.test_mcp import run_session, text_of

    project.write("experiments/support.cobalt.py", CI_EXPERIMENT)
    project.write(
        "cobalt.toml",
        """
        test_dir = "experiments"
        [ci]
        require_calibrated = true
        [ci.thresholds.correct]
        pass_rate_corrected = 0.6
        """,
    )
    first = cobalt_cli(project, "run", "--ci", env={"GITHUB_ACTIONS": "false"})
    assert first.returncode == 1, first.stdout + first.stderr
    assert "correct: judge not calibrated" in first.stdout
    assert "not enough labels (n=0)" in first.stdout
    assert "30 more 'pass' labels needed; 30 more 'fail' labels needed" in first.stdout
    run_id = re.search(r"· run (\w+) ·", first.stdout).group(1)
    write_labels(project, run_id, range(80))
    imported = cobalt_cli(project, "labels", "import", "labels.jsonl")
    assert imported.returncode == 0, imported.stdout + imported.stderr
    second = cobalt_cli(project, "run", "--ci", env={"GITHUB_ACTIONS": "false"})
    assert second.returncode == 1
    assert "κ 0.89" in second.stdout and "(n=80)" in second.stdout
    assert "TPR ≥ 0.89, TNR ≥ 0.74" in second.stdout
    assert "not calibrated: 12 more 'fail' labels needed" in second.stdout
    write_labels(project, run_id, range(80, 92))
    assert cobalt_cli(project, "labels", "import", "labels.jsonl").returncode == 0
    third = cobalt_cli(project, "run", "--ci", env={"GITHUB_ACTIONS": "false"})
    assert third.returncode == 0, third.stdout + third.stderr
    assert "judge not calibrated" not in third.stdout
    assert "judge calibration: κ" in third.stdout and "calibrated" in third.stdout
    results = sorted((project.path / ".cobalt" / "results").glob("*.json"))[-1]
    entry = json.loads(results.read_text())["calibration"]["correct"]
    assert entry["calibrated"] and entry["correctedPassRate"]["value"] >= 0.6
    # The MCP run report carries it too, in words and in its structured content.
    seen = {}

    async def scenario(session) -> None:
        seen["run"] = await session.call_tool("cobalt_results", {"runId": run_id})

    run_session(project, fake_provider_server, scenario)
    report = seen["run"]
    assert report.structured_content["calibration"]["correct"]["agreement"]["n"] == 92
    assert "Judge correct (71.0% raw pass rate): κ" in text_of(report)


def test_a_rejudge_with_a_changed_prompt_is_another_judge_checked_on_the_labelled_outputs(
    project, cobalt_cli
):
    project.write("experiments/support.cobalt.py", CI_EXPERIMENT)
    ran = cobalt_cli(project, "run")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    run_id = ran.stdout.split("Run ID:")[1].split()[0]
    write_labels(project, run_id, range(92))
    assert cobalt_cli(project, "labels", "import", "labels.jsonl").returncode == 0
    same = cobalt_cli(project, "rejudge", run_id)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "judge calibration: κ" in same.stdout and "· calibrated" in same.stdout
    # A kinder prompt: the fake judge reads the prompt's own score first and passes everything.
    project.write(
        "experiments/support.cobalt.py",
        CI_EXPERIMENT.replace(
            'prompt="Right? {{output}}"', 'prompt="Kind [[score:0.9]] {{output}}"'
        ),
    )
    kinder = cobalt_cli(project, "rejudge", run_id)
    assert kinder.returncode == 0, kinder.stdout + kinder.stderr
    assert "not calibrated: TNR lower bound 0.00 < 0.80" in kinder.stdout
    assert "pass rate 100.0% raw" in kinder.stdout


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[calibration]\nmin_labels = 0\n", "`calibration.min_labels` must be a whole number"),
        ("[calibration]\nmin_rate = 1.5\n", "`calibration.min_rate` must be a number from 0 to 1"),
        ("[calibration]\nmin_label = 30\n", "min_label"),
        ("[ci]\nrequire_calibrated = 'yes'\n", "`ci.require_calibrated` must be true, false"),
        ("[ci.thresholds.j]\npass_rate_corrected = 2\n", "pass_rate_corrected` must be"),
    ],
)
def test_calibration_settings_are_checked_with_the_key_named(tmp_path, text, message):
    from cobalt.config import ConfigError, load_config

    (tmp_path / "cobalt.toml").write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path)
    assert message in str(caught.value) and "cobalt.toml" in str(caught.value)


def test_the_calibration_settings_are_stored_with_the_run_and_used(project, fake_provider):
    project.write("cobalt.toml", 'test_dir = "experiments"\n[calibration]\nmin_labels = 10\n')
    run = execute_one(project, define())
    assert run.config["calibration"] == {"min_labels": 10, "min_rate": 0.8}
    assert run.config["judgeKeys"]["correct"] == calibration.run_judge_key(run, "correct")
    label(run, range(80))
    found = calibration.evaluator_calibration(run.id, "correct")
    # Enough labels of each class, but 17 of 18 fails leave the TNR's lower bound at 0.74:
    # at that rate, about 7 more fail labels lift it to 0.80.
    assert found.certificate.min_labels == 10 and found.certificate.needed["fail"] == 7
    assert found.certificate.summary == (
        "not calibrated: TNR lower bound 0.74 < 0.80: ~7 more 'fail' labels needed"
    )
