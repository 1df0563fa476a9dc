"""Streamed model calls, each stored as one step with its tokens: the Anthropic SDK's
`messages.stream` (seen by OpenInference's span and by the SDK's own), OpenAI `stream=True`
with and without `stream_options.include_usage`; and each replays the same."""

from __future__ import annotations

import anthropic
import openai
import pytest

from cobalt import Dataset
from cobalt_app.models import ItemResult
from cobalt_app.selectors import item_trace
from tests.helpers import define, execute
from tests.trace_agents import record_then_replay

pytestmark = pytest.mark.django_db(transaction=True)

WORDS = Dataset(items=[{"id": f"q{i}", "input": f"word{i} and three more"} for i in range(3)])


def test_an_anthropic_messages_stream_is_one_step_with_its_tokens(project, fake_provider):
    client = anthropic.Anthropic()

    def runner(ctx):
        messages = [{"role": "user", "content": "ECHO: " + ctx.item["input"]}]
        with client.messages.stream(
            model="claude-haiku-4-5", max_tokens=100, messages=messages
        ) as stream:
            return stream.get_final_text()

    recorded, replayed = record_then_replay(
        project, fake_provider, define("anthropic-stream", WORDS, runner, concurrency=3)
    )
    for key, item in recorded.items():
        (step,) = item_trace(item.id)  # was two: OpenInference's span and the SDK's own
        assert (step["kind"], step["model"]) == ("llm", "claude-haiku-4-5")
        # "ECHO: wordN and three more": 5 words in, 4 out (the fake provider counts words)
        assert (step["inputTokens"], step["outputTokens"]) == (5, 4)
        assert item.tokens == 9 and item.output == f"word{key[1]} and three more"
        assert [s["kind"] for s in item_trace(replayed[key].id)] == ["llm"]
        assert replayed[key].tokens == 9


@pytest.mark.parametrize("usage", [True, False], ids=["with-usage", "without-usage"])
def test_an_openai_stream_is_one_step_with_or_without_usage(project, fake_provider, usage):
    client = openai.OpenAI()
    options = {"stream_options": {"include_usage": True}} if usage else {}

    def runner(ctx):
        messages = [{"role": "user", "content": "ECHO: " + ctx.item["input"]}]
        stream = client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, stream=True, **options
        )
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    recorded, replayed = record_then_replay(
        project, fake_provider, define(f"openai-stream-{usage}", WORDS, runner, concurrency=3)
    )
    streamed = [r["json"] for r in fake_provider.requests]
    assert len(streamed) == 3 and all(body["stream"] for body in streamed)
    for key, item in recorded.items():
        (step,) = item_trace(item.id)
        assert (step["kind"], step["model"]) == ("llm", "gpt-4o-mini")
        assert item.output == replayed[key].output == f"word{key[1]} and three more"
        if usage:
            assert (step["inputTokens"], step["outputTokens"]) == (5, 4)
            assert item.tokens == 9
        else:  # the provider said nothing: counted from the text, marked so, never twice
            assert step["tokensEstimated"] in ("tiktoken", "chars")
            assert step["outputTokens"] in (4, 5)  # "wordN and three more"
        assert len(item_trace(replayed[key].id)) == 1


def test_two_identical_streams_at_once_stay_two_calls(project, fake_provider):
    """Matching is by the request: two concurrent calls with the same messages are told
    apart by their response ids (four spans, two steps), never merged into one."""
    import asyncio

    client = anthropic.AsyncAnthropic()

    async def one(text: str) -> str:
        messages = [{"role": "user", "content": "ECHO: " + text}]
        async with client.messages.stream(
            model="claude-haiku-4-5", max_tokens=100, messages=messages
        ) as stream:
            return await stream.get_final_text()

    async def runner(ctx):
        both = await asyncio.gather(one(ctx.item["input"]), one(ctx.item["input"]))
        return " | ".join(both)

    (run,) = execute(project, define("twice", WORDS, runner, concurrency=3))
    for item in ItemResult.objects.filter(run=run):
        steps = item_trace(item.id)
        assert [s["kind"] for s in steps] == ["llm", "llm"]
        assert item.tokens == 18  # 5 + 4 each
