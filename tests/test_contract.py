"""The original's contract (issue 21): what users of the TypeScript Cobalt rely on, through the
public surface (the `cobalt` command, `python file.cobalt.py`, the SDK and the results file)
and the fake provider reached through the SDKs' base URL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Project, cli_env


def results(project: Project) -> dict:
    (path,) = project.results_files()
    return json.loads(path.read_text())


def run_directly(project: Project, relative: str, fake_provider, **extra: str):
    """`python experiments/x.cobalt.py` from the project folder, keys pointing at the fake."""
    env = {
        "OPENAI_BASE_URL": fake_provider.openai_base_url,
        "ANTHROPIC_BASE_URL": fake_provider.anthropic_base_url,
        "OPENAI_API_KEY": "sk-test-openai-SECRET-0001",
        "ANTHROPIC_API_KEY": "sk-ant-test-SECRET-0002",
        **extra,
    }
    return subprocess.run(
        [sys.executable, relative],
        cwd=project.path,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=120,
    )


# ---------------------------------------------------------------- 1. plugins, run directly

PLUGIN = """
from cobalt_app.evaluators import EvalOutcome, register


@register("my-plugin-type", options=["keyword"])
async def keyword(evaluator, target, env):
    hit = evaluator.options["keyword"] in str(target.output)
    return EvalOutcome(evaluator.name, float(hit), reason="from the plugin")
"""


def test_plugins_of_the_config_work_when_the_file_is_run_directly(project, fake_provider):
    project.write("plugins/mine.py", PLUGIN)
    project.write("cobalt.toml", 'test_dir = "experiments"\nplugins = ["plugins/mine.py"]\n')
    project.write(
        "experiments/x.cobalt.py",
        """
        from cobalt import Dataset, Evaluator, experiment

        experiment(
            "plugged",
            Dataset([{"id": "a", "input": "Paris"}]),
            lambda ctx: ctx.item["input"],
            evaluators=[Evaluator(name="kw", type="my-plugin-type", keyword="Paris")],
        )
        """,
    )
    result = run_directly(project, "experiments/x.cobalt.py", fake_provider)
    assert result.returncode == 0, result.stderr
    (item,) = results(project)["items"]
    assert item["evaluations"]["kw"] == {
        "score": 1.0,
        "verdict": "pass",
        "reason": "from the plugin",
    }


# ---------------------------------------------------------------- 2. reasoning models

JUDGES = """
from cobalt import Dataset, Evaluator, experiment

