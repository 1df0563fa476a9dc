"""Throughput of the OTLP receiver: export requests of 100 spans each, over HTTP, into the
history database, then a burst 10x larger with the server's memory watched.

    python bench/bench_receiver.py [--spans 20000] [--clients 8] [--database-url postgres://...]
        [--keep]

Starts the real `cobalt serve` in a throwaway project (SQLite; or the PostgreSQL database
given, then with an API token as team mode needs), sends `--spans` spans as protobuf export
requests of 100 spans (10 traces of 10 spans, GenAI attributes on each) from `--clients`
concurrent clients, and prints spans per second and per CPU-second of the server (429s are
retried after Retry-After and counted, as are reconnections). `--keep` keeps the project, with
the server's log. The burst sends 10x as many from 4x the clients and reports the server's peak
resident memory (its process tree's, from /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

sys.path.insert(0, str(Path(__file__).parent))
from bench_api_load import cobalt, start_server, stop_server  # noqa: E402

BATCH = 100
SPANS_PER_TRACE = 10


def export_request(batch: int) -> bytes:
    """100 spans: 10 traces (ids from `batch`) of an agent span and 9 model/tool children."""
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    name = resource.resource.attributes.add()
    name.key, name.value.string_value = "service.name", "bench-agent"
    scope = resource.scope_spans.add()
    base = 1_700_000_000_000_000_000
    for t in range(BATCH // SPANS_PER_TRACE):
        trace_id = (batch * 1000 + t + 1).to_bytes(16, "big")
        for n in range(SPANS_PER_TRACE):
            span = scope.spans.add()
            span.trace_id = trace_id
            span.span_id = (n + 1).to_bytes(8, "big")
            if n:
                span.parent_span_id = (1).to_bytes(8, "big")
            span.name = "agent" if n == 0 else ("chat gpt-4o-mini" if n % 2 else "search")
            span.start_time_unix_nano = base + n * 1_000_000
            span.end_time_unix_nano = base + n * 1_000_000 + 800_000
            attributes = {
                "gen_ai.operation.name": "invoke_agent" if n == 0 else "chat",
                "gen_ai.request.model": "gpt-4o-mini",
                "input.value": f"question {batch}/{t}: what is the weather like today?",
                "output.value": "sunny, 21 degrees, light wind from the west",
            }
            for key, value in attributes.items():
                kv = span.attributes.add()
                kv.key, kv.value.string_value = key, value
            tokens = span.attributes.add()
            tokens.key, tokens.value.int_value = "gen_ai.usage.input_tokens", 42
    return request.SerializeToString()


async def send(base: str, headers: dict, batches: list[int], clients: int) -> dict:
    record = {"ok": 0, "shed": 0, "errors": 0, "reconnects": 0}
    queue: asyncio.Queue[int] = asyncio.Queue()
    for batch in batches:
        queue.put_nowait(batch)
    bodies = {b: export_request(b) for b in batches}

    async def worker(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            batch = queue.get_nowait()
            while True:
                try:
                    answer = await http.post(f"{base}/v1/traces", content=bodies[batch])
                except httpx.TransportError:  # a kept-alive connection the server closed
                    record["reconnects"] += 1  # (idle 5 s on a stalled machine): as exporters do
                    continue
                if answer.status_code == 429:
                    record["shed"] += 1
                    await asyncio.sleep(float(answer.headers.get("Retry-After", "1")) / 10)
                    continue
                record["ok" if answer.status_code == 200 else "errors"] += 1
                break

    headers = {"Content-Type": "application/x-protobuf", **headers}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        await asyncio.gather(*(worker(http) for _ in range(clients)))
    return record


def resident_kb(pid: int) -> int:
    """Resident memory of a process and its children (kB)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().split()
            if int(entry.name) != pid and int(stat[3]) != pid:
                continue
            status = (entry / "status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


def cpu_seconds(pid: int) -> float:
    """CPU time (user and system) of a process and its children so far: on a machine others
    load, spans per CPU-second say what the receiver costs; spans per second say how busy
    the machine was."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) == pid or int(stat[1]) == pid:
            total += (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def burst(base: str, headers: dict, batches: list[int], clients: int, pid: int) -> tuple:
    peak = [resident_kb(pid)]

    async def watch() -> None:
        while True:
            peak.append(resident_kb(pid))
            await asyncio.sleep(0.2)

    watcher = asyncio.create_task(watch())
    record = await send(base, headers, batches, clients)
    watcher.cancel()
    return record, max(peak)


def quiet(pid: int, deadline: float = 120.0) -> None:
    """Until the server's workers have finished warming up (`cobalt serve` imports scipy in
    each in the background: seconds of CPU on a loaded machine, which fell inside the measured
    window and were counted as the receiver's): its CPU time grows < 0.05 s in 0.5 s."""
    until = time.monotonic() + deadline
    last = cpu_seconds(pid)
    while time.monotonic() < until:
        time.sleep(0.5)
        now = cpu_seconds(pid)
        if now - last < 0.05:
            return
        last = now


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--keep", action="store_true", help="Keep the project (its server log).")
    args = parser.parse_args()
    project = Path(tempfile.mkdtemp(prefix="cobalt-bench-receiver-"))
    (project / "cobalt.toml").write_text('test_dir = "experiments"\n')
    (project / ".cobalt").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("COBALT_")}
    headers: dict[str, str] = {}
    if args.database_url:
        env["COBALT_DATABASE_URL"] = args.database_url
        cobalt(project, "migrate", env=env)
        cobalt(project, "createuser", "bench", "--password-stdin", env=env, input="bench-pw-1\n")
        token = cobalt(project, "token", "create", "bench", env=env).stdout.strip()
        headers["Authorization"] = f"Token {token}"
    server, base, log = start_server(project, env)
    try:
        count = args.spans // BATCH
        warm = list(range(10**6, 10**6 + 4 * args.clients))  # every worker thread's first
        asyncio.run(send(base, headers, warm, args.clients))
        quiet(server.pid)
        started, cpu = time.perf_counter(), cpu_seconds(server.pid)
        record = asyncio.run(send(base, headers, list(range(count)), args.clients))
        took, cpu = time.perf_counter() - started, cpu_seconds(server.pid) - cpu
        where = "PostgreSQL" if args.database_url else "SQLite"
        print(
            f"{record['ok'] * BATCH:,} spans in {took:.2f}s into {where}: "
            f"{record['ok'] * BATCH / took:,.0f} spans/s; server CPU {cpu:.2f}s: "
            f"{record['ok'] * BATCH / cpu:,.0f} spans per CPU-second "
            f"({args.clients} clients, {BATCH} spans a request; {record['shed']} shed, "
            f"{record['errors']} errors, {record['reconnects']} reconnects)"
        )
        before = resident_kb(server.pid)
        batches = list(range(count, count * 11))
        started = time.perf_counter()
        record, peak = asyncio.run(burst(base, headers, batches, args.clients * 4, server.pid))
        took = time.perf_counter() - started
        print(
            f"burst of {len(batches) * BATCH:,} spans from {args.clients * 4} clients in "
            f"{took:.2f}s: {record['ok'] * BATCH / took:,.0f} spans/s, {record['shed']} shed "
            f"(429), {record['errors']} errors; server memory {before / 1024:.0f} MB before, "
            f"{peak / 1024:.0f} MB at peak"
        )
    finally:
        stop_server(server)
        if not args.keep:
            subprocess.run(["rm", "-rf", str(project)], check=False)


if __name__ == "__main__":
    main()
