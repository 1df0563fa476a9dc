"""The judge's own call (`judgeCall`) in the results file and in `cobalt export`'s JSON and
JSON Lines, streamed chunk by chunk like the rest and redacted; a run of function
evaluators costs no query for it. A real `cobalt run` against the fake provider."""

from __future__ import annotations

import json

import pytest

from cobalt.results_file import load_results
from cobalt_app import results
from cobalt_app.models import Evaluation, JudgeCall
from tests.test_pages import keys, make_run

KEY = "sk-test-openai-SECRET-0001"  # the fake provider's key (`cobalt_cli`)

EXPERIMENT = """
from cobalt import Dataset, Evaluator, experiment

dataset = Dataset(items=[{"id": f"q{i}", "input": f"question {i}"} for i in range(3)])


@experiment("judged", dataset, evaluators=[
    Evaluator(name="judge", prompt="[[score:0.4]] Is this good? {{output}}"),
    Evaluator(name="short", type="json-valid"),
])
def run(ctx):
    return f"answer to {ctx.item['input']} (key sk-test-openai-SECRET-0001)"
"""


def test_the_results_file_and_the_exports_carry_the_judges_call(project, cobalt_cli):
    project.write("experiments/judged.cobalt.py", EXPERIMENT)
    ran = cobalt_cli(project, "run", "--quiet")
    assert ran.returncode == 0, ran.stderr
    run_id = ran.stdout.split("Run ID:")[1].split()[0]
    (path,) = project.results_files()
    document = load_results(path)
    assert KEY not in path.read_text(encoding="utf-8")
    first = document["items"][0]["evaluations"]
    call = first["judge"]["judgeCall"]
    assert call["model"] == "gpt-4o-mini" and call["system"]
    (turn,) = call["calls"]
    assert turn["prompt"].startswith("[[score:0.4]] Is this good? answer to question 0 (key ***)")
    assert json.loads(turn["reply"])["score"] == 0.4
    assert "judgeCall" not in first["short"]  # a function evaluator calls no judge
    for fmt, name in (("json", "out.json"), ("jsonl", "out.jsonl.gz")):
        done = cobalt_cli(project, "export", run_id, "-f", fmt, "-o", name)
        assert done.returncode == 0, done.stderr
        exported = load_results(project.path / name)
        assert [i["evaluations"]["judge"]["judgeCall"] for i in exported["items"]] == [
            i["evaluations"]["judge"]["judgeCall"] for i in document["items"]
        ]


@pytest.mark.django_db
def test_a_call_is_redacted_again_with_the_secrets_known_when_exported(monkeypatch):
    run = make_run(keys=keys(2), evaluators=("judge",))
    item = run.items.get(item_key="k001")
    Evaluation.objects.filter(item=item).update(tokens=40)
    later = "tok-later-SECRET-7777"
    JudgeCall.objects.create(
        item=item,
        evaluator="judge",
        data={"provider": "openai", "model": "m", "calls": [{"prompt": later, "reply": "{}"}]},
    )
    monkeypatch.setenv("LATER_API_KEY", later)
    text = "".join(results.results_lines(run))
    assert later not in text
    entries = [json.loads(line) for line in text.splitlines()[1:]]
    assert "judgeCall" not in entries[0]["evaluations"]["judge"]
    assert entries[1]["evaluations"]["judge"]["judgeCall"]["calls"][0]["prompt"] == "***"


@pytest.mark.django_db
def test_function_evaluators_cost_no_judge_call_query(django_assert_num_queries):
    run = make_run(keys=keys(5), evaluators=("exact", "judge"))
    # labels, a chunk of items, their evaluations, their traces
    with django_assert_num_queries(4):
        entries = list(results.iter_item_entries(run))
    assert len(entries) == 5 and all(
        "judgeCall" not in e for i in entries for e in i["evaluations"].values()
    )
