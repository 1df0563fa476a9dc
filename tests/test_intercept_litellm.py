"""LiteLLM's async calls (aiohttp underneath) recorded, then replayed with the provider stopped
(issue 34): before, they were not recorded and `--replay` sent them to the provider."""

from __future__ import annotations

import pytest

from tests.conftest import Project
from tests.fake_provider import FakeProvider
from tests.helpers import run_with
from tests.test_intercept_http import outcomes, traces_of

pytestmark = pytest.mark.django_db(transaction=True)

ITEMS = [{"id": f"q{i}", "q": f"word{i}"} for i in range(3)]


def test_litellm_async_is_recorded_then_replayed_with_the_provider_stopped(
    project: Project, monkeypatch
):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import
    provider = FakeProvider().start()
    base = provider.openai_base_url

    async def runner(ctx):
        import litellm

        reply = await litellm.acompletion(
            model="openai/gpt-4o-mini",
            api_base=base,
            api_key="sk-test-litellm-SECRET-0003",
            messages=[{"role": "user", "content": f"ECHO: say {ctx.item['q']}"}],
        )
        return f"{reply.choices[0].message.content} {reply.id}"

    try:
        recorded = run_with(
            project, [], runner, name="litellm", items=ITEMS, overrides={"replay": "record"}
        )
        first = outcomes(recorded)
        assert {status for status, _, _ in first.values()} == {"ok"}, first
        assert provider.request_count("/v1/chat") == len(ITEMS)
    finally:
        provider.stop()
    replayed = run_with(
        project, [], runner, name="litellm", items=ITEMS, overrides={"replay": "replay"}
    )
    assert outcomes(replayed) == first
    assert outcomes(replayed)["q1"][1].startswith("say word1 ")
    # LiteLLM calls the OpenAI SDK, whose instrumented span is the model call's step.
    for steps in traces_of(replayed).values():
        assert [(s["kind"], s.get("replayed")) for s in steps] == [("llm", True)]
