"""Tests for the fake LLM provider, driven through the real openai/anthropic SDKs."""

from __future__ import annotations

import json
import math
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.fake_provider import INVALID_JSON_REPLY, FakeProvider

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fp() -> Iterator[FakeProvider]:
    with FakeProvider() as provider:
        yield provider


def openai_client(fp: FakeProvider, max_retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=fp.openai_base_url, api_key="test", max_retries=max_retries)


def anthropic_client(fp: FakeProvider, max_retries: int = 0) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=fp.anthropic_base_url, api_key="test", max_retries=max_retries
    )


def chat(client: openai.OpenAI, content: str) -> str | None:
    response = client.chat.completions.create(
        model="gpt-fake", messages=[{"role": "user", "content": content}]
    )
    return response.choices[0].message.content


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def test_chat_echoes_the_last_user_message_after_the_echo_prefix(fp: FakeProvider) -> None:
    client = openai_client(fp)
    response = client.chat.completions.create(
        model="gpt-fake",
        messages=[
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "ECHO:   Paris is the capital of France.  "},
        ],
    )
    assert response.choices[0].message.content == "Paris is the capital of France."
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].finish_reason == "stop"
    assert response.model == "gpt-fake"
    assert response.usage is not None
    assert response.usage.completion_tokens == 6
    assert response.usage.total_tokens == response.usage.prompt_tokens + 6
    assert fp.request_count("/v1/chat") == 1
    assert fp.requests[0]["headers"]["authorization"] == "Bearer test"


def test_reply_marker_scripts_the_exact_reply_text(fp: FakeProvider) -> None:
    scripted = '```json\n{"score": 0.5, "reason": "fenced"}\n```'
    assert chat(openai_client(fp), f"judge this [[reply:{scripted}]] please") == scripted


def test_score_marker_makes_the_judge_reply_with_that_score(fp: FakeProvider) -> None:
    client = openai_client(fp)
    assert json.loads(chat(client, "Rate the answer. [[score:0.73]]") or "") == {
        "score": 0.73,
        "reason": "fake judge: scripted score",
    }
    assert json.loads(chat(client, "Rate the answer.") or "") == {
        "score": 1.0,
        "reason": "fake judge: default",
    }


def test_embeddings_of_similar_texts_are_closer_than_unrelated_ones(fp: FakeProvider) -> None:
    client = openai_client(fp)
    texts = [
        "The cat sat on the mat",
        "the cat sat on the mat",
        "The cat sat on the red mat",
        "Quantum chromodynamics describes gluons",
    ]
    for encoding in ("float", "base64"):  # the SDK asks for base64 unless told otherwise
        kwargs = {"encoding_format": encoding} if encoding == "float" else {}
        response = client.embeddings.create(model="emb-fake", input=texts, **kwargs)
        vectors = [item.embedding for item in response.data]
        assert [item.index for item in response.data] == [0, 1, 2, 3]
        assert all(len(v) == 64 for v in vectors)
        assert cosine(vectors[0], vectors[1]) == pytest.approx(1.0)
        assert cosine(vectors[0], vectors[2]) > 0.8
        assert abs(cosine(vectors[0], vectors[3])) < 0.3
    single = client.embeddings.create(model="emb-fake", input="hello world")
    assert len(single.data) == 1
    assert single.usage.prompt_tokens == 2


def test_anthropic_messages_reply_with_text_and_usage(fp: FakeProvider) -> None:
    client = anthropic_client(fp)
    message = client.messages.create(
        model="claude-fake",
        max_tokens=100,
        system="You are a careful agent.",
        messages=[{"role": "user", "content": "ECHO: hello from claude"}],
    )
    assert message.type == "message"
    assert message.role == "assistant"
    assert message.stop_reason == "end_turn"
    assert message.content[0].type == "text"
    assert message.content[0].text == "hello from claude"
    assert message.usage.input_tokens == 9
    assert message.usage.output_tokens == 3
    assert fp.requests[0]["path"] == "/v1/messages"
    headers = fp.requests[0]["headers"]  # SDK versions differ: x-api-key or a bearer token
    assert "test" in (
        headers.get("x-api-key"),
        headers.get("authorization", "").removeprefix("Bearer "),
    )


def test_rate_limit_with_retry_after_is_retried_by_the_sdk_after_the_delay(
    fp: FakeProvider,
) -> None:
    fp.fail_next(1, status=429, retry_after=0.5)
    assert chat(openai_client(fp, max_retries=2), "ECHO: finally") == "finally"
    times = [r["time"] for r in fp.requests]
    assert len(times) == 2
    assert times[1] - times[0] >= 0.5


