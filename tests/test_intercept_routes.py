"""HTTP route stubs and faults (`cobalt.stub("GET https://host/path*", ...)`, an item's
`fixtures`) answered by each client's transport without going out (issue 34): httpx sync
and async, aiohttp and requests alike. The tool server of `test_intercept_http` runs, and
counts what reaches it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest
from django.test import Client
from django.urls import reverse

import cobalt
from cobalt import Dataset, Evaluator
from tests.conftest import Project
from tests.helpers import define, execute_one
from tests.test_intercept_http import ToolServer, outcomes, traces_of

pytestmark = pytest.mark.django_db(transaction=True)

CLIENTS = ("httpx", "httpx-async", "aiohttp", "requests", "urllib")


@pytest.fixture
def tool() -> Iterator[ToolServer]:
    server = ToolServer()
    try:
        yield server
    finally:
        server.stop()


async def send(client: str, method: str, url: str, body: dict | None = None) -> tuple:
    """(status, text) of one request through `client`, or ("raised", the error's class)."""
    import aiohttp
    import httpx
    import requests

    try:
        if client == "httpx":
            with httpx.Client(timeout=5) as c:
                reply = await asyncio.to_thread(c.request, method, url, json=body)
            return reply.status_code, reply.text
        if client == "httpx-async":
            async with httpx.AsyncClient(timeout=5) as c:
                reply = await c.request(method, url, json=body)
            return reply.status_code, reply.text
        if client == "aiohttp":
            async with aiohttp.ClientSession() as s, s.request(method, url, json=body) as reply:
                return reply.status, await reply.text()
        if client == "urllib":
            return await asyncio.to_thread(stdlib, method, url, body)
        reply = await asyncio.to_thread(requests.request, method, url, json=body, timeout=5)
        return reply.status_code, reply.text
    except (httpx.TimeoutException, aiohttp.ServerTimeoutError, requests.Timeout) as exc:
        return "timed out", type(exc).__name__


def stdlib(method: str, url: str, body: dict | None) -> tuple:
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except TimeoutError as exc:
        return "timed out", type(exc).__name__


def run_evaluations(run) -> list:
    from cobalt_app.models import Evaluation

    return list(Evaluation.objects.filter(run=run).select_related("item"))


def agent(base: str):
    async def runner(ctx) -> dict:
        client = ctx.item["client"]
        found = {}
        found["json"] = await send(client, "GET", f"{base}/search?q=refunds")
        found["fixture"] = await send(client, "GET", f"{base}/docs/1")
        found["fn"] = await send(client, "POST", f"{base}/echo", {"ask": client})
        found["first 500"] = await send(client, "GET", f"{base}/flaky")
        found["then live"] = await send(client, "GET", f"{base}/flaky")
        found["429"] = await send(client, "GET", f"{base}/limited")
        found["malformed"] = await send(client, "GET", f"{base}/bad")
        found["timeout"] = await send(client, "GET", f"{base}/slow")
        started = time.perf_counter()
        found["delayed"] = await send(client, "GET", f"{base}/late")
        found["waited"] = time.perf_counter() - started >= 0.2
        return found

    return runner


def test_route_stubs_and_faults_answer_every_client_without_going_out(
    project: Project, tool: ToolServer
):
    project.write("fixtures/doc.json", '{"title": "Refund policy"}')
    base = tool.url
    stubs = [
        cobalt.stub(f"GET {base}/search*", returns={"hits": ["Refunds within 30 days"]}),
        cobalt.stub(f"GET {base}/docs/*", fixture="doc.json"),
        cobalt.stub(f"POST {base}/echo", fn=lambda request: {"got": request.json()}),
        cobalt.stub(f"GET {base}/limited", status=429, body={"error": "slow down"}),
        cobalt.stub(f"GET {base}/bad", malformed=True),
        cobalt.stub(f"GET {base}/slow", timeout=True),
        cobalt.stub(f"* {base}/late", body="ok", delay=0.2),
    ]
    # The item's own declaration: the first call of /flaky fails, the next goes out.
    flaky = {"route": f"GET {base}/flaky", "status": 500, "body": "down", "times": 1}
    data = [{"id": client, "client": client, "fixtures": [flaky]} for client in CLIENTS]
    evaluators = [  # what was sent, read from the item's HTTP steps
        Evaluator(name="flaky-twice", type="intercepted", route=f"GET {base}/flaky", times=2),
        Evaluator(
            name="asked", type="intercepted", route=f"POST {base}/echo", arguments={"ask": "*"}
        ),
        Evaluator(name="no-delete", type="intercepted", route=f"DELETE {base}/*", times=0),
    ]
    experiment = define(
        "routes", Dataset(items=data), agent(base), intercept=stubs, evaluators=evaluators
    )
    run = execute_one(project, experiment)

    found = outcomes(run)
    for client in CLIENTS:
        status, output, error = found[client]
        assert status == "ok", error
        assert json.loads(output["json"][1]) == {"hits": ["Refunds within 30 days"]}
        assert json.loads(output["fixture"][1]) == {"title": "Refund policy"}
        assert json.loads(output["fn"][1]) == {"got": {"ask": client}}
        assert output["first 500"] == [500, "down"]
        assert output["then live"][0] == 200
        assert json.loads(output["then live"][1])["path"] == "/flaky"
        assert output["429"] == [429, '{"error": "slow down"}']
        assert output["malformed"][0] == 200
        with pytest.raises(ValueError):
            json.loads(output["malformed"][1])
        assert output["timeout"][0] == "timed out", (client, output["timeout"])
        assert output["delayed"] == [200, "ok"]
        assert output["waited"] is True
    assert [s["path"] for s in tool.seen] == ["/flaky"] * len(CLIENTS)  # nothing else went out
    scores = {(e.item.item_key, e.evaluator): (e.score, e.reason) for e in run_evaluations(run)}
    assert {score for score, _ in scores.values()} == {1.0}, scores
    assert len(scores) == 3 * len(CLIENTS)

    steps = traces_of(run)["aiohttp"]
    marks = [(s["name"].split("/", 1)[1], s["mark"], s["statusCode"]) for s in steps]
    assert marks == [
        ("search", "stubbed", 200),
        ("docs/1", "stubbed", 200),
        ("echo", "stubbed", 200),
        ("flaky", "injected", 500),
        ("flaky", "live", 200),
        ("limited", "injected", 429),
        ("bad", "injected", 200),
        ("slow", "injected", None),
        ("late", "stubbed", 200),
    ]
    assert steps[-1]["durationMs"] >= 200
    assert json.loads(steps[2]["input"]) == {"ask": "aiohttp"}
    assert run.items.get(item_key="requests").metadata["intercepted"] == {
        "stubbed": 4,
        "injected": 4,
    }

    item = run.items.get(item_key="aiohttp")  # its item panel shows each request's status
    page = Client().get(reverse("cobalt:item", args=[run.id, item.number])).content.decode()
    assert page.count('class="http-status"') == 9
    assert ">500</code>" in page and ">no reply</code>" in page and ">live</span>" in page
