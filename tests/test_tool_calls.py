"""Agent checks: `tool-calls` in every mode on plain, OpenAI- and Anthropic-shaped calls;
the `trajectory` judge."""

from __future__ import annotations

import asyncio
import json

import anthropic
import openai
import pytest

from cobalt import Dataset, Evaluator
from cobalt_app.evaluators import EvalOutcome, EvalTarget, evaluate
from cobalt_app.evaluators.tool_calls import normalise_calls
from cobalt_app.models import Evaluation
from tests.helpers import define, execute

EXPECTED = [
    {"name": "search", "arguments": {"query": "weather Paris"}},
    {"name": "convert", "arguments": {"value": 20, "unit": "F"}},
]


def openai_call(name: str, arguments: dict) -> dict:
    return {
        "id": f"call_{name}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def anthropic_block(name: str, arguments: dict) -> dict:
    return {"type": "tool_use", "id": f"toolu_{name}", "name": name, "input": arguments}


SEARCH = {"query": "weather Paris"}
CONVERT = {"value": 20, "unit": "F"}
SHAPES = {
    "plain": lambda n, a: {"name": n, "arguments": a},
    "openai": openai_call,
    "anthropic": anthropic_block,
}


def check(actual, expected=EXPECTED, **options) -> EvalOutcome:
    evaluator = Evaluator("tools", "tool-calls", **options)
    target = EvalTarget({"expected_tool_calls": expected}, "done", {"tool_calls": actual})
    return asyncio.run(evaluate(evaluator, target, None))


def score(actual, expected=EXPECTED, **options) -> float | None:
    outcome = check(actual, expected, **options)
    assert outcome.status == "ok", outcome.error
    return outcome.score


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    ("order", "expected_scores"),
    [
        # the calls made    strict unordered subset superset
        (["search", "convert"], (1, 1, 1, 1)),
        (["convert", "search"], (0, 1, 1, 1)),
        (["search"], (0, 0, 1, 0)),
        (["search", "convert", "search2"], (0, 0, 0, 1)),
        ([], (0, 0, 1, 0)),
    ],
)
def test_modes_on_every_call_shape(shape, order, expected_scores):
    arguments = {"search": SEARCH, "convert": CONVERT, "search2": {"query": "more"}}
    make = SHAPES[shape]
    actual = [make(n.rstrip("2"), arguments[n]) for n in order]
    modes = ("strict", "unordered", "subset", "superset")
    got = tuple(score(actual, mode=mode) for mode in modes)
    assert got == tuple(float(s) for s in expected_scores)


def test_a_whole_anthropic_content_list_skips_text_blocks():
    content = [
        {"type": "text", "text": "Let me look that up."},
        anthropic_block("search", SEARCH),
        anthropic_block("convert", CONVERT),
    ]
    assert score(content) == 1.0


def test_a_whole_openai_assistant_message_is_read_for_its_calls():
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [openai_call("search", SEARCH), openai_call("convert", CONVERT)],
    }
    assert score(message) == 1.0
    assert normalise_calls({"role": "assistant", "tool_calls": None}, "m") == []


def test_sdk_objects_are_accepted(fake_provider):
    tools = [{"type": "function", "function": {"name": "search", "parameters": {}}}]
    client = openai.OpenAI(base_url=fake_provider.openai_base_url, api_key="k")
    reply = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": '[[tool:{"query": "weather Paris"}]]'}],
        tools=tools,
    )
    expected = [{"name": "search", "arguments": SEARCH}]
    assert score(reply.choices[0].message.tool_calls, expected) == 1.0
    claude = anthropic.Anthropic(base_url=fake_provider.anthropic_base_url, api_key="k")
    message = claude.messages.create(
        model="c",
        max_tokens=50,
        messages=[{"role": "user", "content": '[[tool:{"query": "weather Paris"}]]'}],
        tools=[{"name": "search", "input_schema": {"type": "object"}}],
    )
    assert score(message.content, expected) == 1.0


def test_arguments_compare_as_json_values_not_text():
    reordered = [
        openai_call("search", SEARCH),
        {
            "type": "function",
            "function": {"name": "convert", "arguments": '{"unit":"F","value":20}'},
        },
    ]
    assert score(reordered) == 1.0


def test_strict_reasons_name_the_first_difference():
    outcome = check([{"name": "search", "arguments": {"query": "weather Rome"}}], mode="strict")
    assert outcome.score == 0.0
    assert outcome.reason == (
        "call 1 search: argument 'query' is 'weather Rome', expected 'weather Paris'"
    )
    outcome = check([{"name": "lookup", "arguments": {}}])
    assert outcome.reason.startswith("call 1: expected search(")
    assert "got lookup({})" in outcome.reason
    outcome = check([{"name": "search", "arguments": SEARCH}])
    assert outcome.reason == (
        'expected 2 tool calls, got 1: call 2 convert({"unit": "F", "value": 20}) was not made'
    )
    many = [{"name": "search", "arguments": SEARCH}, {"name": "convert", "arguments": CONVERT}]
    outcome = check([*many, {"name": "delete", "arguments": {"id": 1}}])
    assert outcome.reason == 'expected 2 tool calls, got 3: unexpected call 3 delete({"id": 1})'


