"""The door: `cobalt run --record`, then `cobalt run --replay` with the model provider and the
tool's server both stopped (issue 34): a support agent whose search tool calls an HTTP API
through requests, one item of which declares the search API down (its `fixtures`)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import Project, cli_env
from tests.fake_provider import FakeProvider
from tests.test_intercept_http import ToolServer

AGENT = """
import os

import requests
from openai import OpenAI

from cobalt import Dataset, Evaluator, experiment

SEARCH = os.environ["SEARCH_URL"]
client = OpenAI()
dataset = Dataset.from_file("datasets/support.jsonl")


def search(q):
    reply = requests.get(f"{SEARCH}/search", params={"q": q, "key": "sk-search-SECRET-05"})
    reply.raise_for_status()
    return reply.json()["path"] + "#" + str(reply.json()["n"])


@experiment("support", dataset, concurrency=3, evaluators=[
    Evaluator(name="recovered", type="function",
              fn=lambda ctx: {"score": float("sorry" in ctx.output or "found" in ctx.output)}),
])
def run(ctx):
    try:
        found = "found " + search(ctx.item["input"])
    except requests.HTTPError as exc:
        found = f"sorry, search is down ({exc.response.status_code})"
    reply = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": f"ECHO: {found}"}]
    )
    return reply.choices[0].message.content
"""


def test_record_then_replay_offline_with_every_server_stopped(project: Project):
    items = [{"id": f"t{i}", "input": f"refund {i}"} for i in range(3)]
    tool, provider = ToolServer(), FakeProvider().start()
    items[2]["fixtures"] = [{"route": f"GET {tool.url}/search*", "status": 500}]
    project.write_jsonl("datasets/support.jsonl", items)
    project.write("experiments/support.cobalt.py", AGENT)
    env = cli_env(
        {
            "SEARCH_URL": tool.url,
            "OPENAI_BASE_URL": provider.openai_base_url,
            "OPENAI_API_KEY": "sk-test-openai-SECRET-0001",
        }
    )

    def cobalt(*args: str) -> dict:
        done = subprocess.run(
            [sys.executable, "-m", "cobalt_cli", "run", *args],
            cwd=project.path,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        newest = max(project.results_files(), key=lambda p: p.stat().st_mtime_ns)
        return {i["key"]: i for i in json.loads(newest.read_text())["items"]}

    try:
        recorded = cobalt("--record")
        assert len(tool.seen) == 2  # t2's search was answered by its stub
    finally:
        tool.stop()
        provider.stop()
    replayed = cobalt("--replay")
    for key, item in recorded.items():
        assert replayed[key]["status"] == "ok", replayed[key]
        assert replayed[key]["output"]["output"] == item["output"]["output"]
        assert replayed[key]["evaluations"]["recovered"]["score"] == 1.0
    assert replayed["t0"]["output"]["output"].startswith("found /search#")
    assert replayed["t2"]["output"]["output"] == "sorry, search is down (500)"
    http = [s for s in replayed["t0"]["trace"] if s["kind"] == "http"]
    assert [(s["method"], s["mark"]) for s in http] == [("GET", "replayed")]
    [down] = [s for s in replayed["t2"]["trace"] if s["kind"] == "http"]
    assert (down["mark"], down["statusCode"]) == ("injected", 500)
    assert replayed["t0"]["output"]["metadata"]["intercepted"] == {"replayed": 1}  # the tool's
    assert "SECRET" not in json.dumps(replayed)