experiment(
    "judged",
    Dataset([{"id": "a", "input": "2+2?"}]),
    lambda ctx: "4",
    evaluators=[
        Evaluator(name=model, prompt="{{output}} [[score:0.9]]", model=model)
        for model in ("gpt-4o-mini", "gpt-5-mini", "o3", "o4-mini-2025-04-16")
    ],
)
"""


def test_no_temperature_is_sent_to_reasoning_models(project, cobalt_cli, fake_provider_server):
    fake_provider_server.reset()
    project.write("experiments/judged.cobalt.py", JUDGES)
    result = cobalt_cli(project, "run", "--no-cache")
    assert result.returncode == 0, result.stderr
    sent = {
        r["json"]["model"]: r["json"]
        for r in fake_provider_server.requests
        if r["path"] == "/v1/chat/completions"
    }
    assert set(sent) == {"gpt-4o-mini", "gpt-5-mini", "o3", "o4-mini-2025-04-16"}
    assert sent["gpt-4o-mini"]["temperature"] == 0
    for model in ("gpt-5-mini", "o3", "o4-mini-2025-04-16"):
        assert "temperature" not in sent[model], model
    scores = results(project)["items"][0]["evaluations"]
    assert {name: e["score"] for name, e in scores.items()} == dict.fromkeys(sent, 0.9)


# ---------------------------------------------------------------- 3. provider messages


def test_the_providers_message_is_kept_in_judge_and_similarity_errors(
    project, cobalt_cli, fake_provider_server
):
    fake_provider_server.reset()
    message = (
        "The model `gpt-4o-minii` does not exist or you do not have access to it. "
        "Key used: sk-test-openai-SECRET-0001"
    )
    fake_provider_server.fail_next(2, status=400, retry_after=None, message=message)
    project.write(
        "experiments/x.cobalt.py",
        """
        from cobalt import Dataset, Evaluator, experiment

        experiment(
            "errors",
            Dataset([{"id": "a", "input": "q", "expected_output": "4"}]),
            lambda ctx: "4",
            evaluators=[Evaluator(name="judge", prompt="{{output}}", model="gpt-4o-minii")],
            concurrency=1,
        )
        experiment(
            "errors-sim",
            Dataset([{"id": "a", "input": "q", "expected_output": "4"}]),
            lambda ctx: "4",
            evaluators=[Evaluator(name="sim", type="similarity")],
        )
        """,
    )
    result = cobalt_cli(project, "run", "--no-cache")
    assert result.returncode == 0, result.stderr
    errors = {}
    for path in project.results_files():
        data = json.loads(path.read_text())
        errors.update({n: e["error"] for n, e in data["items"][0]["evaluations"].items()})
    expected = (
        "openai: HTTP 400 (BadRequestError): The model `gpt-4o-minii` does not exist or you do "
        "not have access to it. Key used: ***."
    )
    assert errors == {"judge": expected, "sim": expected}
    assert "SECRET" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("model", "reasoning"),
    [("gpt-5", True), ("o1-preview", True), ("gpt-4o", False), ("omni-x", False)],
)
def test_reasoning_models_are_told_apart_by_name(model, reasoning):
    from cobalt_app.providers import chat_params

    sent = chat_params("openai", model, {"temperature": 0})
    assert ("temperature" not in sent) is reasoning
    assert chat_params("anthropic", model, {"temperature": 0}) == {"temperature": 0}


# ---------------------------------------------------------------- 4. the runner's TimeoutError

TIMEOUTS = """
import asyncio

from cobalt import Dataset, Evaluator, experiment


async def runner(ctx):
    if ctx.item["id"] == "own":
        raise TimeoutError("the upstream API gave up")
    await asyncio.sleep(60)


experiment(
    "timeouts",
    Dataset([{"id": "own"}, {"id": "slow"}]),
    runner,
    evaluators=[Evaluator(name="any", type="function", fn=lambda ctx: 1.0)],
    timeout=0.5,
)
"""


def test_a_timeout_error_raised_by_the_agent_is_an_error_with_its_traceback(project, cobalt_cli):
    project.write("experiments/t.cobalt.py", TIMEOUTS)
    result = cobalt_cli(project, "run", "--ci", "--junit", "junit.xml")
    assert result.returncode == 1, result.stderr
    items = {i["key"]: i for i in results(project)["items"]}
    assert items["own"]["status"] == "error"
    assert items["own"]["error"] == "TimeoutError: the upstream API gave up"
    assert items["slow"]["status"] == "timeout"
    assert items["slow"]["error"] == "timed out after 0.5s (its code was stopped)"
    junit = (project.path / "junit.xml").read_text()
    assert "Traceback (most recent call last)" in junit
    assert 'raise TimeoutError("the upstream API gave up")' in junit


# ---------------------------------------------------------------- 6. placeholders

PLACEHOLDERS = """
from cobalt import Dataset, Evaluator, experiment

