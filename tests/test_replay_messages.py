""" "no recorded response" names the closest recorded request and quotes what differs, however
long the text a framework puts before the user's input (tests/test_replay.py runs it end to end)."""

from __future__ import annotations

import json

import pytest

from cobalt_app.recordings import NoRecordedResponse, ReplaySettings, Tape
from cobalt_app.replay_diff import closest

URL = "http://127.0.0.1:9/v1/chat/completions"
# What smolagents and CrewAI send before the task: thousands of words of their own prompt.
SYSTEM = "You are an expert assistant who can solve any task using code blobs. " * 200


def chat(task: str, model: str = "gpt-4o-mini") -> dict:
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"New task:\n{task}\nAnswer in one word."},
        ],
    }


def tape(*bodies: dict) -> Tape:
    recorded = [
        {"request": {"method": "POST", "url": URL, "body": body}, "response": {"status": 200}}
        for body in bodies
    ]
    return Tape(ReplaySettings(mode="replay"), recorded)


def miss(item_tape: Tape, body: dict) -> str:
    call = item_tape.call("POST", URL, json.dumps(body).encode())
    assert call is not None
    with pytest.raises(NoRecordedResponse) as raised:
        item_tape.answer(call)
    return str(raised.value)


def test_the_changed_words_are_quoted_after_a_long_framework_prompt():
    message = miss(
        tape(chat("What is the capital of France?")), chat("What is the capital of Peru?")
    )
    assert message.startswith(f"no recorded response for POST {URL} (model gpt-4o-mini, ")
    assert "the closest of the item's 1 recorded request(s) (#1) differs in " in message
    assert 'in messages.1.content: "… is the capital of [-France?-] {+Peru?+} Answer in one' in (
        message
    )
    assert "expert assistant" not in message  # the prefix is not quoted
    assert message.endswith("or let its host through with `[replay] allow_hosts`")


def test_the_closest_of_several_recordings_is_named_with_every_field_that_differs():
    item_tape = tape(
        chat("Summarise the report."),
        chat("What is the capital of France?"),
        {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
    )
    message = miss(item_tape, chat("What is the capital of France?", model="gpt-4o"))
    assert '(#2) differs in model: "[-gpt-4o-mini-] {+gpt-4o+}"' in message


def test_a_request_to_another_endpoint_names_where_the_recording_was_sent():
    assert closest("POST", URL, chat("a"), [("POST", URL + "/other", chat("a"))]) == (
        0,
        f"in where it was sent: POST {URL}/other",
    )


def test_a_production_traces_model_call_is_compared_by_its_messages():
    conversation = {"messages": [{"role": "user", "content": "sunny in Tartu"}]}
    sent = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "rainy in Tartu"}]}
    assert closest("POST", URL, sent, [("POST", None, conversation)]) == (
        0,
        'in messages.0.content: "[-sunny-] {+rainy+} in Tartu"',
    )


def test_an_item_without_recordings_says_so():
    message = miss(tape(), chat("anything"))
    assert "this item has no recording" in message


def test_a_long_change_is_cut_and_the_count_of_changes_is_given():
    then = {"messages": [{"role": "user", "content": " ".join(f"w{n}" for n in range(100))}]}
    now_words = [f"w{n}" if n % 20 else f"X{n}" for n in range(100)]
    now = {"messages": [{"role": "user", "content": " ".join(now_words)}]}
    _, difference = closest("POST", URL, now, [("POST", URL, then)])
    assert difference.count("in messages.0.content") == 3
    assert difference.endswith("; and 2 more change(s)")
    replaced = {"messages": [{"role": "user", "content": " ".join(f"z{n}" for n in range(100))}]}
    _, difference = closest("POST", URL, replaced, [("POST", URL, then)])
    assert "…(+88 words)" in difference and len(difference) < 400
