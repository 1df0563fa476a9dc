"""Replay never goes live (issue 34, the HTTP half): every outbound connection of an item in
`--replay` is answered from its recording or refused, whatever the client.

The agents are real clients (httpx sync and async, aiohttp, requests, urllib3, a raw socket,
LiteLLM, a LangChain tool) calling a small threaded HTTP server of the test's own on
127.0.0.1 (or the fake provider), which is stopped before replaying: a request that reached
for it would fail its item. Runs are in-process through the real engine (`tests.helpers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import Project
from tests.helpers import run_with

pytestmark = pytest.mark.django_db(transaction=True)


class Tool(BaseHTTPRequestHandler):
    """A tool's API: answers JSON naming the request and a counter (unique per reply)."""

    def _answer(self) -> None:
        server = self.server
        with server.lock:  # type: ignore[attr-defined]
            server.count += 1  # type: ignore[attr-defined]
            n = server.count  # type: ignore[attr-defined]
        length = int(self.headers.get("content-length") or 0)
        sent = self.rfile.read(length).decode() if length else ""
        server.seen.append({"path": self.path, "headers": dict(self.headers)})  # type: ignore[attr-defined]
        path = self.path.split("?")[0]
        body = json.dumps({"n": n, "path": path, "sent": sent}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


class ToolServer:
    def __init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Tool)
        self.server.count, self.server.seen, self.server.lock = 0, [], threading.Lock()  # type: ignore[attr-defined]
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.stopped = False

    @property
    def seen(self) -> list[dict]:
        return self.server.seen  # type: ignore[attr-defined]

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def tool() -> Iterator[ToolServer]:
    server = ToolServer()
    try:
        yield server
    finally:
        server.stop()


def outcomes(run) -> dict[str, tuple[str, object, str]]:
    """item key -> (status, output, error)."""
    from cobalt_app.models import ItemResult

    rows = ItemResult.objects.filter(run_id=run.id).values_list(
        "item_key", "status", "output", "error"
    )
    return {key: (status, output, error or "") for key, status, output, error in rows}


def traces_of(run) -> dict[str, list[dict]]:
    from cobalt_app import trace_store
    from cobalt_app.models import ItemResult

    keys = dict(ItemResult.objects.filter(run_id=run.id).values_list("id", "item_key"))
    return {keys[item_id]: steps for item_id, steps in trace_store.read(keys).items()}


ITEMS = [{"id": f"q{i}", "q": f"word{i}"} for i in range(3)]


def every_client(base: str):
    """An async runner sending one request through each client; the output joins the replies'
    counters (a replayed run shows the recorded ones)."""

    async def runner(ctx):
        import urllib.request

        import aiohttp
        import httpx
        import requests
        import urllib3

        q = ctx.item["q"]
        counters = []

        def sync_part() -> None:
            counters.append(requests.get(f"{base}/requests?q={q}", timeout=5).json()["n"])
            with urllib3.PoolManager() as pool:
                counters.append(json.loads(pool.request("GET", f"{base}/urllib3?q={q}").data)["n"])
            with httpx.Client() as client:
                counters.append(client.post(f"{base}/httpx", json={"q": q}).json()["n"])
            with urllib.request.urlopen(f"{base}/stdlib?q={q}", timeout=5) as reply:
                counters.append(json.loads(reply.read())["n"])

        await asyncio.to_thread(sync_part)
        async with httpx.AsyncClient() as client:
            counters.append((await client.get(f"{base}/httpx-async", params={"q": q})).json()["n"])
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{base}/aiohttp", json={"q": q}) as reply:
                counters.append((await reply.json())["n"])
            async with session.get(f"{base}/aiohttp-stream?q={q}") as reply:
                chunks = [chunk async for chunk in reply.content.iter_chunked(4)]
                counters.append(json.loads(b"".join(chunks))["n"])
        return " ".join(map(str, counters))

    return runner


