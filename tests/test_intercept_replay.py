"""Tool calls recorded and replayed (`cobalt run --record` / `--replay`): the support agent's
model side is the OpenAI SDK against a fake provider, its search tool an `@cobalt.tool` that
asks a real HTTP server on 127.0.0.1; both are stopped before the replay."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest

import cobalt
from cobalt import Dataset, Evaluator
from cobalt_app import recording_store
from cobalt_app.models import ItemResult
from tests.conftest import Project
from tests.fake_provider import FakeProvider
from tests.helpers import define, execute_one
from tests.test_replay import by_key, latest_results, output, urls
from tests.test_replay import cobalt as run_cobalt

AGENT = """
import json
import os
import urllib.request

import openai

import cobalt
from cobalt import Dataset, Evaluator, experiment

client = openai.OpenAI()
TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}}}}]


@cobalt.tool
def search(q: str) -> list:
    url = os.environ["SEARCH_URL"] + "?q=" + q.replace(" ", "+")
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


dataset = Dataset(items=[
    {"id": "refund", "input": "refund window", "expected_output": "30 days"},
    {"id": "shipping", "input": "shipping time", "expected_output": "3 to 5 days"},
])


@experiment("support", dataset, concurrency=2, evaluators=[
    Evaluator(name="mentions", type="contains", field="expected_output"),
    Evaluator(name="searched", type="intercepted", tool="search", times=1),
])
def run(ctx):
    question = ctx.item["input"]
    messages = [{"role": "user", "content": question + ' [[tool:{"q": "' + question + '"}]]'}]
    reply = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
    call = reply.choices[0].message.tool_calls[0]
    found = search(**json.loads(call.function.arguments))
    messages += [reply.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": json.dumps(found)}]
    final = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
    return final.choices[0].message.content
"""

ANSWERS = {"refund window": "Refunds within 30 days", "shipping time": "Ships in 3 to 5 days"}


class SearchServer:
    """A search API on 127.0.0.1 that counts its requests."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                q = self.path.partition("?q=")[2].replace("+", " ")
                owner.requests.append(q)
                body = json.dumps([{"title": ANSWERS.get(q, "nothing")}]).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/search"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def search_server() -> Iterator[SearchServer]:
    server = SearchServer()
    yield server
    server.stop()


def test_recorded_tool_calls_replay_with_the_tool_server_and_the_provider_stopped(
    project: Project, search_server: SearchServer
):
    project.write("experiments/support.cobalt.py", AGENT)
    provider = FakeProvider().start()
    env = {**urls(provider), "SEARCH_URL": search_server.url}
    try:
        recorded = run_cobalt(project, env, "run", "--record")
        assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    finally:
        provider.stop()
    search_server.stop()
    assert sorted(search_server.requests) == ["refund window", "shipping time"]
    live = by_key(latest_results(project, "support"))

    replayed = run_cobalt(project, env, "run", "--replay")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    results = latest_results(project, "support")
    again = by_key(results)
    for key, item in live.items():
        assert item["status"] == "ok", item["error"]
        assert again[key]["status"] == "ok", again[key]["error"]
        assert output(again[key]) == output(item)
        assert "30 days" in output(item) or "3 to 5 days" in output(item)
        scores = {n: e["score"] for n, e in again[key]["evaluations"].items()}
        assert scores == {"mentions": 1.0, "searched": 1.0}
        (tool,) = [s for s in again[key]["trace"] if s["kind"] == "tool"]
        assert tool["intercepted"] == "replayed"
        assert again[key]["output"]["metadata"]["intercepted"] == {"replayed": 1}
    assert results["summary"]["intercepted"] == {"replayed": 2}


pytestmark_db = pytest.mark.django_db(transaction=True)
CALLS: list[str] = []


SECRET = "sk-tool-SECRET-0042"


@cobalt.tool
def lookup(q: str, api_key: str = SECRET) -> dict:
    CALLS.append(q)
    if q == "broken":
        raise ValueError(f"the index is corrupt (key {api_key})")
    return {"answer": q.upper(), "echo": f"called with {api_key}"}


def asks(ctx) -> list:
    answers = []
    for q in ctx.item["questions"]:
        try:
            answers.append(lookup(q))
        except Exception as exc:
            answers.append(f"{type(exc).__name__}: {exc}")
    return answers


@pytestmark_db
def test_a_tool_call_not_recorded_fails_its_item_naming_the_call(project: Project, monkeypatch):
    monkeypatch.setenv("SEARCH_API_KEY", SECRET)  # a secret of the process: never stored
    data = [{"id": "a", "questions": ["refund", "broken"]}, {"id": "b", "questions": ["x"]}]
    first = execute_one(
        project,
        define("lookups", Dataset(items=data), asks, evaluators=[]),
        overrides={"replay": "record"},
    )
    recorded = {r.item_key: r.output for r in ItemResult.objects.filter(run=first)}
    assert recorded["a"][0]["answer"] == "REFUND"
    stored = json.dumps(list(recording_store.load_experiment("lookups").values()))
    assert '"tool": "lookup"' in stored and SECRET not in stored
    CALLS.clear()
    changed = [data[0], {"id": "b", "questions": ["y"]}]
    second = execute_one(
        project,
        define(
            "lookups",
            Dataset(items=changed),
            asks,
            evaluators=[Evaluator(name="n", type="function", fn=lambda c: 1.0)],
        ),
        overrides={"replay": "replay"},
    )
    assert CALLS == []  # no tool ran
    found = {r.item_key: r for r in ItemResult.objects.filter(run=second)}
    assert found["a"].status == "ok"
    replayed_answer, replayed_error = found["a"].output
    assert replayed_answer["answer"] == "REFUND" and SECRET not in replayed_answer["echo"]
    assert replayed_error.startswith("ToolFailed: ValueError: the index is corrupt (key ")
    assert replayed_error.endswith("(replayed from the recording)")
    assert found["b"].status == "error"
    assert found["b"].error.startswith("no recorded result for tool lookup(q='y')")
