"""What the original's users write keeps working: `reporters` in the configuration, `context=`
mappers that return the whole context, plugins that declare no options, and the words of an
empty dataset's message."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from cobalt import Dataset, Evaluator
from cobalt.config import ConfigError, define_config, load_config, terminal_reporter
from cobalt.evaluator import EvalContext
from cobalt_app import evaluators, preflight
from cobalt_app.evaluators import EvalTarget, evaluate, register
from cobalt_app.models import Evaluation
from tests.helpers import define, run_with


def score(evaluator: Evaluator, output, item: dict, metadata: dict | None = None):
    return asyncio.run(evaluate(evaluator, EvalTarget(item, output, metadata or {}, 5.0), None))


@pytest.mark.parametrize(
    ("written", "reporter"),
    [
        ('reporters = ["cli", "json"]', "console"),  # the original's default configuration
        ('reporters = ["json"]', "json"),
        ('reporters = "json"', "json"),
        ('reporters = ["console", "html"]', "console"),
        ("", "console"),
    ],
)
def test_reporters_in_cobalt_toml_choose_the_terminal_reporter(project, written, reporter):
    project.write("cobalt.toml", f'test_dir = "experiments"\n{written}\n')
    assert terminal_reporter(load_config(project.path)) == reporter


def test_define_config_accepts_reporters_and_refuses_an_unknown_one():
    assert define_config(reporters=["cli", "json"])["reporters"] == ["cli", "json"]
    with pytest.raises(ConfigError, match="`reporters` must be a list of: console"):
        define_config(reporters=["cli", "junit"])


def test_a_run_without_reporter_uses_the_configured_one_and_fails_when_nothing_ran(
    project, cobalt_cli
):
    project.write("cobalt.toml", 'test_dir = "experiments"\nreporters = ["json"]\n')
    project.write(
        "experiments/broken.cobalt.py",
        "from cobalt import Dataset, Evaluator, experiment\n\n"
        "def agent(ctx):\n    raise RuntimeError('the agent is down')\n\n"
        "experiment('down', Dataset(items=[{'input': 'a'}, {'input': 'b'}]), agent,\n"
        "           evaluators=[Evaluator(name='any', type='function', fn=lambda c: 1.0)])\n",
    )
    done = cobalt_cli(project, "run")
    events = [json.loads(line)["event"] for line in done.stdout.splitlines()]
    assert events[0] == "run.started" and events[-1] == "run.finished"
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no item of 'down' produced an output (2 errors of 2): nothing was scored; exit 1" in (
        done.stderr
    )
    console = cobalt_cli(project, "run", "--reporter", "console")  # the flag still wins
    assert console.returncode == 1 and "run.started" not in console.stdout


def test_eval_context_is_a_read_only_mapping_as_well_as_an_object():
    ctx = EvalContext({"input": "q", "id": "a"}, "out", {"model": "m"}, 5.0)
    assert ctx["output"] == ctx.output == "out" and ctx.get("metadata") == {"model": "m"}
    assert dict(ctx) == {
        "item": {"input": "q", "id": "a"},
        "input": "q",
        "output": "out",
        "metadata": {"model": "m"},
        "latency_ms": 5.0,
        "context": {},
    }
    assert {**ctx, "output": "x"}["output"] == "x" and "item" in ctx and "nope" not in ctx
    with pytest.raises(KeyError):
        ctx["nope"]
    with pytest.raises(TypeError):
        ctx["output"] = "changed"  # type: ignore[index]


def test_a_context_mapper_may_return_the_whole_context_or_extra_variables():
    original_style = Evaluator(
        name="criteria",
        type="function",
        fn=lambda ctx: {"score": float(ctx["item"]["criteria"] in ctx["output"]), "reason": "r"},
        context=lambda ctx: {**ctx, "item": {**ctx["item"], "criteria": "Paris"}, "tone": "dry"},
    )
    outcome = score(original_style, "It is Paris.", {"input": "Capital of France?"})
    assert (outcome.status, outcome.score) == ("ok", 1.0), outcome.error
    extras = Evaluator(
        name="extra",
        type="function",
        fn=lambda ctx: float(ctx.context["words"] == 3 and ctx.item == {"input": "q"}),
        context=lambda ctx: {"words": len(ctx["output"].split())},
    )
    assert score(extras, "one two three", {"input": "q"}).score == 1.0
    returned_itself = Evaluator(
        name="same", type="function", fn=lambda ctx: float(ctx.output == "o"), context=lambda c: c
    )
    assert score(returned_itself, "o", {"input": "q"}).score == 1.0
    broken = Evaluator(
        name="broken",
        type="function",
        fn=lambda ctx: 1.0,
        context=lambda ctx: {**ctx, "item": "not a dict"},
    )
    outcome = score(broken, "o", {"input": "q"})
    assert outcome.status == "error" and "item or metadata is not a dict" in outcome.error


@pytest.mark.django_db(transaction=True)
def test_an_llm_judge_sees_what_the_original_style_mapper_added(project, fake_provider):
    judge = Evaluator(
        name="judge",
        prompt="Criteria: {{criteria}}. Answer: {{output}} [[score:0.9]]",
        context=lambda ctx: {**ctx, "item": {**ctx["item"], "criteria": "be brief"}},
    )
    run = run_with(
        project, [judge], lambda ctx: "four", name="mapped", items=[{"id": "a", "input": "2+2?"}]
    )
    evaluation = Evaluation.objects.get(run=run)
    assert (evaluation.status, evaluation.score) == ("ok", 0.9), evaluation.error
    (request,) = fake_provider.requests
    assert "Criteria: be brief. Answer: four" in request["json"]["messages"][-1]["content"]


@pytest.fixture
def plugin_types() -> Iterator[None]:
    before = dict(evaluators.REGISTRY)
    yield
    evaluators.REGISTRY.clear()
    evaluators.REGISTRY.update(before)


def test_a_plugin_without_declared_options_receives_whatever_it_is_given(plugin_types):
    @register("original-plugin")
    async def handler(evaluator, target, env):
        given = f"{evaluator.options} {evaluator.threshold}"
        return evaluators.EvalOutcome(evaluator.name, 1.0, reason=given)

    @register("declared-plugin", options=["limit"])
    async def declared(evaluator, target, env):
        return 1.0

    free = Evaluator(name="free", type="original-plugin", threshold=0.4, anything={"a": 1})
    assert preflight.evaluator_problems(free, {}) == []
    assert score(free, "o", {}).reason == "{'anything': {'a': 1}} 0.4"
    checked = Evaluator(name="checked", type="declared-plugin", limt=3)
    (problem,) = preflight.evaluator_problems(checked, {})
    assert "has no option `limt=`. Did you mean `limit=`?" in problem
    builtin = Evaluator(name="valid", type="json-valid", strict=True)  # options=() declares none
    assert "has no option `strict=`" in preflight.evaluator_problems(builtin, {})[0]


def test_an_empty_dataset_says_it_is_empty_in_its_file(project):
    project.write("datasets/empty.jsonl", "")
    config = load_config(project.path)
    from_file = define(
        "from-file",
        Dataset.from_file(project.path / "datasets/empty.jsonl"),
        lambda ctx: "x",
        evaluators=[],
    )
    inline = define("inline", Dataset(items=[]), lambda ctx: "x", evaluators=[])
    messages = [p.message for p in preflight.problems([from_file, inline], config)]
    assert (
        messages[0].startswith("Dataset is empty in ")
        and "empty.jsonl: the dataset" in (messages[0])
    )
    # An inline dataset: the experiment's file (here outside the project: its whole path).
    assert messages[1].startswith(f"Dataset is empty in {inline.file}: the inline dataset has")