def test_unordered_reasons_name_missing_extra_and_argument_differences():
    outcome = check([anthropic_block("convert", {"value": 21, "unit": "F"})], mode="superset")
    assert outcome.reason.startswith('expected call search({"query": "weather Paris"}) was not')
    outcome = check(
        [anthropic_block("convert", {"value": 21, "unit": "F"}), anthropic_block("search", SEARCH)],
        mode="unordered",
    )
    assert outcome.reason == (
        'expected call convert({"unit": "F", "value": 20}): argument \'value\' is 21, expected 20'
    )
    outcome = check([anthropic_block("delete", {})], mode="subset")
    assert outcome.reason == "unexpected call delete({}) (not among the expected calls)"


def test_match_arguments_ignore_compares_names_only():
    wrong_arguments = [{"name": "search", "arguments": {"q": 1}}, {"name": "convert"}]
    assert score(wrong_arguments, match_arguments="ignore") == 1.0
    outcome = check(wrong_arguments, match_arguments=False)
    assert outcome.score == 1.0 and "arguments ignored" in outcome.reason
    assert score(wrong_arguments) == 0.0


def test_an_expected_call_without_arguments_matches_any():
    assert score([openai_call("search", {"query": "anything"})], [{"name": "search"}]) == 1.0


def test_expected_calls_may_be_a_json_string_from_a_csv_dataset():
    assert score([anthropic_block("search", SEARCH)], json.dumps([EXPECTED[0]])) == 1.0


def test_the_success_reason_counts_the_calls():
    outcome = check([openai_call("search", SEARCH), openai_call("convert", CONVERT)])
    assert outcome.reason == "2 tool call(s) match the 2 expected (strict)"


@pytest.mark.parametrize(
    ("metadata", "item", "options", "message"),
    [
        ({}, {"expected_tool_calls": EXPECTED}, {}, "no tool calls to read"),
        ({"tool_calls": []}, {}, {}, "the item has no 'expected_tool_calls'"),
        ({"tool_calls": []}, {"calls": EXPECTED}, {"field": "other"}, "no 'other'"),
        ({"tool_calls": "not json"}, {"expected_tool_calls": []}, {}, "not JSON"),
        ({"tool_calls": 5}, {"expected_tool_calls": []}, {}, "must be a list of tool calls"),
        ({"tool_calls": [{"arguments": {}}]}, {"expected_tool_calls": []}, {}, "no tool `name`"),
        ({"tool_calls": ["search"]}, {"expected_tool_calls": []}, {}, "is str, not a tool call"),
        ({"tool_calls": []}, {"expected_tool_calls": []}, {"mode": "fuzzy"}, "`mode` must be"),
        (
            {"tool_calls": []},
            {"expected_tool_calls": []},
            {"match_arguments": "loose"},
            "`match_arguments` must be",
        ),
    ],
)
def test_problems_are_evaluation_errors_with_reasons(metadata, item, options, message):
    evaluator = Evaluator("tools", "tool-calls", **options)
    outcome = asyncio.run(evaluate(evaluator, EvalTarget(item, "x", metadata), None))
    assert outcome.status == "error" and outcome.score is None
    assert message in outcome.error


def test_a_field_option_reads_another_item_field():
    evaluator = Evaluator("tools", "tool-calls", field="calls")
    target = EvalTarget({"calls": [{"name": "a"}]}, "x", {"tool_calls": [{"name": "a"}]})
    assert asyncio.run(evaluate(evaluator, target, None)).score == 1.0


# ---------------------------------------------------------------------- trajectory judge


@pytest.mark.django_db(transaction=True)
def test_the_trajectory_judge_sees_the_calls_the_reference_and_the_answer(project, fake_provider):
    items = [
        {
            "id": "t1",
            "input": "What's the weather in Paris in F? [[score:0.75]]",
            "expected_tool_calls": EXPECTED,
        }
    ]

    def runner(ctx):
        calls = [openai_call("search", SEARCH), openai_call("convert", CONVERT)]
        return {"output": "It is 68F in Paris.", "metadata": {"tool_calls": calls}}

    evaluators = [
        Evaluator("trajectory", "trajectory"),
        Evaluator("efficient", "trajectory", criteria="Were there redundant calls?"),
    ]
    definition = define("agent", Dataset(items=items), runner, evaluators=evaluators)
    (run,) = execute(project, definition)
    evaluations = {e.evaluator: e for e in Evaluation.objects.filter(run=run)}
    assert evaluations["trajectory"].score == 0.75
    prompts = [r["json"]["messages"][-1]["content"] for r in fake_provider.requests]
    prompt = next(p for p in prompts if "Were there" not in p)
    assert '1. search({"query": "weather Paris"})' in prompt
    assert '2. convert({"unit": "F", "value": 20})' in prompt
    assert "A reference trajectory" in prompt and "It is 68F in Paris." in prompt
    assert any("Were there redundant calls?" in p for p in prompts)
    assert evaluations["efficient"].status == "ok"


@pytest.mark.django_db(transaction=True)
def test_a_trajectory_without_reported_calls_is_an_error_before_any_judge_call(
    project, fake_provider
):
    definition = define(
        "agent",
        Dataset(items=[{"id": "t", "input": "hi"}]),
        lambda ctx: "hello",
        evaluators=[Evaluator("trajectory", "trajectory", scoring="boolean")],
    )
    (run,) = execute(project, definition)
    evaluation = Evaluation.objects.get(run=run)
    assert evaluation.status == "error" and "no tool calls to read" in evaluation.error
    assert fake_provider.request_count() == 0
