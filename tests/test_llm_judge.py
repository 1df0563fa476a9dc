"""The llm-judge evaluator through the official SDKs against the fake provider."""

import json

import pytest

from cobalt import Dataset, Evaluator
from cobalt_app.evaluators.llm_judge import parse_judgement
from cobalt_app.models import Evaluation, JudgeCacheEntry
from cobalt_app.preflight import PreflightError
from tests.helpers import run_with

pytestmark = pytest.mark.django_db(transaction=True)

DATASET = Dataset(items=[{"id": "a", "input": "2+2?", "expected_output": "4", "output": "DATASET"}])


def run_judge(project, evaluator, *, config_text=None, no_cache=False, output="four"):
    """The run over DATASET answered `output` and its one evaluation."""
    run = run_with(
        project,
        [evaluator],
        lambda ctx: output,
        name="judge",
        items=DATASET,
        config_text=config_text,
        no_cache=no_cache,
    )
    return run, Evaluation.objects.get(run=run)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ('{"score": 0.8, "reason": "fine"}', (0.8, "fine")),
        ('```json\n{"score": 1, "reason": "ok"}\n```', (1.0, "ok")),
        ('Here you go: {"score": "0.5", "reason": "meh"} thanks', (0.5, "meh")),
        ("I'd say 8/10", None),
        ('{"score": 8, "reason": "out of ten"}', None),
        ('{"reason": "no score"}', None),
    ],
)
def test_judge_replies_are_parsed_strictly(reply, expected):
    assert parse_judgement(reply) == expected


def test_the_judge_scores_with_the_rendered_prompt(project, fake_provider):
    evaluator = Evaluator(
        name="rel", prompt="Q: {{input}} A: {{output}} E: {{expected_output}} [[score:0.7]]"
    )
    run, evaluation = run_judge(project, evaluator)
    assert (evaluation.status, evaluation.score) == ("ok", 0.7)
    assert evaluation.reason == "fake judge: scripted score"
    assert evaluation.tokens > 0 and evaluation.cost > 0
    (request,) = fake_provider.requests
    prompt = request["json"]["messages"][-1]["content"]
    assert "Q: 2+2? A: four E: 4" in prompt  # the agent output, not the dataset's `output`
    assert request["json"]["model"] == "gpt-4o-mini"
    assert request["headers"]["authorization"] == "Bearer sk-test-openai-SECRET-0001"
    run.refresh_from_db()
    assert run.summary["judgeTokens"] == evaluation.tokens


def test_invalid_json_is_retried_once_with_a_stricter_instruction(project, fake_provider):
    fake_provider.invalid_json_next(1)
    _, evaluation = run_judge(project, Evaluator(name="rel", prompt="{{output}} [[score:0.6]]"))
    assert (evaluation.status, evaluation.score) == ("ok", 0.6)
    first, second = fake_provider.requests
    assert "could not be used" not in first["json"]["messages"][-1]["content"]
    assert "could not be used" in second["json"]["messages"][-1]["content"]


def test_prose_twice_is_an_evaluation_error_not_a_zero(project, fake_provider):
    fake_provider.invalid_json_next(2)
    run, evaluation = run_judge(project, Evaluator(name="rel", prompt="{{output}}"))
    assert evaluation.status == "error" and evaluation.score is None
    assert "did not answer JSON" in evaluation.error and "8 out of 10" in evaluation.error
    assert fake_provider.request_count() == 2
    assert JudgeCacheEntry.objects.count() == 0  # errors are never cached
    run.refresh_from_db()
    assert run.summary["scores"]["rel"] == run.summary["scores"]["rel"] | {
        "count": 0,
        "errors": 1,
        "avg": None,
    }


def test_a_429_with_retry_after_is_retried_by_the_sdk(project, fake_provider):
    fake_provider.fail_next(1, status=429, retry_after=0.4)
    _, evaluation = run_judge(project, Evaluator(name="rel", prompt="{{output}} [[score:0.9]]"))
    assert evaluation.score == 0.9
    first, second = fake_provider.requests
    assert second["time"] - first["time"] >= 0.4


