"""Never a silent pass: a trace that could not be captured says so everywhere, and every
evaluator that reads the trace gives an evaluation error instead of a score.

Two real causes: tracing turned off by setting, and OpenInference's real `OpenAIInstrumentor`
refusing an `openai` older than it supports (a stand-in release, tests/fixtures/old_openai, put
first on the PYTHONPATH of a real `cobalt run`: the real SDK is never touched).
"""

from __future__ import annotations

import json
import re

import openai
import pytest
from django.test import Client
from rest_framework.test import APIClient

from cobalt import Dataset, Evaluator
from cobalt.config import load_config
from cobalt_app import traces
from cobalt_app.models import Evaluation, ItemResult
from cobalt_cli.mcp.project import Project as McpProject
from cobalt_cli.mcp.reports import header_of
from tests.conftest import REPO
from tests.helpers import define, execute

pytestmark = pytest.mark.django_db(transaction=True)

OLD_OPENAI = REPO / "tests" / "fixtures" / "old_openai"
REFUSED = "openai 1.109.0 is outside what its instrumentation traces (openai >= 2.8.0)"

READERS = [
    Evaluator(name="steps", type="steps", max_llm_calls=5),
    Evaluator(name="no-loops", type="loops"),
    Evaluator(name="searched", type="tool-used", tool="search"),
    Evaluator(name="calls", type="tool-calls"),
    Evaluator(name="exact", type="exact-match", field="expected"),
]

OLD_SDK_EXPERIMENT = """
import cobalt
import openai  # tests/fixtures/old_openai: 1.109.0, which the instrumentation refuses
from cobalt import Dataset, Evaluator, experiment

@cobalt.tool
def search(query):
    return ["refunds take 5 days"]

def agent(ctx):
    search(ctx.item["input"])  # a step Cobalt does see: the trace is not empty
    reply = openai.OpenAI().chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "ECHO: yes"}]
    )
    return reply["choices"][0]["message"]["content"]

experiment(
    "old-sdk",
    Dataset(items=[{"id": "a", "input": "refund?", "expected": "yes"},
                   {"id": "b", "input": "delay?", "expected": "yes"}]),
    agent,
    evaluators=[
        Evaluator(name="steps", type="steps", max_llm_calls=5),
        Evaluator(name="exact", type="exact-match", field="expected"),
    ],
)
"""


def openai_call(client: openai.OpenAI, text: str) -> str:
    reply = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": f"ECHO: {text}"}]
    )
    return reply.choices[0].message.content


def test_with_tracing_off_every_item_says_why_and_trace_evaluators_error(
    project, fake_provider, monkeypatch
):
    project.write("cobalt.toml", "[trace]\nenabled = false\n")
    monkeypatch.chdir(project.path)
    client = openai.OpenAI()
    calls = [{"name": "search", "arguments": {}}]
    items = [{"id": k, "input": "q", "expected": "yes", "expected_tool_calls": calls} for k in "ab"]
    (run,) = execute(
        project,
        define(
            "off", Dataset(items=items), lambda ctx: openai_call(client, "yes"), evaluators=READERS
        ),
    )
    run.refresh_from_db()

    why = f"the trace was not captured: {traces.OFF}"
    errors = Evaluation.objects.filter(run=run).exclude(evaluator="exact")
    assert sorted(set(errors.values_list("status", "error"))) == [("error", why)]
    assert errors.count() == 8
    exact = Evaluation.objects.filter(run=run, evaluator="exact")
    assert list(exact.values_list("score", flat=True)) == [1.0, 1.0]  # the output still scores
    assert run.summary["traceNotCaptured"] == [{"why": traces.OFF, "items": 2}]

    # The API's run detail (the results file's header) and item, the MCP run header.
    api = APIClient(HTTP_HOST="127.0.0.1")
    api.force_authenticate(user=_user())
    detail = api.get(f"/api/runs/{run.id}/").json()
    assert detail["traceNotCaptured"] == [{"why": traces.OFF, "items": 2}]
    page = api.get(f"/api/runs/{run.id}/items/").json()
    assert [i["traceNotCaptured"] for i in page["results"]] == [traces.OFF, traces.OFF]
    mcp = header_of(run, McpProject(load_config(project.path)), 1000)
    assert mcp["traceNotCaptured"] == [{"why": traces.OFF, "items": 2}]

    # The run page and the item page, where the trace would be (escaped text).
    browser = Client(HTTP_HOST="127.0.0.1")
    run_page = browser.get(f"/runs/{run.id}/").content.decode()
    assert "Trace not captured for 2 items: tracing is off (`trace.enabled = false`)" in run_page
    item = ItemResult.objects.get(run=run, item_index=0)
    item_page = browser.get(f"/runs/{run.id}/items/{item.number}/").content.decode()
    notice = re.search(r'<p [^>]*id="trace-not-captured"[^>]*>(.*?)</p>', item_page, re.S)
    assert notice and "Not captured: tracing is off" in notice.group(1)


def test_an_item_that_made_no_model_call_has_an_empty_trace_not_a_missing_one(
    project, fake_provider
):
    client = openai.OpenAI()

    def runner(ctx):  # calls the model only for the first item
        return openai_call(client, "yes") if ctx.item["id"] == "a" else "yes"

    items = [{"id": k, "input": "q", "expected": "yes"} for k in ("a", "b")]
    steps = Evaluator(name="steps", type="steps", max_llm_calls=5)
    (run,) = execute(project, define("quiet", Dataset(items=items), runner, evaluators=[steps]))
    run.refresh_from_db()

    assert run.summary["traceNotCaptured"] == []
    by_key = {e.item.item_key: e for e in Evaluation.objects.filter(run=run).select_related("item")}
    assert by_key["a"].score == 1.0
    assert by_key["b"].status == "error" and "the trace holds no step" in by_key["b"].error
    assert "not captured" not in by_key["b"].error


def test_an_sdk_its_instrumentation_refuses_is_said_loudly_and_trace_evaluators_error(
    project, cobalt_cli
):
    project.write("experiments/old.cobalt.py", OLD_SDK_EXPERIMENT)
    done = cobalt_cli(project, "run", env={"PYTHONPATH": f"{OLD_OPENAI}:{REPO}"})
    out = " ".join(done.stdout.split())  # rich folds long lines
    assert "Run ID" in done.stdout, done.stdout + done.stderr

    assert f"⚠ Trace: not captured: {REFUSED}" in out  # the header, before any item
    assert f"the trace of 2 items was not captured: {REFUSED}" in out  # the summary
    assert "2 evaluation errors; first: steps: the trace was not captured" in out
    (results_file,) = project.results_files()
    results = json.loads(results_file.read_text())
    assert results["traceNotCaptured"] == [{"why": REFUSED, "items": 2}]
    assert results["summary"]["traceNotCaptured"] == [{"why": REFUSED, "items": 2}]
    for item in results["items"]:
        assert item["traceNotCaptured"] == REFUSED
        # What was seen is kept: the tool, and the model call as a plain HTTP request.
        assert [(s["kind"], s["name"].split(" ")[0]) for s in item["trace"]] == [
            ("tool", "search"),
            ("http", "POST"),
        ]
        assert item["evaluations"]["steps"] == {
            "score": None,
            "verdict": "error",
            "error": f"the trace was not captured: {REFUSED}",
        }
        assert item["evaluations"]["exact"]["score"] == 1.0


def _user():
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user("reader")
