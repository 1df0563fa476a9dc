"""A real LlamaIndex FunctionAgent (a workflow that streams its model's tool calls, here on
its LiteLLM integration over the OpenAI SDK): its workflow steps, model calls and tool as a
tree, each model call one step though three libraries' spans describe it, and replayed."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price list from the net

from cobalt import Dataset, Evaluator  # noqa: E402
from cobalt_app import trace_spans  # noqa: E402
from cobalt_app.models import Evaluation  # noqa: E402
from cobalt_app.selectors import item_trace  # noqa: E402
from tests.helpers import define  # noqa: E402
from tests.trace_agents import city_items, llama_index_agent, record_then_replay  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_llama_index_agent_shows_its_workflow_and_counts_each_call_once(project, fake_provider):
    agent = llama_index_agent()

    async def runner(ctx):
        return await agent(ctx.item["input"])

    strict = Evaluator("tools", "tool-calls", mode="strict")
    definition = define("llama-index", Dataset(items=city_items()), runner, evaluators=[strict])
    recorded, replayed = record_then_replay(project, fake_provider, definition)
    assert all(r["json"]["stream"] for r in fake_provider.requests)
    for key, item in recorded.items():
        city = item.input["input"]
        assert item.output == f"tool said: sunny in {city}"
        steps = item_trace(item.id)
        assert steps[0]["name"] == "FunctionAgent.run" and steps[0]["parent"] is None
        calls = trace_spans.model_calls(steps)
        assert [c["name"] for c in calls] == ["LiteLLM.astream_chat"] * 2  # not 3 spans each
        for call in calls:
            assert steps[call["parent"]]["name"] == "BaseWorkflowAgent.run_agent_step"
            assert call["durationMs"] > 0
        (tool,) = trace_spans.tool_steps(steps)
        assert steps[tool["parent"]]["name"] == "BaseWorkflowAgent.call_tool"
        assert json.loads(tool["input"]) == {"city": city}
        assert f"sunny in {city}" in tool["output"] and tool["status"] == "ok"
        assert [s["name"] for s in item_trace(replayed[key].id)] == [s["name"] for s in steps]
    scores = Evaluation.objects.filter(item__in=recorded.values()).values_list("score", flat=True)
    assert list(scores) == [1.0] * 3
