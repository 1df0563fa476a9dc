"""Quick deterministic evaluators at their edges, and the llm-judge's scoring options."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import pytest

from cobalt import Dataset, Evaluator
from cobalt.experiments import collecting
from cobalt_app import embeddings
from cobalt_app.evaluators import EvalOutcome, EvalTarget, evaluate, known_types
from cobalt_app.evaluators.deterministic import levenshtein_distance
from cobalt_app.evaluators.llm_judge import parse_judgement
from cobalt_app.models import Evaluation
from cobalt_app.preflight import PreflightError
from tests.helpers import run_with


def check(
    evaluator: Evaluator,
    output,
    item: dict | None = None,
    *,
    metadata: dict | None = None,
    latency_ms: float | None = 12.0,
    cost: float = 0.0,
) -> EvalOutcome:
    target = EvalTarget(item or {}, output, metadata or {}, latency_ms, cost)
    return asyncio.run(evaluate(evaluator, target, None))


def ok(outcome: EvalOutcome, score: float, *reason_parts: str) -> None:
    assert outcome.status == "ok", outcome.error
    assert outcome.score == pytest.approx(score)
    for part in reason_parts:
        assert part in outcome.reason


def failed(outcome: EvalOutcome, *error_parts: str) -> None:
    assert outcome.status == "error" and outcome.score is None, outcome
    for part in error_parts:
        assert part in outcome.error


BUILTIN_TYPES = {
    "llm-judge",
    "function",
    "exact-match",
    "contains",
    "not-contains",
    "regex",
    "json-valid",
    "json-schema",
    "levenshtein",
    "latency",
    "cost",
    "similarity",
    "tool-calls",
    "trajectory",
    "autoevals",
    "deepeval",
    "ragas",
    "steps",
    "tool-errors",
    "loops",
    "tool-used",
    "tool-not-used",
}


def test_every_builtin_type_is_registered():
    assert set(known_types()) >= BUILTIN_TYPES


# ---------------------------------------------------------------------- contains


def test_a_misspelt_field_lists_the_fields_the_item_has():
    item = {"id": "fr", "input": "Capital of France?", "expected_output": "Paris"}
    outcome = check(Evaluator(name="exact", type="exact-match", field="expected"), "Paris", item)
    assert outcome.status == "error" and outcome.error == (
        "the item has no field 'expected' to compare with (its fields: id, input, "
        "expected_output); set the evaluator's `field=` to one of them"
    )


def test_contains_finds_a_value_and_names_it():
    ok(check(Evaluator("c", "contains", value="Paris"), "It is Paris."), 1.0, "'Paris'")


def test_contains_is_case_sensitive_unless_told_otherwise():
    ok(check(Evaluator("c", "contains", value="paris"), "It is Paris."), 0.0, "'paris'")
    ok(check(Evaluator("c", "contains", value="paris", case_sensitive=False), "PARIS"), 1.0)


def test_contains_with_a_list_needs_every_value_and_names_the_missing_ones():
    outcome = check(Evaluator("c", "contains", value=["Paris", "France", "Seine"]), "Paris, France")
    ok(outcome, 0.0, "'Seine'")
    assert "'Paris'" not in outcome.reason


def test_contains_takes_the_value_from_an_item_field():
    evaluator = Evaluator("c", "contains", field="capital")
    ok(check(evaluator, "The capital is Rome.", {"capital": "Rome"}), 1.0)
    failed(check(evaluator, "The capital is Rome.", {}), "no field 'capital'")


@pytest.mark.parametrize(
    ("evaluator", "output", "message"),
    [
        (Evaluator("c", "contains"), "text", 'needs `value="text"`'),
        (Evaluator("c", "contains", value=""), "text", "`value` is empty"),
        (Evaluator("c", "contains", value=[]), "text", "empty list"),
        (Evaluator("c", "contains", value="x"), "", "the output is empty"),
        (Evaluator("c", "contains", value="x"), "   ", "the output is empty"),
        (Evaluator("c", "contains", value="x"), None, "returned nothing"),
        (Evaluator("c", "contains", value="x", case_sensitive="no"), "x", "case_sensitive"),
        (Evaluator("c", "not-contains", value="x"), "", "the output is empty"),
    ],
)
def test_contains_edges_are_errors_with_reasons_never_zero(evaluator, output, message):
    failed(check(evaluator, output), message)


def test_not_contains_fails_naming_what_it_found():
    evaluator = Evaluator("n", "not-contains", value=["sorry", "as an AI"], case_sensitive=False)
    ok(check(evaluator, "Sorry, I cannot."), 0.0, "'sorry'")
    ok(check(evaluator, "Here is the answer."), 1.0, "does not contain")


def test_contains_reads_a_structured_output_as_json():
    ok(check(Evaluator("c", "contains", value='"city": "Oslo"'), {"city": "Oslo"}), 1.0)


# ---------------------------------------------------------------------- regex


def test_regex_searches_anywhere_and_reports_the_match():
    outcome = check(Evaluator("r", "regex", pattern=r"\d{4}-\d{2}-\d{2}"), "Due on 2024-05-17.")
    ok(outcome, 1.0, "'2024-05-17'", "at 7")


def test_regex_without_a_match_scores_zero():
    ok(check(Evaluator("r", "regex", pattern=r"^\d+$"), "12a"), 0.0, "no match")


def test_regex_flags_and_case_sensitivity():
    ok(check(Evaluator("r", "regex", pattern="^paris$", flags="im"), "Rome\nPARIS"), 1.0)
    ok(check(Evaluator("r", "regex", pattern="paris", case_sensitive=False), "PARIS"), 1.0)
    ok(check(Evaluator("r", "regex", pattern="paris"), "PARIS"), 0.0)


@pytest.mark.parametrize(
    ("evaluator", "message"),
    [
        (Evaluator("r", "regex"), "needs `pattern=`"),
        (Evaluator("r", "regex", pattern="(unclosed"), "not a valid regular expression"),
        (Evaluator("r", "regex", pattern="a", flags="q"), "unknown regex flag 'q'"),
        (Evaluator("r", "regex", pattern=""), "non-empty string"),
    ],
)
def test_regex_configuration_problems_are_errors(evaluator, message):
    failed(check(evaluator, "abc"), message)


# ---------------------------------------------------------------------- JSON


def test_json_valid_accepts_json_text_and_structured_outputs():
    ok(check(Evaluator("j", "json-valid"), '{"a": [1, 2]}'), 1.0, "object")
    ok(check(Evaluator("j", "json-valid"), [1, 2]), 1.0, "array")


def test_json_valid_names_the_position_of_the_error():
    ok(check(Evaluator("j", "json-valid"), '{"a": 1,\n "b": }'), 0.0, "line 2 column 7")


def test_json_valid_on_an_empty_output_is_an_error():
    failed(check(Evaluator("j", "json-valid"), " "), "the output is empty")


SCHEMA = {
    "type": "object",
    "required": ["answer", "confidence"],
    "properties": {
        "answer": {"type": "string"},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    },
}


def test_json_schema_passes_a_matching_output():
    evaluator = Evaluator("s", "json-schema", schema=SCHEMA)
    ok(check(evaluator, '{"answer": "4", "confidence": 0.9}'), 1.0, "matches the schema")


def test_json_schema_names_the_failing_path():
    evaluator = Evaluator("s", "json-schema", schema=SCHEMA)
    ok(check(evaluator, {"answer": "4", "confidence": 3}), 0.0, "at confidence", "maximum")
    ok(check(evaluator, {"answer": "4"}), 0.0, "'confidence' is a required property")
    ok(check(evaluator, "not json"), 0.0, "not valid JSON")


def test_json_schema_problems_with_the_schema_are_errors():
    failed(check(Evaluator("s", "json-schema"), "{}"), "needs `schema=`")
    failed(check(Evaluator("s", "json-schema", schema="x"), "{}"), "JSON Schema dict")
    bad = Evaluator("s", "json-schema", schema={"type": "objekt"})
    failed(check(bad, "{}"), "not a valid JSON Schema")


# ---------------------------------------------------------------------- levenshtein


def test_levenshtein_distance_is_the_classic_one():
    assert levenshtein_distance("kitten", "sitting") == 3
    assert levenshtein_distance("", "abc") == 3
    assert levenshtein_distance("flaw", "lawn") == 2


def test_levenshtein_scores_normalised_similarity_to_the_field():
    item = {"expected_output": "sitting"}
    ok(check(Evaluator("l", "levenshtein"), "kitten", item), 1 - 3 / 7, "edit distance 3")
    ok(check(Evaluator("l", "levenshtein"), "sitting", item), 1.0)
    ok(check(Evaluator("l", "levenshtein", field="ref"), "abc", {"ref": "abd"}), 2 / 3)


def test_levenshtein_with_a_threshold_scores_pass_or_fail():
    item = {"expected_output": "sitting"}
    ok(check(Evaluator("l", "levenshtein", threshold=0.5), "kitten", item), 1.0, ">= threshold")
    ok(check(Evaluator("l", "levenshtein", threshold=0.9), "kitten", item), 0.0, "< threshold")


def test_levenshtein_edges():
    failed(check(Evaluator("l", "levenshtein"), "x", {}), "no field 'expected_output'")
    failed(check(Evaluator("l", "levenshtein"), "x", {"expected_output": ""}), "is empty")
    failed(check(Evaluator("l", "levenshtein"), "", {"expected_output": "x"}), "output is empty")


# ---------------------------------------------------------------------- budgets


def test_latency_budget():
    ok(check(Evaluator("t", "latency", max_ms=50), "x", latency_ms=49.6), 1.0, "within 50 ms")
    ok(check(Evaluator("t", "latency", max_ms=50), "x", latency_ms=51), 0.0, "over the 50 ms")
    failed(check(Evaluator("t", "latency"), "x"), "needs `max_ms=`")
    failed(check(Evaluator("t", "latency", max_ms=-1), "x"), "at least 0")
    failed(check(Evaluator("t", "latency", max_ms=5), "x", latency_ms=None), "no measured")


def test_cost_budget_uses_what_the_runner_reported():
    evaluator = Evaluator("c", "cost", max_usd=0.01)
    ok(check(evaluator, "x", metadata={"cost": 0.002}, cost=0.002), 1.0, "within $0.01")
    ok(check(evaluator, "x", metadata={"cost": 0.05}, cost=0.05), 0.0, "over the $0.01")
    failed(check(evaluator, "x", metadata={}), "reported no cost")
    failed(check(Evaluator("c", "cost"), "x", metadata={"cost": 0}), "needs `max_usd=`")


pytestmark_db = pytest.mark.django_db(transaction=True)
ITEMS = Dataset(items=[{"id": "q1", "input": "2+2?", "expected_output": "4"}])


def run_evals(project, evaluators, runner, *, config_text=None):
    """The run over ITEMS and its evaluations, by evaluator."""
    run = run_with(project, evaluators, runner, name="evals", items=ITEMS, config_text=config_text)
    return run, {e.evaluator: e for e in Evaluation.objects.filter(run=run)}


@pytestmark_db
def test_latency_and_cost_budgets_through_the_engine(project, fake_provider):
    def runner(ctx):
        return {
            "output": "4",
            "metadata": {"model": "gpt-4o-mini", "usage": {"input_tokens": 1000}},
        }

    evaluators = [
        Evaluator("fast", "latency", max_ms=10_000),
        Evaluator("cheap", "cost", max_usd=0.001),
        Evaluator("free", "cost", max_usd=0.0),
    ]
    _, evaluations = run_evals(project, evaluators, runner)
    assert evaluations["fast"].score == 1.0 and " ms within " in evaluations["fast"].reason
    assert evaluations["cheap"].score == 1.0 and "$0.000150" in evaluations["cheap"].reason
    assert evaluations["free"].score == 0.0


# ---------------------------------------------------------------------- llm-judge options


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ('{"pass": true, "reason": "right"}', (1.0, "right")),
        ('{"pass": false, "reason": "wrong"}', (0.0, "wrong")),
        ('{"pass": "fail", "reason": "no"}', (0.0, "no")),
        ('{"score": 1, "reason": "ok"}', (1.0, "ok")),
        ('{"score": 0.7, "reason": "a scale score"}', None),
        ('{"pass": "maybe"}', None),
        ('{"reasoning": "step 1...", "pass": true}', (1.0, "step 1...")),
    ],
)
def test_boolean_verdicts_are_parsed_strictly(reply, expected):
    assert parse_judgement(reply, "boolean") == expected


@pytestmark_db
def test_a_boolean_judge_records_pass_as_one_and_fail_as_zero(project, fake_provider):
    passing = Evaluator(
        "pass", prompt='{{output}} [[reply:{"pass": true, "reason": "correct"}]]', scoring="boolean"
    )
    failing = Evaluator(
        "fail", prompt='{{output}} [[reply:{"pass": false, "reason": "off"}]]', scoring="boolean"
    )
    _, evaluations = run_evals(project, [passing, failing], lambda ctx: "4")
    assert (evaluations["pass"].score, evaluations["pass"].reason) == (1.0, "correct")
    assert (evaluations["fail"].score, evaluations["fail"].reason) == (0.0, "off")
    prompt = fake_provider.requests[0]["json"]["messages"][-1]["content"]
    assert '{"pass": <true if the output passes, else false>' in prompt
    assert '"score"' not in prompt


@pytestmark_db
def test_a_boolean_judge_that_answers_a_scale_is_an_error(project, fake_provider):
    evaluator = Evaluator("b", prompt="{{output}} [[score:0.7]]", scoring="boolean")
    _, evaluations = run_evals(project, [evaluator], lambda ctx: "4")
    assert evaluations["b"].status == "error"
    assert '{"pass": true|false, ...} twice' in evaluations["b"].error
    second = fake_provider.requests[1]["json"]["messages"][-1]["content"]
    assert '{"pass": <true or false>' in second


@pytestmark_db
def test_chain_of_thought_asks_for_reasoning_before_the_verdict(project, fake_provider):
    reply = '{"reasoning": "2+2 is 4 and the output says 4", "score": 0.9, "reason": "right"}'
    evaluator = Evaluator("cot", prompt=f"{{{{output}}}} [[reply:{reply}]]", chain_of_thought=True)
    _, evaluations = run_evals(project, [evaluator], lambda ctx: "4")
    assert (evaluations["cot"].score, evaluations["cot"].reason) == (0.9, "right")
    prompt = fake_provider.requests[0]["json"]["messages"][-1]["content"]
    assert "step-by-step analysis" in prompt
    assert prompt.index('"reasoning"') < prompt.index('"score"')


@pytestmark_db
def test_judge_option_mistakes_are_errors(project, fake_provider):
    evaluators = [
        Evaluator("s", prompt="{{output}}", scoring="stars"),
        Evaluator("c", prompt="{{output}}", chain_of_thought="yes"),
    ]
    _, evaluations = run_evals(project, evaluators, lambda ctx: "4")
    assert "scoring must be 'scale' (0..1) or 'boolean'" in evaluations["s"].error
    assert "chain_of_thought must be True or False" in evaluations["c"].error
    assert fake_provider.request_count() == 0


@pytestmark_db
def test_an_anthropic_judge_beside_an_openai_one_uses_claude_and_its_own_key(
    project, fake_provider
):
    evaluators = [
        Evaluator("claude", prompt="{{output}} [[score:0.6]]", provider="anthropic"),
        Evaluator("gpt", prompt="{{output}} [[score:0.5]]"),
    ]
    _, evaluations = run_evals(project, evaluators, lambda ctx: "4")
    assert evaluations["claude"].score == 0.6 and evaluations["gpt"].score == 0.5
    by_path = {r["path"]: r for r in fake_provider.requests}
    claude = by_path["/v1/messages"]
    assert claude["json"]["model"] == "claude-haiku-4-5"
    assert "sk-ant-test-SECRET-0002" in json.dumps(claude["headers"])  # the SDK's own header
    assert "SECRET-0001" not in json.dumps(claude["headers"])
    assert by_path["/v1/chat/completions"]["headers"]["authorization"].endswith("0001")


@pytestmark_db
def test_an_anthropic_judge_without_its_key_names_the_variable(project, fake_provider, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    evaluator = Evaluator("claude", prompt="{{output}}", provider="anthropic")
    with pytest.raises(
        PreflightError, match="ANTHROPIC_API_KEY is not set: the llm-judge 'claude'"
    ):
        run_evals(project, [evaluator], lambda ctx: "4")
    assert fake_provider.request_count() == 0


@pytestmark_db
def test_a_per_evaluator_base_url_reaches_an_openai_compatible_server_without_a_key(
    project, fake_provider, monkeypatch
):
    monkeypatch.delenv("OPENAI_BASE_URL")
    monkeypatch.delenv("OPENAI_API_KEY")
    evaluator = Evaluator(
        "local-llm",
        prompt="{{output}} [[score:0.8]]",
        model="llama3.2",
        base_url=fake_provider.openai_base_url,
    )
    _, evaluations = run_evals(project, [evaluator], lambda ctx: "4")
    assert evaluations["local-llm"].score == 0.8
    (request,) = fake_provider.requests
    assert request["json"]["model"] == "llama3.2"
    assert request["headers"]["authorization"] == "Bearer not-needed"


@pytestmark_db
def test_api_key_env_picks_the_evaluators_own_key(project, fake_provider, monkeypatch):
    monkeypatch.setenv("TEAM_JUDGE_KEY", "sk-team-judge-SECRET-0003")
    own = Evaluator("own", prompt="{{output}} [[score:0.9]]", api_key_env="TEAM_JUDGE_KEY")
    unset = Evaluator("unset", prompt="{{output}}", api_key_env="MISSING_JUDGE_KEY")
    with pytest.raises(PreflightError, match="MISSING_JUDGE_KEY is not set"):
        run_evals(project, [own, unset], lambda ctx: "4")
    run, evaluations = run_evals(project, [own], lambda ctx: "4")
    assert evaluations["own"].score == 0.9
    (request,) = fake_provider.requests
    assert request["headers"]["authorization"] == "Bearer sk-team-judge-SECRET-0003"
    run.refresh_from_db()
    assert "SECRET-0003" not in json.dumps(run.config)  # the key itself is never stored


# ---------------------------------------------------------------------- every type, offline

FIXTURE = Path(__file__).parent / "fixtures" / "all_evaluators.cobalt.py"
ALL_TYPES_AVAILABLE = embeddings.local_available() and all(
    importlib.util.find_spec(extra) for extra in ("autoevals", "deepeval", "ragas")
)


@pytest.mark.skipif(
    not ALL_TYPES_AVAILABLE, reason="needs the `local`, `autoevals`, `deepeval` and `ragas` extras"
)
def test_an_experiment_with_every_evaluator_type_runs_offline(project, cobalt_cli):
    project.write("experiments/all.cobalt.py", FIXTURE.read_text(encoding="utf-8"))
    result = cobalt_cli(project, "run")
    assert result.returncode == 0, result.stdout + result.stderr
    (results_file,) = project.results_files()
    report = json.loads(results_file.read_text())
    items = {entry["key"]: entry for entry in report["items"]}
    assert set(items) == {"capital-fr", "capital-jp"}
    names = [e.name for e in _fixture_evaluators()]
    assert _fixture_types() == BUILTIN_TYPES  # every evaluator type Cobalt ships
    for key, entry in items.items():
        assert list(entry["evaluations"]) == names
        for name, evaluation in entry["evaluations"].items():
            assert evaluation.get("error") is None, (key, name, evaluation)
            assert 0 <= evaluation["score"] <= 1 and evaluation["reason"], (key, name)
    fr = items["capital-fr"]["evaluations"]
    assert (
        fr["judge"]["score"] == 0.9 and items["capital-jp"]["evaluations"]["judge"]["score"] == 0.8
    )
    assert (fr["judge-pass"]["score"], fr["judge-pass"]["reason"]) == (1.0, "names the capital")
    assert fr["confident"]["score"] == 0.9
    assert fr["exact"]["score"] == 0.0  # a JSON answer is not the expected sentence
    assert fr["similar-local"]["reason"].endswith("(all-MiniLM-L6-v2)")
    assert fr["mentions"]["reason"] == "the output contains 'Paris'"
    assert fr["tools"]["reason"] == "1 tool call(s) match the 1 expected (strict)"
    assert fr["searched"]["reason"] == "called: search"  # read from the trace
    assert fr["factuality"]["score"] == 1.0
    assert "agrees with the expert" in fr["factuality"]["reason"]
    assert (fr["geval"]["score"], fr["geval"]["reason"]) == (0.9, "It names the capital.")
    assert fr["ragas-exact"]["score"] == 1.0
    assert fr["cheap"]["reason"].startswith("$0.000036 within")
    for name in names:
        assert name in result.stdout  # the summary table lists every evaluator


def _fixture_module():
    spec = importlib.util.spec_from_file_location("all_evaluators_fixture", FIXTURE)
    module = importlib.util.module_from_spec(spec)
    with collecting():
        spec.loader.exec_module(module)
    return module


def _fixture_evaluators() -> list[Evaluator]:
    return _fixture_module().evaluators


def _fixture_types() -> set[str]:
    return {e.type for e in _fixture_evaluators()}
