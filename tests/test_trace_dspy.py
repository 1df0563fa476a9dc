"""A real DSPy program: the module and its predictor as a tree, the model call one step
(DSPy's LM span, LiteLLM's and the OpenAI SDK's merged), and replayed."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price list from the net

from cobalt import Dataset  # noqa: E402
from cobalt_app import trace_spans  # noqa: E402
from cobalt_app.selectors import item_trace  # noqa: E402
from tests.helpers import define  # noqa: E402
from tests.trace_agents import (  # noqa: E402
    DSPY_ANSWER,
    city_items,
    dspy_program,
    record_then_replay,
    tree,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_dspy_program_shows_its_modules_and_counts_its_call_once(project, fake_provider):
    fake_provider.reply_when("Weather in", DSPY_ANSWER)
    program = dspy_program()

    def runner(ctx):
        return program(ctx.item["input"])

    recorded, replayed = record_then_replay(
        project, fake_provider, define("dspy", Dataset(items=city_items()), runner)
    )
    assert len(fake_provider.requests) == 3  # one model call per item, recorded once
    for key, item in recorded.items():
        assert item.output == "sunny"
        steps = item_trace(item.id)
        assert tree(steps) == [
            ("other", "Predict.forward", None),
            ("other", "Predict(StringSignature).forward", "other"),
            ("other", "ChatAdapter.__call__", "other"),
            ("llm", "LM.__call__", "other"),
        ]
        assert [s["parent"] for s in steps] == [None, 0, 1, 2]
        # DSPy's LM span, LiteLLM's and the OpenAI SDK's: one step with the call's tokens
        (call,) = trace_spans.model_calls(steps)
        assert call["inputTokens"] > 0 and call["outputTokens"] > 0
        assert item.tokens == call["inputTokens"] + call["outputTokens"]
        assert replayed[key].tokens == item.tokens and replayed[key].output == "sunny"
