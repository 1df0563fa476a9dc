"""Load test of the REST API: 50 concurrent clients for 10 s against `cobalt serve`.

    python bench/bench_api_load.py [--items 100000] [--clients 50] [--seconds 10]
                                   [--project DIR]

Builds a throwaway project (or reuses `--project`), stores a run of `--items` item results
through the real engine (`cobalt run`), creates a user and a token with the real CLI, starts
`cobalt serve` on 127.0.0.1 and has every client loop for the given time over
`GET /api/runs/` and `GET /api/runs/<id>/items/?page=N` (random pages) with the token.
Prints throughput and latency percentiles; exits 1 on any error (non-200 or transport).
Everything stays on loopback and the loop is bounded by `--seconds`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HOST = "127.0.0.1"
PAGE_SIZE = 50
READY_TIMEOUT = 60.0

EXPERIMENT = """
import os

from cobalt import Dataset, Evaluator, experiment

N = int(os.environ["COBALT_BENCH_ITEMS"])
ITEMS = [
    {"id": f"item-{i}", "input": f"question {i}", "expected_output": str(i % 7)} for i in range(N)
]


def parity(ctx):
    return {"score": float(int(ctx.output) % 2 == 0), "reason": "even answers pass"}


@experiment(
    "api-load",
    Dataset(items=ITEMS),
    evaluators=[
        Evaluator(name="exact", type="exact-match", field="expected_output"),
        Evaluator(name="parity", type="function", fn=parity),
    ],
    concurrency=50,
)
def run(ctx):
    return str(ctx.index % 5)
"""


def cobalt(project: Path, *args: str, env: dict[str, str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cobalt_cli", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        **kwargs,
    )


def prepare(project: Path, items: int, env: dict[str, str]) -> tuple[str, str]:
    """A stored run of `items` item results, and a token; returns (run id, token)."""
    (project / "experiments").mkdir(parents=True, exist_ok=True)
    (project / "cobalt.toml").write_text('test_dir = "experiments"\n')
    (project / "experiments" / "load.cobalt.py").write_text(EXPERIMENT)
    started = time.perf_counter()
    done = cobalt(project, "run", "--quiet", env={**env, "COBALT_BENCH_ITEMS": str(items)})
    if done.returncode != 0:
        sys.exit(f"cobalt run failed:\n{done.stdout}\n{done.stderr}")
    print(
        f"stored {items:,} item results with `cobalt run` in {time.perf_counter() - started:.1f}s"
    )
    created = cobalt(
        project, "createuser", "bench", "--password-stdin", env=env, input="bench-pass-1\n"
    )
    if created.returncode != 0 and "already exists" not in created.stderr:
        sys.exit(f"cobalt createuser failed: {created.stderr}")
    token = cobalt(project, "token", "create", "bench", env=env)
    if token.returncode != 0:
        sys.exit(f"cobalt token create failed: {token.stderr}")
    return latest_run(project, items, env), token.stdout.strip()


def latest_run(project: Path, items: int, env: dict[str, str]) -> str:
    code = (
        "from cobalt_project import bootstrap; bootstrap.setup();"
        "from cobalt_app.models import Run;"
        f"run = Run.objects.filter(total_items__gte={items}).order_by('-created_at').first();"
        "print(run.id if run else '')"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True
    )
    run_id = found.stdout.strip()
    if not run_id:
        sys.exit(f"no run with {items:,} items in {project}: {found.stderr}")
    return run_id


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def start_server(project: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    log = project / ".cobalt" / "bench-serve.log"
    with log.open("w") as sink:
        server = subprocess.Popen(
            [sys.executable, "-m", "cobalt_cli", "serve", "--host", HOST, "--port", str(port)],
            cwd=project,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://{HOST}:{port}"
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"cobalt serve exited:\n{log.read_text()}")
        try:
            if httpx.get(f"{base}/api/runs/", timeout=2).status_code < 500:
                return server, base, log
        except httpx.TransportError:
            time.sleep(0.1)
    stop_server(server)
    sys.exit("cobalt serve did not answer within 60s")


def stop_server(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


async def client(
    http: httpx.AsyncClient, run_id: str, pages: int, until: float, seed: int, record: dict
) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until:
        if rng.random() < 0.5:
            url, kind = "/api/runs/", "runs"
        else:
            url, kind = f"/api/runs/{run_id}/items/?page={rng.randint(1, pages)}", "items"
        started = time.perf_counter()
        try:
            response = await http.get(url)
            ok = response.status_code == 200 and response.json()["results"]
        except (httpx.HTTPError, json.JSONDecodeError, KeyError) as exc:
            ok, response = False, exc
        elapsed = (time.perf_counter() - started) * 1000
        record[kind].append(elapsed)
        if not ok:
            at = seconds_before(until)
            what = getattr(response, "status_code", response)
            record["errors"].append(f"{url}: {what!r} ({at:.1f}s before the end)")


async def load(base: str, token: str, run_id: str, items: int, clients: int, seconds: float):
    record: dict[str, list] = {"runs": [], "items": [], "errors": []}
    pages = max(1, items // PAGE_SIZE)
    # Idle connections are dropped before the server's keep-alive (5 s) can close them under
    # a request: with equal timeouts the two race and a reused connection is reset.
    limits = httpx.Limits(
        max_connections=clients, max_keepalive_connections=clients, keepalive_expiry=2.0
    )
    headers = {"Authorization": f"Token {token}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, limits=limits, timeout=30) as http:
        until = time.monotonic() + seconds
        started = time.perf_counter()
        await asyncio.gather(
            *(client(http, run_id, pages, until, i, record) for i in range(clients))
        )
        wall = time.perf_counter() - started
    return record, wall


def seconds_before(until: float) -> float:
    return until - time.monotonic()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def report(record: dict, wall: float, clients: int) -> int:
    everything = record["runs"] + record["items"]
    print(
        f"\n{clients} clients, {wall:.1f}s: {len(everything):,} requests, "
        f"{len(everything) / wall:.0f} req/s, {len(record['errors'])} errors"
    )
    for kind in ("runs", "items"):
        values = record[kind]
        if values:
            print(
                f"  {kind:5}  n={len(values):6,}  p50={percentile(values, 50):7.1f} ms  "
                f"p95={percentile(values, 95):7.1f} ms  p99={percentile(values, 99):7.1f} ms  "
                f"mean={statistics.fmean(values):7.1f} ms"
            )
    if everything:
        print(f"  all    p95={percentile(everything, 95):.1f} ms")
    for error in record["errors"][:10]:
        print(f"  error: {error}")
    return 1 if record["errors"] or not everything else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--project", type=Path, help="Reuse (or keep) this project folder.")
    args = parser.parse_args()

    repo = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COBALT_", "DJANGO_"))}
    env["PYTHONPATH"] = str(repo)
    project = args.project or Path(tempfile.mkdtemp(prefix="cobalt-api-load-"))
    project = project.resolve()
    try:
        if (project / ".cobalt" / "history.db").exists():
            run_id = latest_run(project, args.items, env)
            token = cobalt(project, "token", "create", "bench", env=env).stdout.strip()
            print(f"reusing {project}: run {run_id}")
        else:
            run_id, token = prepare(project, args.items, env)
        server, base, log = start_server(project, env)
        try:
            record, wall = asyncio.run(
                load(base, token, run_id, args.items, args.clients, args.seconds)
            )
        finally:
            stop_server(server)
        failed = report(record, wall, args.clients)
        if failed:
            print("server log (tail):\n" + "\n".join(log.read_text().splitlines()[-20:]))
        return failed
    finally:
        if args.project is None:
            shutil.rmtree(project, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