def test_scripted_failures_use_provider_specific_error_bodies(fp: FakeProvider) -> None:
    fp.fail_next(1, status=429, retry_after=None)
    with pytest.raises(anthropic.RateLimitError) as anthropic_error:
        anthropic_client(fp).messages.create(
            model="claude-fake", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    assert anthropic_error.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert "retry-after" not in anthropic_error.value.response.headers

    fp.fail_next(1, status=500, retry_after=2)
    with pytest.raises(openai.InternalServerError) as openai_error:
        chat(openai_client(fp), "hi")
    assert openai_error.value.response.headers["retry-after"] == "2"
    assert openai_error.value.response.headers["retry-after-ms"] == "2000"
    assert chat(openai_client(fp), "ECHO: recovered") == "recovered"


def test_a_scripted_400_carries_its_message_and_bodies_are_logged(fp: FakeProvider) -> None:
    fp.fail_next(1, status=400, retry_after=None, message="The model `gpt-nope` does not exist")
    with pytest.raises(openai.BadRequestError) as error:
        chat(openai_client(fp), "hi")
    assert error.value.body["message"] == "The model `gpt-nope` does not exist"  # type: ignore[index]
    logged = httpx.get(fp.url + "/_requests").json()["requests"]
    assert logged == [
        {
            "path": "/v1/chat/completions",
            "json": {"model": "gpt-fake", "messages": [{"role": "user", "content": "hi"}]},
        }
    ]


def test_invalid_json_next_returns_prose_instead_of_json(fp: FakeProvider) -> None:
    fp.invalid_json_next(1)
    client = openai_client(fp)
    assert chat(client, "Rate this [[score:0.2]]") == INVALID_JSON_REPLY
    assert json.loads(chat(client, "Rate this [[score:0.2]]") or "")["score"] == 0.2


def test_missing_api_key_header_is_rejected_with_401(fp: FakeProvider) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for path in ("/v1/chat/completions", "/v1/messages"):
        response = httpx.post(fp.url + path, json=body)
        assert response.status_code == 401
        assert "error" in response.json()
    with_key = httpx.post(fp.url + "/v1/messages", json=body, headers={"x-api-key": "k"})
    assert with_key.status_code == 200


def test_latency_is_applied_to_every_model_request(fp: FakeProvider) -> None:
    fp.latency = 0.3
    started = time.monotonic()
    assert chat(openai_client(fp), "ECHO: slow") == "slow"
    assert time.monotonic() - started >= 0.3


def test_concurrent_requests_are_not_serialized(fp: FakeProvider) -> None:
    fp.latency = 0.3
    client = openai_client(fp)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=20) as pool:
        replies = list(pool.map(lambda i: chat(client, f"ECHO: {i}"), range(40)))
    assert replies == [str(i) for i in range(40)]
    assert time.monotonic() - started < 2.0  # serialized would take 12 s


def test_reset_clears_records_and_scripts(fp: FakeProvider) -> None:
    chat(openai_client(fp), "hi")
    fp.fail_next(3)
    fp.invalid_json_next(3)
    fp.reset()
    assert fp.request_count() == 0
    assert chat(openai_client(fp), "ECHO: clean") == "clean"


def read_line_with_deadline(process: subprocess.Popen[str], timeout: float) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while (remaining := deadline - time.monotonic()) > 0:
            if selector.select(timeout=remaining):
                return process.stdout.readline()
    raise TimeoutError("fake provider did not print its URL in time")


def test_module_runs_as_a_subprocess_controlled_over_http() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.fake_provider", "--port", "0", "--latency", "0"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = read_line_with_deadline(process, timeout=20).strip()
        assert line.startswith("FAKE_PROVIDER_URL=http://127.0.0.1:")
        url = line.split("=", 1)[1]
        with httpx.Client(base_url=url, timeout=10) as http:
            control = http.post(
                "/_control",
                json={"reset": True, "latency": 0.05, "fail_next": {"n": 1, "status": 503}},
            )
            assert control.json()["fail_next"] == 1
            client = openai.OpenAI(base_url=url + "/v1", api_key="test", max_retries=0)
            with pytest.raises(openai.InternalServerError):
                chat(client, "hi")
            assert chat(client, "ECHO: from subprocess") == "from subprocess"
            stats = http.get("/_stats").json()
        assert stats["requests"] == 2
        assert stats["by_path"] == {"/v1/chat/completions": 2}
        assert stats["latency"] == 0.05
        assert len(stats["wall_times"]) == 2
        assert stats["wall_times"][1] - stats["wall_times"][0] >= 0.05
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()
    assert process.returncode == 0