def test_every_client_is_recorded_then_replayed_with_its_server_stopped(
    project: Project, tool: ToolServer
):
    runner = every_client(tool.url)
    recorded = run_with(
        project, [], runner, name="clients", items=ITEMS, overrides={"replay": "record"}
    )
    first = outcomes(recorded)
    assert {status for status, _, _ in first.values()} == {"ok"}, first
    assert len(tool.seen) == 7 * len(ITEMS)
    marks = {step["mark"] for steps in traces_of(recorded).values() for step in steps}
    assert marks == {"recorded"}
    tool.stop()

    replayed = run_with(
        project, [], runner, name="clients", items=ITEMS, overrides={"replay": "replay"}
    )
    again = outcomes(replayed)
    assert again == first
    steps = traces_of(replayed)["q0"]
    assert [s["kind"] for s in steps] == ["http"] * 7
    assert {s["mark"] for s in steps} == {"replayed"}
    assert {s["method"] for s in steps} == {"GET", "POST"}
    assert all(s["statusCode"] == 200 and s["url"].startswith(tool.url) for s in steps)


def test_a_request_replay_cannot_answer_is_refused_naming_host_and_port(
    project: Project, tool: ToolServer
):
    """No recording for the item: its request is refused, even if the agent swallows the
    error; the server sees nothing."""

    def runner(ctx):
        import requests

        with contextlib.suppress(BaseException):  # an agent that swallows everything
            requests.get(f"{tool.url}/search?q=x", timeout=5)
        return "went on"

    run = run_with(
        project, [], runner, name="refused", items=ITEMS[:1], overrides={"replay": "replay"}
    )
    [(status, _, error)] = outcomes(run).values()
    assert status == "error"
    assert error.startswith("no recorded response for GET")
    assert f"127.0.0.1:{tool.port}" in error
    assert tool.seen == []


def test_a_raw_socket_is_refused_in_replay_and_allowed_hosts_pass(
    project: Project, tool: ToolServer
):
    def runner(ctx):
        with socket.create_connection(("127.0.0.1", tool.port), timeout=5) as sock:
            sock.sendall(b"GET /raw HTTP/1.0\r\n\r\n")
            return sock.recv(100).split(b"\r\n")[0].decode()

    run = run_with(project, [], runner, name="raw", items=ITEMS[:1], overrides={"replay": "replay"})
    [(status, _, error)] = outcomes(run).values()
    assert status == "error"
    assert f"replay refused a live connection to 127.0.0.1:{tool.port}" in error
    assert tool.seen == []

    project.write(
        "cobalt.toml", 'test_dir = "experiments"\n[replay]\nallow_hosts = ["localhost"]\n'
    )
    run = run_with(project, [], runner, name="raw", items=ITEMS[:1], overrides={"replay": "replay"})
    assert list(outcomes(run).values()) == [("ok", "HTTP/1.0 200 OK", "")]

    def through_requests(ctx):
        import requests

        return requests.get(f"http://localhost:{tool.port}/vectors").json()["path"]

    run = run_with(
        project,
        [],
        through_requests,
        name="allowed",
        items=ITEMS[:1],
        overrides={"replay": "replay"},
    )
    assert list(outcomes(run).values()) == [("ok", "/vectors", "")]
    [step] = next(iter(traces_of(run).values()))
    assert step["mark"] == "live"


SECRET = "sk-tool-SECRET-0004"


