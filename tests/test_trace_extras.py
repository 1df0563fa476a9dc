"""A framework whose instrumentation extra is not installed: its model calls are still traced
(through the SDK underneath), and the run's header says which extra shows its own steps;
no item's trace is marked "not captured" for it."""

from __future__ import annotations

import sys
import types

import openai
import pytest

from cobalt import Dataset, load_config
from cobalt_app import traces
from cobalt_app.models import ItemResult, ItemTrace
from cobalt_app.selectors import item_trace
from tests.helpers import define, execute

pytestmark = pytest.mark.django_db(transaction=True)

HINT = (
    "CrewAI's own steps are not traced, only its model calls: pip install 'cobalt-agents[crewai]'"
)


def test_a_framework_without_its_extra_is_a_hint_not_a_missing_trace(
    project, fake_provider, monkeypatch
):
    # CrewAI cannot share this environment (it needs mcp<2); the agent imported something
    # that is it as far as Cobalt can tell (a `crewai` module with `Crew`), and
    # `openinference-instrumentation-crewai` is not installed.
    crewai = types.ModuleType("crewai")
    crewai.Crew = object
    monkeypatch.setitem(sys.modules, "crewai", crewai)
    assert traces.header(load_config(project.path)) == HINT

    client = openai.OpenAI()

    def runner(ctx):
        messages = [{"role": "user", "content": "ECHO: hi"}]
        reply = client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        return reply.choices[0].message.content

    (run,) = execute(project, define("flat", Dataset(items=[{"id": "a"}]), runner))
    item = ItemResult.objects.get(run=run)
    assert [s["kind"] for s in item_trace(item.id)] == ["llm"]
    assert ItemTrace.objects.get(item=item).missing == ""
