"""A real Haystack pipeline: the pipeline and its components as a tree, the generator's model
call one step (Haystack's span and the OpenAI SDK's merged), and replayed."""

from __future__ import annotations

import pytest

from cobalt import Dataset
from cobalt_app import trace_spans
from cobalt_app.selectors import item_trace
from tests.helpers import define
from tests.trace_agents import city_items, haystack_pipeline, record_then_replay, tree

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_haystack_pipeline_shows_its_components_and_counts_its_call_once(project, fake_provider):
    pipeline = haystack_pipeline()

    def runner(ctx):
        return pipeline(ctx.item["input"])

    recorded, replayed = record_then_replay(
        project, fake_provider, define("haystack", Dataset(items=city_items()), runner)
    )
    for key, item in recorded.items():
        assert item.output == f"the weather in {item.input['input']} is sunny"
        steps = item_trace(item.id)
        assert tree(steps) == [
            ("other", "Pipeline.run", None),
            ("other", "ChatPromptBuilder.run", "other"),
            ("llm", "OpenAIChatGenerator.run", "other"),
        ]
        (call,) = trace_spans.model_calls(steps)  # Haystack's span and the SDK's: one step
        assert (call["model"], call["inputTokens"], call["outputTokens"]) == ("gpt-4o-mini", 7, 6)
        assert item.tokens == replayed[key].tokens == 13