def test_a_langchain_tool_on_requests_replays_offline_and_its_secrets_are_not_recorded(
    project: Project, tool: ToolServer
):
    from langchain_core.tools import tool as langchain_tool

    @langchain_tool
    def search(query: str) -> str:
        """Search the knowledge base."""
        import requests

        reply = requests.get(
            f"{tool.url}/search",
            params={"q": query, "key": SECRET},
            headers={"Authorization": f"Bearer {SECRET}"},
            timeout=5,
        )
        return f"{reply.json()['n']}:{reply.json()['path']}"

    def runner(ctx):
        return search.invoke({"query": ctx.item["q"]})

    recorded = run_with(project, [], runner, name="lc", items=ITEMS, overrides={"replay": "record"})
    first = outcomes(recorded)
    assert sorted(output for _, output, _ in first.values()) == [
        "1:/search",
        "2:/search",
        "3:/search",
    ]
    assert tool.seen[0]["headers"]["Authorization"] == f"Bearer {SECRET}"  # it went out
    tool.stop()
    replayed = run_with(project, [], runner, name="lc", items=ITEMS, overrides={"replay": "replay"})
    assert outcomes(replayed) == first

    from cobalt_app import recording_store

    stored = json.dumps(list(recording_store.load_experiment("lc").values()))
    assert SECRET not in stored
    assert "Authorization" not in stored
    assert "key=" not in stored
    assert "/search?q=word0" in stored
    steps = traces_of(replayed)["q0"]
    assert SECRET not in json.dumps(steps)
    # Cobalt knows LangChain tools: replay answers the tool itself (its request not even
    # made); recording kept both the tool's result and its HTTP exchange.
    assert [(s["kind"], s["name"], s.get("intercepted")) for s in steps] == [
        ("tool", "search", "replayed")
    ]
    recorded_steps = traces_of(recorded)["q0"]
    assert [(s["kind"], s.get("mark")) for s in recorded_steps] == [
        ("tool", None),
        ("http", "recorded"),
    ]
    assert (
        recorded_steps[1]["parent"] == 0
        and recorded_steps[1]["url"] == f"{tool.url}/search?q=word0"
    )


def test_twenty_items_in_flight_are_each_answered_from_their_own_recording(
    project: Project, tool: ToolServer
):
    """Every item sends the same requests; only the server's counter tells the replies apart."""
    items = [{"id": f"item-{i}"} for i in range(40)]

    async def runner(ctx):
        import aiohttp
        import requests

        await asyncio.sleep(0.001 * (hash(ctx.item["id"]) % 10))
        async with aiohttp.ClientSession() as session, session.get(f"{tool.url}/same") as reply:
            first = (await reply.json())["n"]
        second = await asyncio.to_thread(lambda: requests.get(f"{tool.url}/same").json()["n"])
        return f"{first} {second}"

    options = {"concurrency": 20}
    recorded = run_with(
        project, [], runner, name="iso", items=items, overrides={"replay": "record", **options}
    )
    first = outcomes(recorded)
    assert len({output for _, output, _ in first.values()}) == len(items)  # all different
    tool.stop()
    replayed = run_with(
        project, [], runner, name="iso", items=items, overrides={"replay": "replay", **options}
    )
    assert outcomes(replayed) == first


def test_requests_from_threads_the_agent_starts_are_its_items_too(
    project: Project, tool: ToolServer
):
    """A plain thread, a thread pool and `run_in_executor`: recorded, then replayed offline;
    nothing goes out unanswered."""
    import concurrent.futures

    def fetch(path: str) -> int:
        import requests

        return requests.get(f"{tool.url}/{path}", timeout=5).json()["n"]

    def in_thread(found: list[int]) -> None:
        try:
            found.append(fetch("thread"))
        except BaseException:  # noqa: BLE001 - a thread that dies quietly: its item still knows
            found.append(-1)

    async def runner(ctx):
        found: list[int] = []
        thread = threading.Thread(target=in_thread, args=(found,))
        thread.start()
        thread.join()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            found.append(pool.submit(fetch, "pool").result())
        loop = asyncio.get_running_loop()
        found.append(await loop.run_in_executor(None, fetch, "executor"))
        return found

    recorded = run_with(
        project, [], runner, name="threads", items=ITEMS, overrides={"replay": "record"}
    )
    first = outcomes(recorded)
    assert {status for status, _, _ in first.values()} == {"ok"}, first
    tool.stop()
    replayed = run_with(
        project, [], runner, name="threads", items=ITEMS, overrides={"replay": "replay"}
    )
    assert outcomes(replayed) == first
    assert {len(steps) for steps in traces_of(replayed).values()} == {3}
    more = run_with(
        project, [], runner, name="threads", items=[{"id": "new"}], overrides={"replay": "replay"}
    )
    [(status, _, error)] = outcomes(more).values()
    assert status == "error" and f"GET {tool.url}/thread" in error