def test_the_cache_answers_the_second_time_and_no_cache_bypasses_it(project, fake_provider):
    evaluator = Evaluator(name="rel", prompt="{{output}} [[score:0.4]]")
    run_judge(project, evaluator)
    assert fake_provider.request_count() == 1
    _, cached = run_judge(project, evaluator)
    assert cached.cached and cached.score == 0.4 and cached.tokens == 0
    assert fake_provider.request_count() == 1
    _, fresh = run_judge(project, evaluator, no_cache=True)
    assert not fresh.cached
    assert fake_provider.request_count() == 2


def test_the_cache_key_covers_model_and_rendered_prompt(project, fake_provider):
    run_judge(project, Evaluator(name="rel", prompt="{{output}} [[score:0.4]]"))
    run_judge(project, Evaluator(name="rel", prompt="{{output}} [[score:0.4]]", model="gpt-4o"))
    run_judge(project, Evaluator(name="rel", prompt="{{output}} [[score:0.4]]"), output="five")
    assert fake_provider.request_count() == 3
    entry = JudgeCacheEntry.objects.filter(model="gpt-4o").get()
    assert len(entry.key) == 64 and entry.expires_at is not None


def test_a_missing_api_key_names_the_variable(project, fake_provider, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(PreflightError, match="OPENAI_API_KEY is not set: the llm-judge 'rel'"):
        run_judge(project, Evaluator(name="rel", prompt="{{output}}"))
    assert fake_provider.request_count() == 0


def test_the_anthropic_provider_uses_its_own_sdk_and_key(project, fake_provider):
    evaluator = Evaluator(
        name="rel",
        prompt="{{output}} [[score:0.3]]",
        provider="anthropic",
        model="claude-haiku-4-5",
    )
    _, evaluation = run_judge(project, evaluator)
    assert evaluation.score == 0.3
    (request,) = fake_provider.requests
    assert request["path"] == "/v1/messages"
    assert request["json"]["model"] == "claude-haiku-4-5"
    assert "sk-ant-test-SECRET-0002" in json.dumps(request["headers"])


def test_judge_base_url_in_config_points_at_an_openai_compatible_server(
    project, fake_provider, monkeypatch
):
    monkeypatch.delenv("OPENAI_BASE_URL")
    monkeypatch.delenv("OPENAI_API_KEY")  # local servers need no key
    config_text = f'[judge]\nbase_url = "{fake_provider.openai_base_url}"\nmodel = "llama3"\n'
    _, evaluation = run_judge(
        project, Evaluator(name="rel", prompt="{{output}} [[score:0.2]]"), config_text=config_text
    )
    assert evaluation.score == 0.2
    assert fake_provider.requests[0]["json"]["model"] == "llama3"


def test_a_template_field_missing_from_the_item_is_an_evaluation_error(project, fake_provider):
    _, evaluation = run_judge(project, Evaluator(name="rel", prompt="{{reference}}"))
    assert evaluation.status == "error" and "{{reference}}" in evaluation.error
    assert fake_provider.request_count() == 0


@pytest.mark.parametrize("body", ["<html>502 Bad Gateway</html>", '{"choices": []}', '{"id": 1}'])
def test_a_reply_that_is_not_a_chat_completion_is_a_provider_error(body):
    from cobalt_app.providers import ProviderError, chat_reply

    with pytest.raises(ProviderError, match="the reply is not a chat completion") as caught:
        chat_reply(body, "gpt-4o-mini")
    assert body[:20] in str(caught.value)


def test_a_chat_completion_reply_gives_text_and_token_counts():
    from cobalt_app.providers import chat_reply

    body = json.dumps(
        {
            "choices": [{"message": {"role": "assistant", "content": '{"score": 1}'}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 3},
        }
    )
    reply = chat_reply(body, "gpt-4o-mini")
    assert (reply.text, reply.input_tokens, reply.output_tokens) == ('{"score": 1}', 12, 3)