ITEM = {
    "id": "a",
    "input": "q",
    "tags": ["geo", "easy"],
    "items": [{"name": "Paris"}],
    "ctx": {"docs": [{"title": "T0"}, {"title": "T1"}]},
}
experiment(
    "placeholders",
    Dataset([ITEM]),
    lambda ctx: "answer",
    evaluators=[
        Evaluator(
            name="rendered",
            prompt="[{{tags[0]}}|{{ items[0].name }}|{{ctx.docs[1].title}}|{{tags.1}}]",
        ),
        Evaluator(name="unparsable", prompt="{{output}} {{tags[first]}}"),
        Evaluator(name="missing", prompt="{{output}} {{items[3].name}}"),
    ],
)
"""


def test_bracket_paths_are_rendered_and_bad_placeholders_never_reach_the_judge(
    project, cobalt_cli, fake_provider_server
):
    fake_provider_server.reset()
    project.write("experiments/p.cobalt.py", PLACEHOLDERS)
    result = cobalt_cli(project, "run", "--no-cache")
    assert result.returncode == 0, result.stderr
    (request,) = fake_provider_server.requests  # only the judge whose prompt rendered
    assert "[geo|Paris|T1|easy]" in request["json"]["messages"][-1]["content"]
    evaluations = results(project)["items"][0]["evaluations"]
    assert evaluations["rendered"]["score"] == 1.0
    assert evaluations["unparsable"] == {
        "score": None,
        "verdict": "error",
        "error": "the prompt's placeholder {{tags[first]}} is not a field path; write "
        "{{field}}, {{field.key}} or {{field[0]}} (e.g. {{items[0].name}})",
    }
    assert evaluations["missing"]["error"].startswith(
        "the prompt uses {{items[3].name}} but the item has no such field"
    )


# ---------------------------------------------------------------- 7. empty datasets


def test_a_run_with_no_items_is_refused_naming_the_dataset(project, cobalt_cli):
    project.write("datasets/empty.jsonl", "")
    project.write(
        "experiments/e.cobalt.py",
        """
        from cobalt import Dataset, Evaluator, experiment

        experiment(
            "nothing",
            Dataset.from_file("datasets/empty.jsonl"),
            lambda ctx: "x",
            evaluators=[Evaluator(name="any", type="function", fn=lambda ctx: 1.0)],
        )
        """,
    )
    result = cobalt_cli(project, "run")
    assert result.returncode == 2
    assert (
        "experiment 'nothing' (experiments/e.cobalt.py:3) cannot start:\n"
        "  Dataset is empty in datasets/empty.jsonl: the dataset 'empty' has no items, so there "
        "is nothing to run"
    ) in result.stderr
    ci = cobalt_cli(project, "run", "--ci")
    assert ci.returncode == 2
    assert (
        "✗ experiment 'nothing' (experiments/e.cobalt.py:3): Dataset is empty in "
        "datasets/empty.jsonl: the dataset 'empty' has no items"
    ) in ci.stdout
    assert "Dataset:" not in result.stdout + ci.stdout and project.results_files() == []


# ---------------------------------------------------------------- 10. ctx.dataset, on_progress

PROGRESS = """
import asyncio
import json

from cobalt import Dataset, Evaluator, experiment

DATASET = Dataset([{"id": str(i), "input": i} for i in range(4)])
calls = {"sync": [], "async": [], "raising": 0}


def sync_progress(done, total):
    calls["sync"].append([done, total])


async def async_progress(done, total):
    await asyncio.sleep(0)
    calls["async"].append([done, total])


def raising_progress(done, total):
    calls["raising"] += 1
    raise RuntimeError("the progress bar broke")


def runner(ctx):
    assert ctx.dataset is DATASET
    return f"{ctx.index + 1} of {len(ctx.dataset)}: first is {ctx.dataset.items[0]['id']}"


for name, callback in [("sync", sync_progress), ("async", async_progress), ("raising", raising_progress)]:
    report = experiment(
        name,
        DATASET,
        runner,
        evaluators=[Evaluator(name="any", type="function", fn=lambda ctx: 1.0)],
        concurrency=2,
        on_progress=callback,
    )
    assert report.to_dict()["items"][3]["output"]["output"] == "4 of 4: first is 0"
