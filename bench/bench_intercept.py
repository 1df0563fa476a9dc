"""Tool interception benchmarks (issue 34). Run: `python bench/bench_intercept.py [--items 400]`.

A support agent per item: one model call (the fake provider, 100 ms latency) and two calls of
an `@cobalt.tool` that asks a search server on 127.0.0.1 (100 ms per request), concurrency 40.
Each `cobalt run` is a whole process, timed from outside, and the run's own duration read from
its results file:

1. live, without any interception declared;
2. live, with the interception machinery busy on every tool call (a stub declared for another
   tool: each call is planned, matched and passed through) — target: within 1.05x of 1;
3. `--record`, then `--replay` with the search server and the provider stopped — target:
   replayed < 0.5x live.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fake_provider import FakeProvider  # noqa: E402 - after the path

AGENT = """
import os
import urllib.request

import openai

import cobalt
from cobalt import Dataset, experiment

client = openai.OpenAI()
URL = os.environ["SEARCH_URL"]
STUBS = [cobalt.stub("tool:not_used", returns=1)] if os.environ.get("BUSY") else []


@cobalt.tool
def search(q: str) -> str:
    with urllib.request.urlopen(URL + "?q=" + q, timeout=10) as response:
        return response.read().decode()


@experiment("bench-tools", Dataset(items=[{"id": i} for i in range(N)]), concurrency=40,
            intercept=STUBS)
def run(ctx):  # sync: its tools block their own thread, not the event loop
    reply = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": f"ECHO: q{ctx.item['id']}"}])
    word = reply.choices[0].message.content
    return [search(word), search(word + "-more")]
"""


def search_server(latency: float) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            time.sleep(latency)
            body = json.dumps({"hits": [self.path]}).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def cobalt_run(folder: Path, env: dict[str, str], *flags: str) -> tuple[float, float]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "cobalt_cli", "run", "--quiet", *flags],
        cwd=folder, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(done.stdout + done.stderr)
    newest = max((folder / ".cobalt" / "results").glob("*.json"), key=os.path.getmtime)
    summary = json.loads(newest.read_text())["summary"]
    return wall, summary["totalDurationMs"] / 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--latency", type=float, default=0.1)
    items, latency = parser.parse_args().items, parser.parse_args().latency
    folder = Path(tempfile.mkdtemp(prefix="bench-intercept-"))
    (folder / "cobalt.toml").write_text('test_dir = "experiments"\n')
    (folder / "experiments").mkdir()
    source = textwrap.dedent(AGENT).replace("range(N)", f"range({items})")
    (folder / "experiments" / "tools.cobalt.py").write_text(source)
    provider = FakeProvider(latency=latency).start()
    server = search_server(latency)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OPENAI_BASE_URL": provider.openai_base_url,
        "OPENAI_API_KEY": "sk-bench",
        "SEARCH_URL": f"http://127.0.0.1:{server.server_address[1]}/search",
    }
    print(f"{items} items × (1 model call + 2 tool calls), {latency * 1000:g} ms each, conc 40")
    plain = cobalt_run(folder, env)
    busy = cobalt_run(folder, {**env, "BUSY": "1"})
    cobalt_run(folder, env, "--record")
    provider.stop()
    server.shutdown()
    replayed = cobalt_run(folder, env, "--replay")
    for label, (wall, run) in [
        ("live", plain),
        ("live, interception busy", busy),
        ("replayed (servers stopped)", replayed),
    ]:
        print(f"  {label:28} process {wall:6.2f} s   run {run:6.2f} s")
    print(f"  interception busy / live (run): {busy[1] / plain[1]:.3f}x (target ≤ 1.05x)")
    print(f"  replayed / live (process): {replayed[0] / plain[0]:.3f}x (target < 0.5x)")


if __name__ == "__main__":
    main()
