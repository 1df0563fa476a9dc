"""HTTP interception benchmarks (issue 34; the tools' are in bench_intercept.py). Run:
`python bench/bench_intercept_http.py [--items 400] [--against DIR] [--micro]`.

Workload: `--items` items × (one model call through the OpenAI SDK, async, to the fake
provider + two tool calls over HTTP to a tool server: `search` through requests, `orders`
through aiohttp), both answering after 100 ms, concurrency 40, no evaluator (the agent's
time alone).

1. Interception's cost on a live run: `cobalt run` of this tree versus the tree in
   `--against DIR` (e.g. the base commit, `git archive <commit> | tar -x -C DIR`), where the
   tools' HTTP calls are neither intercepted nor traced; interleaved, `--repeat` times, best
   of each. Target: <= 1.05x.
2. Replayed versus live (this tree): `cobalt run --record` once, then live and `--replay`
   interleaved, with the provider and the tool server still up (nothing reaches them in
   replay: the bench checks their counters). Target: replayed < 0.5x live.
Both the whole process (wall) and the run's own duration (its results file) are printed.
3. `--micro`: what interception costs one request, in-process: `--requests` requests through
   requests, httpx and aiohttp (kept-alive connections to a local server answering at once),
   sent by an item's code (intercepted: each becomes a traced step) and by code outside an
   item (passed straight through); the CPU time each costs (steadier than wall time on a
   shared machine), and the difference per request against the 100 ms a tool or a model
   call takes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import (  # noqa: E402 - the bench folder is not a package
    REPO,
    compile_sources,
    project,
    run_duration_s,
    start_fake_provider,
    timed,
)

AGENT = """
import asyncio
import os

import aiohttp
import requests
from openai import AsyncOpenAI

from cobalt import Dataset, experiment

TOOLS = os.environ["TOOLS_URL"]
client = AsyncOpenAI()
dataset = Dataset(items=[{"id": i, "input": f"order {i}"} for i in range(N)])


def search(q):
    return requests.get(f"{TOOLS}/search", params={"q": q}, timeout=10).json()


@experiment("bench-intercept", dataset, concurrency=40)
async def run(ctx):
    found = await asyncio.to_thread(search, ctx.item["input"])
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{TOOLS}/orders/{ctx.index}") as reply:
            order = await reply.json()
    answer = await client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": f"ECHO: {found['n']} {order['n']}"}],
    )
    return answer.choices[0].message.content