print("CALLS=" + json.dumps(calls))
"""


def test_runners_see_the_dataset_and_on_progress_is_called_as_items_finish(project, fake_provider):
    project.write("experiments/progress.cobalt.py", PROGRESS)
    result = run_directly(project, "experiments/progress.cobalt.py", fake_provider)
    assert result.returncode == 0, result.stderr
    calls = json.loads(result.stdout.split("CALLS=")[1])
    assert calls["sync"] == [[n, 4] for n in range(1, 5)]
    assert calls["async"] == [[n, 4] for n in range(1, 5)]
    assert calls["raising"] == 4  # called for every item although it raised
    assert result.stderr.count("on_progress of experiment 'raising' raised") == 1
    assert "RuntimeError: the progress bar broke" in result.stderr
    assert len(project.results_files()) == 3  # the raising callback stopped nothing


def test_on_progress_must_be_a_function():
    from cobalt import Dataset, experiment
    from cobalt.experiments import collecting

    with collecting(), pytest.raises(TypeError, match="`on_progress` must be a function"):
        experiment("p", Dataset([{"input": 1}]), lambda ctx: 1, on_progress="print")


# ---------------------------------------------------------------- 5. unpriced models

UNPRICED = """
from cobalt import Dataset, Evaluator, experiment

experiment(
    "priced",
    Dataset([{"id": "a", "input": "q"}, {"id": "b", "input": "r"}]),
    lambda ctx: {
        "output": "answer",
        "metadata": {"model": MODEL, "usage": {"prompt_tokens": 1000, "completion_tokens": 500}},
    },
    evaluators=[Evaluator(name="judge", prompt="{{output}} [[score:0.9]]", model=JUDGE)],
    thresholds={"cost": {"total": 1.0}},
)
"""


def unpriced_file(model: str, judge: str) -> str:
    return f"MODEL, JUDGE = {model!r}, {judge!r}\n" + UNPRICED


def test_gpt_4_is_priced(project, cobalt_cli):
    project.write("experiments/u.cobalt.py", unpriced_file("gpt-4", "gpt-4o-mini"))
    result = cobalt_cli(project, "run", "--ci", "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = results(project)["summary"]
    assert summary["agentCost"] == pytest.approx(2 * (1000 * 30 + 500 * 60) / 1e6)
    assert (summary["unpricedModels"], summary["costComplete"]) == ([], True)


def test_unpriced_models_are_named_and_a_cost_gate_on_them_is_a_configuration_error(
    project, cobalt_cli
):
    project.write("experiments/u.cobalt.py", unpriced_file("acme-llm-2", "judge-9000"))
    job_summary = project.path / "job-summary.md"
    github = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(job_summary)}
    result = cobalt_cli(project, "run", "--ci", "--no-cache", env=github)
    assert result.returncode == 2, result.stdout + result.stderr
    cost = f"cost ${results(project)['summary']['estimatedCost']:.4f} + unpriced: acme-llm-2, "
    assert cost + "judge-9000\n" in job_summary.read_text()
    assert (
        "experiment 'priced' has a cost threshold, but acme-llm-2, judge-9000 spent tokens and "
        "have no price, so the cost is unknown. Add prices (USD per million input and output "
        'tokens) under [prices] in cobalt.toml, e.g. "acme-llm-2" = [2.5, 10]'
    ) in result.stdout
    document = results(project)
    summary = document["summary"]
    assert summary["unpricedModels"] == ["acme-llm-2", "judge-9000"]
    assert summary["costComplete"] is False
    assert document["items"][0]["evaluations"]["judge"]["unpricedModel"] == "judge-9000"

    plain = cobalt_cli(project, "run", "--no-cache")
    assert (
        "⚠ unpriced: acme-llm-2, judge-9000 spent tokens and have no price, counted as $0 "
        "(add prices under [prices] in cobalt.toml)"
    ) in plain.stdout

    # Prices in the configuration make the run priced again.
    project.write(
        "cobalt.toml",
        'test_dir = "experiments"\n[prices]\n"acme-llm-2" = [1.0, 2.0]\n'
        '"judge-9000" = {input = 0.5, output = 1.5}\n',
    )
    for old in project.results_files():
        old.unlink()
    priced = cobalt_cli(project, "run", "--ci", "--no-cache")
    assert priced.returncode == 0, priced.stdout + priced.stderr
    summary = results(project)["summary"]
    assert summary["agentCost"] == pytest.approx(2 * (1000 * 1.0 + 500 * 2.0) / 1e6)
    assert summary["judgeCost"] > 0 and summary["unpricedModels"] == []


def test_every_door_words_the_cost_of_unpriced_and_nameless_tokens_alike():
    from cobalt.usage_notes import NO_MODEL, cost_line

    nameless = {"estimatedCost": 0.0, "unpricedModels": [NO_MODEL]}
    assert cost_line(nameless) == "$0.0000 + unknown (no model named)"
    both = {"estimatedCost": 0.5, "unpricedModels": ["acme-llm-2", NO_MODEL]}
    assert cost_line(both) == "$0.5000 + unpriced: acme-llm-2 + unknown (no model named)"
    unknown_usage = {"estimatedUsage": [{"model": "m", "calls": 1, "method": "unknown"}]}
    assert cost_line({**unknown_usage, "unpricedModels": []}) == "unknown"


def test_a_malformed_price_names_the_key(project, cobalt_cli):
    project.write("cobalt.toml", 'test_dir = "experiments"\n[prices]\n"m" = [1.0]\n')
    project.write("experiments/u.cobalt.py", unpriced_file("m", "gpt-4o-mini"))
    result = cobalt_cli(project, "run")
    assert result.returncode == 2
    assert "`prices.m` must be [input, output] or {input = ..., output = ...}" in (
        result.stdout + result.stderr
    )


# ---------------------------------------------------------------- 8. the original's evaluator forms

DICTS = """
from cobalt import Dataset, experiment


