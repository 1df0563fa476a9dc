"""LiteLLM, sync and async: each `completion` is one step (LiteLLM's span and the OpenAI SDK's
under it merged), the tools between them inferred from the next request, and replayed."""

from __future__ import annotations

import inspect
import os

import pytest

# LiteLLM fetches its price list from the internet when imported, unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from cobalt import Dataset, Evaluator  # noqa: E402
from cobalt_app.models import Evaluation  # noqa: E402
from cobalt_app.selectors import item_trace  # noqa: E402
from tests.helpers import define  # noqa: E402
from tests.trace_agents import city_items, litellm_agent, record_then_replay, tree  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_litellm_calls_are_one_step_each_with_their_tools(project, fake_provider, asynchronous):
    agent = litellm_agent(asynchronous)
    if inspect.iscoroutinefunction(agent):

        async def runner(ctx):
            return await agent(ctx.item["input"])
    else:

        def runner(ctx):
            return agent(ctx.item["input"])

    strict = Evaluator("tools", "tool-calls", mode="strict")
    name = f"litellm-{'async' if asynchronous else 'sync'}"
    definition = define(name, Dataset(items=city_items()), runner, evaluators=[strict])
    recorded, replayed = record_then_replay(project, fake_provider, definition)
    call = "acompletion" if asynchronous else "completion"
    for key, item in recorded.items():
        city = item.input["input"]
        steps = item_trace(item.id)
        assert tree(steps) == [
            ("llm", call, None),
            ("tool", "get_weather", None),
            ("llm", call, None),
        ]
        first, tool, second = steps
        assert first["model"] == "openai/gpt-4o-mini"
        assert tool["output"] == f"sunny in {city}" and tool["durationMs"] is not None
        assert item.tokens == sum(s["inputTokens"] + s["outputTokens"] for s in (first, second))
        assert item.tokens == 20  # 5 + 2, then 8 + 5: each call counted once
        assert replayed[key].tokens == 20
    scores = Evaluation.objects.filter(item__in=recorded.values()).values_list("score", flat=True)
    assert list(scores) == [1.0] * 3