"""


class SlowTool(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body written apart: no 40 ms delayed ACK

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        time.sleep(self.server.latency)  # type: ignore[attr-defined]
        with self.server.lock:  # type: ignore[attr-defined]
            self.server.count += 1  # type: ignore[attr-defined]
            n = self.server.count  # type: ignore[attr-defined]
        body = json.dumps({"n": n}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def start_tools(latency: float = 0.1) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowTool)
    server.latency = latency  # type: ignore[attr-defined]
    server.daemon_threads = True
    server.count, server.lock = 0, threading.Lock()  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def best(runs: list[tuple[float, float]]) -> tuple[float, float]:
    return min(r[0] for r in runs), min(r[1] for r in runs)


def show(label: str, runs: list[tuple[float, float]]) -> None:
    wall, own = best(runs)
    listed = ", ".join(f"{w:.2f}/{o:.2f}" for w, o in runs)
    print(f"  {label:<30}: process {wall:6.2f} s, run {own:6.2f} s  (runs: {listed})")


def bench(args: argparse.Namespace, env: dict[str, str], tmp: Path, tools: Any) -> None:
    folder = project(tmp / "intercept", "agent", AGENT, args.items)
    command = [sys.executable, "-m", "cobalt_cli", "run"]
    times: dict[str, list[tuple[float, float]]] = {"live": [], "base": [], "replayed": []}
    if args.against:
        base_env = {**env, "PYTHONPATH": str(args.against)}
        for _ in range(args.repeat):
            times["base"].append((timed(command, folder, base_env)[0], run_duration_s(folder)))
            times["live"].append((timed(command, folder, env)[0], run_duration_s(folder)))
    timed([*command, "--record"], folder, env)
    for _ in range(args.repeat):
        if not args.against:
            times["live"].append((timed(command, folder, env)[0], run_duration_s(folder)))
        before = tools.count
        times["replayed"].append(
            (timed([*command, "--replay"], folder, env)[0], run_duration_s(folder))
        )
        if tools.count != before:
            raise SystemExit(f"replay sent {tools.count - before} tool request(s) out")
    print(f"{args.items} items x (1 model call + 2 HTTP tool calls) at 100 ms, concurrency 40")
    if args.against:
        show(f"live, {args.against.name}", times["base"])
    show("live, this tree", times["live"])
    show("replayed, this tree", times["replayed"])
    live, replayed = best(times["live"]), best(times["replayed"])
    if args.against:
        base = best(times["base"])
        print(
            f"  interception on a live run    : process {live[0] / base[0]:.3f}x, "
            f"run {live[1] / base[1]:.3f}x  (target <= 1.05x)"
        )
    print(
        f"  replayed / live               : process {replayed[0] / live[0]:.2f}x, "
        f"run {replayed[1] / live[1]:.2f}x  (target < 0.5x)"
    )


def micro(count: int) -> None:
    import asyncio

    import aiohttp
    import django
    import httpx
    import requests

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cobalt_project.settings")
    django.setup()
    from cobalt_app import runaway, traces, transports

    transports.install()
    server = start_tools(latency=0.0)
    url = f"http://127.0.0.1:{server.server_address[1]}/search"

    async def send_all() -> dict[str, float]:
        spent = {}
        with requests.Session() as session:
            started = time.process_time()
            for _ in range(count):
                session.get(url).json()
            spent["requests"] = time.process_time() - started
        with httpx.Client() as client:
            started = time.process_time()
            for _ in range(count):
                client.get(url).json()
            spent["httpx"] = time.process_time() - started
        async with aiohttp.ClientSession() as client:
            started = time.process_time()
            for _ in range(count):
                async with client.get(url) as reply:
                    await reply.json()
            spent["aiohttp"] = time.process_time() - started
        return spent

    async def in_item() -> dict[str, float]:
        token = runaway._guard.set(runaway.ItemGuard())  # what the engine sets per item
        try:
            with traces.enabled(), traces.capture_item(traces.TraceSettings()) as collector:
                spent = await send_all()
            assert len(collector.spans) == 3 * count, len(collector.spans)
            return spent
        finally:
            runaway._guard.reset(token)

    rounds = [(asyncio.run(send_all()), asyncio.run(in_item())) for _ in range(3)]
    server.shutdown()
    print(
        f"{count} requests per client to a local server answering at once: CPU time of this "
        "process (the server's threads included) per request, best of 3"
    )
    for client in ("requests", "httpx", "aiohttp"):
        plain = min(r[0][client] for r in rounds) / count * 1e6
        caught = min(r[1][client] for r in rounds) / count * 1e6
        print(
            f"  {client:<9}: {plain:7.0f} us plain, {caught:7.0f} us intercepted and traced: "
            f"+{caught - plain:5.0f} us a request = {(caught - plain) / 1e3:.3f}% of 100 ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--against", type=Path, help="Another Cobalt tree (the base commit).")
    parser.add_argument("--micro", action="store_true", help="Only the per-request cost (3).")
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args()
    if args.micro:
        micro(args.requests)
        return
    compile_sources()
    if args.against:
        compile_sources(args.against)
    fake, url = start_fake_provider(0.1)
    tools = start_tools()
    env = {
        **os.environ,
        "OPENAI_BASE_URL": f"{url}/v1",
        "OPENAI_API_KEY": "sk-bench",
        "TOOLS_URL": f"http://127.0.0.1:{tools.server_address[1]}",
        "PYTHONPATH": str(REPO),
    }
    env = {k: v for k, v in env.items() if not k.startswith("COBALT_")}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            bench(args, env, Path(tmp), tools)
    finally:
        tools.shutdown()
        fake.terminate()
        fake.wait(timeout=10)


if __name__ == "__main__":
    main()