def upper_topic(ctx):
    return {"topic": ctx.item["meta"]["topic"].upper()}


experiment(
    "dicts",
    Dataset([{"id": "a", "input": "2+2?", "expected_output": "4", "meta": {"topic": "math"}}]),
    lambda ctx: "4",
    evaluators=[
        {"name": "exact", "type": "exact-match", "caseSensitive": False},
        {
            "name": "fn",
            "type": "function",
            "fn": lambda ctx: {"score": 1.0, "reason": f"topic {ctx.context['topic']}"},
            "context": upper_topic,
        },
        {
            "name": "judge",
            "prompt": "Topic {{topic}}, question {{q}}: {{output}} [[score:0.7]]",
            "context": {"q": "input", "topic": "meta.topic"},
        },
        {"name": "broken", "type": "function", "fn": lambda ctx: 1.0, "context": 42},
    ],
)
"""


def test_dict_evaluators_and_context_mappers_of_the_original_work(
    project, cobalt_cli, fake_provider_server
):
    fake_provider_server.reset()
    project.write("experiments/d.cobalt.py", DICTS)
    result = cobalt_cli(project, "run", "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr
    evaluations = results(project)["items"][0]["evaluations"]
    assert evaluations["exact"]["score"] == 1.0
    assert evaluations["fn"] == {"score": 1.0, "verdict": "pass", "reason": "topic MATH"}
    assert evaluations["judge"]["score"] == 0.7
    (request,) = fake_provider_server.requests
    assert "Topic math, question 2+2?: 4" in request["json"]["messages"][-1]["content"]
    assert evaluations["broken"]["error"].startswith(
        "`context` must be a function of the item, output and metadata (an EvalContext, also "
        "a mapping) that returns a dict of extra variables or the whole context changed "
        '({**ctx, "item": {...}}), or a dict of variable → field path'
    )


@pytest.mark.parametrize(
    ("evaluators", "message"),
    [
        ('["exact"]', 'evaluators[0] is a str; pass Evaluator(name="...", ...) or a dict'),
        ('[{"type": "exact-match"}]', "evaluators[0]: a dict evaluator needs a non-empty 'name'"),
        ('{"name": "x"}', "`evaluators` must be a list of Evaluator(...) or of dicts"),
        (
            '[{"name": "j", "type": "exact-match", "caseSensitve": True}]',
            "experiments/bad.cobalt.py:2: evaluator 'j': the exact-match evaluator has no option "
            "`case_sensitve=`. Did you mean `case_sensitive=`?",
        ),
    ],
)
def test_evaluators_of_another_form_say_what_to_pass(project, cobalt_cli, evaluators, message):
    project.write(
        "experiments/bad.cobalt.py",
        "from cobalt import Dataset, experiment\n"
        f'experiment("bad", Dataset([{{"input": 1}}]), lambda ctx: 1, evaluators={evaluators})\n',
    )
    result = cobalt_cli(project, "run")
    assert result.returncode == 2
    assert message in result.stderr


COT_REPLY = (
    '[[reply:{"reasoning": "The answer is 4; 2+2 is 4.", "score": 0.8, "reason": "correct"}]]'
)


@pytest.mark.django_db(transaction=True)
def test_the_judges_chain_of_thought_is_kept_beside_the_reason(project, fake_provider, client):
    from cobalt import Dataset, Evaluator
    from cobalt_app.models import Evaluation
    from tests.helpers import define, execute

    evaluator = Evaluator(name="cot", prompt="{{output}} " + COT_REPLY, chain_of_thought=True)
    for attempt in range(2):  # the second run is answered from the judge cache
        definition = define(
            "cot",
            Dataset([{"id": "a", "input": "2+2?"}]),
            lambda ctx: "4",
            evaluators=[evaluator],
        )
        (run,) = execute(project, definition)
        document = json.loads(Path(run.results_path).read_text())
        entry = document["items"][0]["evaluations"]["cot"]
        assert (entry["score"], entry["reason"]) == (0.8, "correct")
        assert entry["chainOfThought"] == "The answer is 4; 2+2 is 4."
        assert entry.get("cached", False) is (attempt == 1)
    assert fake_provider.request_count() == 1
    item = Evaluation.objects.filter(run=run).get().item
    page = client.get(f"/runs/{run.id}/items/{item.number}/").content.decode()
    assert "Chain of thought" in page and "The answer is 4; 2+2 is 4." in page


TWICE = """
from cobalt_app.evaluators import EvalOutcome, register


