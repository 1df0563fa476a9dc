"""An HTTP target's overhead: 400 items against a service that answers in 100 ms, by the real
`cobalt run`, against the same 400 calls made by a bare `httpx` script.

    python bench/bench_http_target.py [--items 400] [--latency 0.1] [--concurrency 10]

The service (uvicorn + Starlette, its own process) sleeps `--latency` and answers
`{"answer": ...}`. The bare script sends every item's body with one `httpx.AsyncClient`,
`--concurrency` at a time. `cobalt run` runs an experiment whose runner is
`cobalt.http_target(...)` with the same concurrency (tracing on, the item's traceparent sent,
results stored in SQLite) and reports its run's total time. Prints both and their ratio, with
the CPU each used (on a machine others load, the CPU says what the run costs: compare with
`--runner sleep`, the same command without HTTP, for its start-up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

SERVICE = """
import asyncio, sys
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

LATENCY = float(sys.argv[2])

async def ask(request):
    body = await request.json()
    await asyncio.sleep(LATENCY)
    return JSONResponse({"answer": f"echo {body['question']}"})

app = Starlette(routes=[Route("/ask", ask, methods=["POST"])])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""

EXPERIMENT = """
import cobalt, httpx, asyncio
_client = {}
async def plain(ctx):
    loop = asyncio.get_running_loop()
    if loop not in _client:
        _client[loop] = httpx.AsyncClient()
    r = await _client[loop].post("URL", json={"question": ctx.item["input"]["question"]})
    return r.json()["answer"]
async def sleeper(ctx):
    await asyncio.sleep(LATENCY)
    return "echo"

cobalt.experiment(
    "http-target-bench",
    cobalt.Dataset(items=[{"id": str(i), "input": {"question": f"q{i}"}} for i in range(ITEMS)]),
    RUNNER,
    evaluators=[cobalt.Evaluator(name="echo", type="function",
                                 fn=lambda ctx: {"score": float(ctx.output.startswith("echo"))})],
    concurrency=CONCURRENCY,
)
"""


RUNNERS = {  # `--runner`: the target, or for comparison a function doing the same call, a sleep
    "target": 'cobalt.http_target(url="URL", body={"question": "{{input.question}}"}, '
    'output="$.answer")',
    "function": "plain",
    "sleep": "sleeper",
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, seconds: float = 30) -> None:
    """Until a service listens on 127.0.0.1:`port` (exits the bench after `seconds`)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                sys.exit("the service did not start")
            time.sleep(0.05)


async def bare(url: str, items: int, concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, i: int) -> None:
        async with gate:
            answer = await client.post(url, json={"question": f"q{i}"})
            assert answer.json()["answer"].startswith("echo")

    async with httpx.AsyncClient(timeout=30) as client:
        await client.post(url, json={"question": "warm"})
        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(client, i) for i in range(items)))
        return time.perf_counter() - started, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--runner", choices=sorted(RUNNERS), default="target")
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}/ask"
    service = subprocess.Popen([sys.executable, "-c", SERVICE, str(port), str(args.latency)])
    project = Path(tempfile.mkdtemp(prefix="cobalt-bench-target-"))
    try:
        wait_for_port(port)
        bare_seconds, bare_cpu = asyncio.run(bare(url, args.items, args.concurrency))
        (project / "experiments").mkdir()
        (project / "cobalt.toml").write_text('test_dir = "experiments"\n[receiver]\nport = 0\n')
        text = EXPERIMENT.replace("RUNNER", RUNNERS[args.runner])
        text = text.replace("ITEMS", str(args.items)).replace("URL", url)
        text = text.replace("CONCURRENCY", str(args.concurrency))
        text = text.replace("LATENCY", str(args.latency))
        (project / "experiments" / "bench.cobalt.py").write_text(text)
        env = {k: v for k, v in os.environ.items() if not k.startswith("COBALT_")}
        started, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(
            [sys.executable, "-m", "cobalt_cli", "run"],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - started
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        command_cpu = used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime
        saved = sorted((project / ".cobalt" / "results").glob("*.json"))
        if done.returncode != 0 or not saved:
            sys.exit(f"cobalt run failed:\n{done.stdout}\n{done.stderr}")
        # The run's time to the millisecond (its summary prints tenths of a second).
        run_seconds = json.loads(saved[-1].read_text())["summary"]["totalDurationMs"] / 1000
        ideal = args.items * args.latency / args.concurrency
        print(
            f"{args.items} calls, {args.latency * 1000:.0f} ms each, {args.concurrency} at a time "
            f"(ideal {ideal:.2f}s)"
        )
        print(f"bare httpx script: {bare_seconds:.2f}s, {bare_cpu:.2f}s CPU")
        print(
            f"cobalt run ({args.runner}): {run_seconds:.2f}s the run, {wall:.2f}s the command "
            f"({command_cpu:.2f}s CPU, start-up included); ratio {run_seconds / bare_seconds:.3f}x"
        )
    finally:
        service.terminate()
        service.wait(timeout=10)
        subprocess.run(["rm", "-rf", str(project)], check=False)


if __name__ == "__main__":
    main()
