"""A model call that reports no usage is never silently free: its tokens are counted from its
text (tiktoken for OpenAI models, when its encoding is on this machine; ~4 characters a token
otherwise), or said to be unknown, and the run says its cost is not complete."""

from __future__ import annotations

import math

import openai
import pytest
from django.test import Client
from django.urls import reverse
from rich.console import Console

from cobalt import Dataset, Evaluator
from cobalt.usage_notes import cost_text, estimated_usage_note
from cobalt_app import token_counts
from cobalt_app.models import ItemResult
from cobalt_app.selectors import item_trace
from cobalt_cli.reporter import print_summary
from tests.helpers import define, execute

QUESTION = "What is the capital of France? [[reply:Paris is the capital of France.]]"
STREAMED = {
    "llm.input_messages.0.message.role": "system",
    "llm.input_messages.0.message.content": "Be brief.",
    "llm.input_messages.1.message.role": "user",
    "llm.input_messages.1.message.content": QUESTION,
    "llm.output_messages.0.message.role": "assistant",
    "llm.output_messages.0.message.content": "Paris is the capital of France.",
}


def test_an_openai_call_is_counted_with_tiktoken_when_its_encoding_is_here_else_estimated():
    counted = token_counts.count_without_usage("gpt-4o-mini", STREAMED)
    encoding = token_counts.encoding_for("gpt-4o-mini")
    if encoding is None:  # no tiktoken cache on this machine: an estimate, labelled so
        assert token_counts.cache_folder("o200k_base") is None
        assert counted.method == "chars"
    else:
        sent = len(encoding.encode("Be brief.\n" + QUESTION)) + 2 * token_counts.MESSAGE_OVERHEAD
        assert counted == (
            sent,
            len(encoding.encode("Paris is the capital of France.")),
            "tiktoken",
        )


def test_another_model_is_estimated_from_characters_and_no_text_is_unknown():
    counted = token_counts.count_without_usage("claude-sonnet-4-5", STREAMED)
    sent = "Be brief.\n" + QUESTION
    assert counted == (math.ceil(len(sent) / 4), math.ceil(31 / 4), "chars")
    raw = token_counts.count_without_usage(None, {"input.value": "x" * 40, "output.value": "y"})
    assert raw == (10, 1, "chars")
    assert token_counts.count_without_usage("gpt-4o", {}) == (None, None, "unknown")


def test_the_cost_of_unknown_tokens_reads_unknown_never_zero():
    unknown = {"estimatedCost": 0.0, "estimatedUsage": [{"model": "m", "method": "unknown", "calls": 2, "items": 1}]}  # fmt: skip
    assert cost_text(unknown) == "unknown"
    assert cost_text({**unknown, "estimatedCost": 0.5}) == "$0.5000 + unknown"
    assert "2 model calls reported no usage: m: 2 calls unknown (no text to count)" in (
        estimated_usage_note(unknown)
    )
    estimated = {"estimatedCost": 0.25, "estimatedUsage": [{"model": "gpt-4o", "method": "tiktoken", "calls": 1, "items": 1}]}  # fmt: skip
    assert cost_text(estimated) == "~$0.2500" and cost_text({"estimatedCost": 0.25}) == "$0.2500"
    assert estimated_usage_note({"estimatedUsage": []}) is None


def streaming_agent(include_usage: bool):
    def run(ctx):
        client = openai.OpenAI()
        extra = {"stream_options": {"include_usage": True}} if include_usage else {}
        stream = client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": f"{ctx.item['input']} [[reply:Paris.]]"}],
            stream=True,
            **extra,
        )
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    return run


@pytest.mark.django_db(transaction=True)
def test_a_streamed_call_without_usage_marks_the_run_cost_estimated_everywhere(
    project, fake_provider
):
    items = Dataset(items=[{"id": "a", "input": "Capital of France?"}, {"id": "b", "input": "Of Peru?"}])  # fmt: skip
    exact = Evaluator(name="paris", type="function", fn=lambda ctx: float("Paris" in ctx.output))
    without, with_usage = execute(
        project,
        define("no-usage", items, streaming_agent(False), evaluators=[exact]),
        define("usage", items, streaming_agent(True), evaluators=[exact]),
    )
    without.refresh_from_db()
    with_usage.refresh_from_db()
    summary = without.summary
    (entry,) = summary["estimatedUsage"]
    method = "tiktoken" if token_counts.encoding_for("gpt-4o-mini") else "chars"
    assert entry == {"model": "gpt-4o-mini", "method": method, "calls": 2, "items": 2}
    assert summary["costComplete"] is False and summary["estimatedCost"] > 0
    assert summary["agentTokens"] > 0
    note = summary["estimatedUsageNote"]
    assert note.startswith("2 model calls reported no usage: gpt-4o-mini: 2 calls ")
    assert note.endswith("so the cost is an estimate")
    item = ItemResult.objects.get(run=without, item_key="a")
    (step,) = item_trace(item.id)
    assert step["tokensEstimated"] == method and step["inputTokens"] > 0 and step["cost"] > 0

    assert (with_usage.summary["estimatedUsage"], with_usage.summary["costComplete"]) == ([], True)
    assert with_usage.summary["estimatedUsageNote"] is None
    reported = ItemResult.objects.get(run=with_usage, item_key="a")
    assert "tokensEstimated" not in item_trace(reported.id)[0]

    console = Console(record=True, width=200)
    print_summary(console, without)
    printed = console.export_text()
    assert f"estimated cost: ~${summary['estimatedCost']:.4f}" in printed
    assert "⚠ " + note in printed
    page = Client().get(reverse("cobalt:run", args=[without.id])).content.decode()
    assert "(estimated)" in page and note in page