@register("twice")
async def first(evaluator, target, env):
    return EvalOutcome(evaluator.name, 0.0)


@register("twice")
async def second(evaluator, target, env):
    return EvalOutcome(evaluator.name, 1.0, reason="the second")
"""


def test_a_type_registered_twice_is_a_warning_and_an_empty_type_name_an_error(project, cobalt_cli):
    project.write("plugins/twice.py", TWICE)
    project.write("cobalt.toml", 'test_dir = "experiments"\nplugins = ["plugins/twice.py"]\n')
    project.write(
        "experiments/t.cobalt.py",
        "from cobalt import Dataset, Evaluator, experiment\n"
        'experiment("t", Dataset([{"input": 1}]), lambda ctx: 1, '
        'evaluators=[Evaluator(name="t", type="twice")])\n',
    )
    result = cobalt_cli(project, "run")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("evaluator type 'twice' is registered twice") == 1
    assert "first, then cobalt_plugins.twice_" in result.stderr
    assert results(project)["items"][0]["evaluations"]["t"]["reason"] == "the second"

    project.write("plugins/twice.py", TWICE.replace('register("twice")', 'register("")'))
    result = cobalt_cli(project, "run")
    assert result.returncode == 2
    assert (
        "plugin 'plugins/twice.py' failed to load: ValueError: register() needs the type's name, "
        "a non-empty string (got '')"
    ) in result.stderr


def test_an_unpriced_embedding_model_is_named_too(project, cobalt_cli):
    project.write(
        "experiments/s.cobalt.py",
        """
        from cobalt import Dataset, Evaluator, experiment

        experiment(
            "embedded",
            Dataset([{"id": "a", "input": "q", "expected_output": "Paris is big"}]),
            lambda ctx: "Paris is big",
            evaluators=[
                Evaluator(name="sim", type="similarity", model="acme-embed"),
                Evaluator(name="std", type="similarity"),
            ],
        )
        """,
    )
    result = cobalt_cli(project, "run", "--no-cache")
    assert result.returncode == 0, result.stderr
    document = results(project)
    assert document["summary"]["unpricedModels"] == ["acme-embed"]
    evaluations = document["items"][0]["evaluations"]
    assert evaluations["sim"]["unpricedModel"] == "acme-embed"
    assert "unpricedModel" not in evaluations["std"]


@pytest.mark.django_db(transaction=True)
def test_the_run_page_names_the_unpriced_models(project, client):
    from cobalt import Dataset, Evaluator
    from tests.helpers import define, execute

    definition = define(
        "page",
        Dataset([{"id": "a", "input": "q"}]),
        lambda ctx: {"output": "x", "metadata": {"model": "acme-llm-2", "tokens": 30}},
        evaluators=[Evaluator(name="f", type="function", fn=lambda ctx: 1.0)],
    )
    (run,) = execute(project, definition)
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert "+ unpriced: acme-llm-2" in page


@pytest.mark.django_db(transaction=True)
def test_tokens_that_named_no_model_are_a_warning_saying_how_to_price_them(project, client):
    from rich.console import Console

    from cobalt import Dataset, Evaluator
    from cobalt_cli.reporter import print_summary
    from tests.helpers import define, execute

    definition = define(
        "nameless",
        Dataset([{"id": "a", "input": "q"}]),
        lambda ctx: {"output": "x", "metadata": {"tokens": 30}},  # no model named
        evaluators=[Evaluator(name="f", type="function", fn=lambda ctx: 1.0)],
    )
    (run,) = execute(project, definition)
    assert run.summary["unpricedModels"] == ["(no model named)"]
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert "unpriced: (no model named)" not in page and 'class="bad unpriced"' not in page
    assert '<span class="warn-text no-model" title="a model call named no model' in page
    assert (
        '<p class="notice no-model" role="status">A model call named no model: its tokens count, '
        "but its cost is unknown (counted as $0). Name its model to price it: "
        "`gen_ai.request.model` on a service&#x27;s span, `model` in the runner&#x27;s "
        "metadata.</p>"
    ) in page
    console = Console(record=True, width=300)
    print_summary(console, run)
    said = console.export_text()
    assert "unpriced:" not in said
    assert "(estimated cost: $0.0000 + unknown (no model named); agent 30," in said
    assert "⚠ a model call named no model: its tokens count, but its cost is unknown" in said


@pytest.mark.parametrize(
    ("model", "price"),
    [
        ("gpt-4", (30.0, 60.0)),
        ("gpt-4-0613", (30.0, 60.0)),
        ("gpt-4o-2024-08-06", (2.5, 10.0)),
        ("claude-sonnet-4-5-20250929", (3.0, 15.0)),
        ("claude-haiku-4-5-20251001", (1.0, 5.0)),
        ("claude-opus-4-6", (5.0, 25.0)),
        ("claude-3-5-haiku-20241022", (0.8, 4.0)),
        ("claude-3-5-sonnet-v2@20241022", (3.0, 15.0)),
        ("us.anthropic.claude-3-5-sonnet-20240620-v1:0", (3.0, 15.0)),
        ("openai/gpt-4o-mini", (0.15, 0.6)),
        ("gpt-4.7", None),  # not a snapshot of gpt-4: unpriced, never gpt-4's price
        ("gpt-4o-audio-preview", None),
        ("my.gpt-4o", None),
    ],
)
def test_models_are_priced_by_name_and_snapshot_only(model, price):
    from cobalt_app.pricing import price_of

    assert price_of(model) == price


def test_the_report_of_a_direct_run_names_its_unpriced_models(project, fake_provider):
    project.write(
        "experiments/r.cobalt.py",
        """
        from cobalt import Dataset, Evaluator, experiment

        report = experiment(
            "report",
            Dataset([{"id": "a", "input": "q"}]),
            lambda ctx: {"output": "x", "metadata": {"model": "acme-llm-2", "tokens": 30}},
            evaluators=[Evaluator(name="f", type="function", fn=lambda ctx: 1.0)],
        )
        print("UNPRICED=" + ",".join(report.unpriced_models), report.estimated_cost)
        """,
    )
    result = run_directly(project, "experiments/r.cobalt.py", fake_provider)
    assert result.returncode == 0, result.stderr
    assert "UNPRICED=acme-llm-2 0.0" in result.stdout
