"""Engine benchmarks (issue 2). Run: `python bench/bench_engine.py [--items 400] [--big 50000]`.

1. 400 items × (one agent call + one llm-judge call) against the fake provider with 100 ms
   latency, concurrency 40: the whole `cobalt run --no-cache` process versus a bare asyncio
   script making the same calls with the OpenAI SDK.
   Twice: with trace capture on (the default: every agent call becomes a span, stored with
   its item) and off (`[trace] enabled = false`); the target holds for both (issue 15: capture
   stays within 1.10x of the bare script).
2. 50,000 quick items (`--big`), items/s of the whole `cobalt run` process, of the run
   itself (its results file's duration) and peak RSS, beside the floor: a bare script
   writing the same rows with `executemany` into SQLite (WAL, as Cobalt's database) —
   each item's row created, then its result and evaluation recorded in batches of 1,000.
   Workloads: `noop` (async runner, sync function evaluator), `sync` (a sync runner and a
   sync function evaluator with a `pass_threshold`, scoring below it: every item fails its
   mark — what users write), `contains` (sync runner, the built-in `contains`), `traced`
   (sync runner making a 10-step trace per item: an agent, three model calls with their
   messages and usage, three tool calls, a retrieval, two steps of its own), `file` (`sync`
   over a JSON Lines dataset file: its peak RSS is the run's own, the dataset streamed).
   `--against DIR` runs each workload also with the Cobalt source tree in DIR (a worktree
   of the base commit), interleaved, and prints both; `--only big` skips workload 1.
3. `--replay` (issue 16; `python bench/bench_engine.py --replay`, alone): workload 1 with
   the judge cache warm, live (`cobalt run`) versus replayed (`cobalt run --replay`, after one
   `--record`): the whole process, and the run's own duration from its results file. Target:
   replayed < 0.5x live.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent

BARE = """
import asyncio
from openai import AsyncOpenAI

client = AsyncOpenAI()

async def one(i, sem):
    async with sem:
        agent = await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": f"ECHO: answer {i}"}])
        output = agent.choices[0].message.content
        await client.chat.completions.create(
            model="gpt-4o-mini", temperature=0,
            messages=[{"role": "system", "content": "judge"},
                      {"role": "user", "content": f"Q: question {i} A: {output} [[score:0.8]]"}])

async def main():
    sem = asyncio.Semaphore(40)
    await asyncio.gather(*(one(i, sem) for i in range(N)))

asyncio.run(main())
"""

EXPERIMENT = """
from openai import AsyncOpenAI
from cobalt import Dataset, Evaluator, experiment

client = AsyncOpenAI()
dataset = Dataset(items=[{"id": i, "input": f"question {i}"} for i in range(N)])

@experiment("bench-llm", dataset, concurrency=40, evaluators=[
    Evaluator(name="judge", prompt="Q: {{input}} A: {{output}} [[score:0.8]]"),
])
async def run(ctx):
    reply = await client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": f"ECHO: answer {ctx.index}"}])
    return {"output": reply.choices[0].message.content}
"""

NOOP = """
from cobalt import Dataset, Evaluator, experiment

dataset = Dataset(items=[{"id": i, "input": f"q{i}"} for i in range(N)])

@experiment("bench-noop", dataset, concurrency=40, evaluators=[
    Evaluator(name="fn", type="function", fn=lambda ctx: 1.0),
])
async def run(ctx):
    return ctx.item["input"]
"""

# What users write most: a sync runner and a sync function evaluator with its own pass mark
# (every score passes through the one verdict rule of `cobalt.verdict`).
SYNC_NOOP = """
from cobalt import Dataset, Evaluator, experiment

dataset = Dataset(items=[{"id": i, "input": f"q{i}"} for i in range(N)])

def contains_q(ctx):
    return 0.6 if "q" in ctx.output else 0.0

@experiment("bench-sync", dataset, concurrency=40, evaluators=[
    Evaluator(name="fn", type="function", fn=contains_q, pass_threshold=0.8),
])
def run(ctx):
    return ctx.item["input"]
"""

# The sync workload over a dataset file (`items.jsonl`, written beside the experiment): what a
# big run reads, streamed from its file (issue 41: peak memory flat in the number of items).
SYNC_FILE = SYNC_NOOP.replace(
    'Dataset(items=[{"id": i, "input": f"q{i}"} for i in range(N)])',
    'Dataset.from_file("items.jsonl")',
).replace('"bench-sync"', '"bench-file"')


# The same agent, traced: ten steps per item (what a tool-using agent leaves in its trace).
TRACED = """
import cobalt
from cobalt import Dataset, Evaluator, experiment

dataset = Dataset(items=[{"id": i, "input": f"q{i}"} for i in range(N)])
SYSTEM = "You are a careful support agent. " * 20

@cobalt.tool
def lookup(order: str) -> dict:
    return {"order": order, "status": "shipped", "eta": "2 days"}

def model(step: int, question: str) -> str:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    with cobalt.span(f"model call {step}", kind="llm", input=messages) as call:
        call.output = f"step {step}: looking up {question}"
    return call.output

def contains_q(ctx):
    return 0.6 if "q" in ctx.output else 0.0

@experiment("bench-traced", dataset, concurrency=40, evaluators=[
    Evaluator(name="fn", type="function", fn=contains_q, pass_threshold=0.8),
])
def run(ctx):
    question = ctx.item["input"]
    with cobalt.span("agent", kind="agent", input=question) as agent:
        with cobalt.span("search", kind="retrieval", input=question) as search:
            search.output = ["faq-1", "faq-2"]
        for step in range(3):
            model(step, question)
            lookup(f"order-{ctx.index}-{step}")
        with cobalt.span("plan", input=question) as plan:
            plan.output = "answer"
        agent.output = f"answer to {question}"
    return agent.output
"""

CONTAINS = """
from cobalt import Dataset, Evaluator, experiment

dataset = Dataset(items=[{"id": i, "input": f"q{i}"} for i in range(N)])

@experiment("bench-contains", dataset, concurrency=40, evaluators=[
    Evaluator(name="has", type="contains", value="q"),
])
def run(ctx):
    return ctx.item["input"]
"""

# The floor: the same rows, written by a bare script into SQLite as Cobalt configures it.
FLOOR = """
import sqlite3, sys, time
n = int(sys.argv[1])
db = sqlite3.connect(sys.argv[2], isolation_level=None)
db.executescript("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
    "CREATE TABLE item (id INTEGER PRIMARY KEY, run_id TEXT, item_index INT, item_key TEXT, "
    "input TEXT, output TEXT, metadata TEXT, status TEXT, latency_ms REAL, "
    "started_at TEXT, finished_at TEXT);"
    "CREATE INDEX item_run_status ON item (run_id, status);"
    "CREATE TABLE evaluation (id INTEGER PRIMARY KEY, item_id INT, evaluator TEXT, "
    "score REAL, reason TEXT, status TEXT, UNIQUE (item_id, evaluator));")
started = time.perf_counter()
db.execute("BEGIN")
db.executemany("INSERT INTO item (id, run_id, item_index, item_key, input, status) "
    "VALUES (?, 'run', ?, ?, ?, 'pending')",
    ((i, i, str(i), f'{{"id": {i}, "input": "q{i}"}}') for i in range(n)))
db.execute("COMMIT")
for first in range(0, n, 1000):
    ids = range(first, min(first + 1000, n))
    db.execute("BEGIN")
    db.executemany("UPDATE item SET output = ?, metadata = '{}', status = 'ok', latency_ms = 0.1, "
        "started_at = '2026-01-01 00:00:00', finished_at = '2026-01-01 00:00:01' WHERE id = ?",
        ((f'"q{i}"', i) for i in ids))
    db.executemany("INSERT INTO evaluation (item_id, evaluator, score, reason, status) "
        "VALUES (?, 'fn', 0.6, '', 'ok')", ((i,) for i in ids))
    db.execute("COMMIT")
print(time.perf_counter() - started)
"""

# The floor of a traced item: the bare OpenTelemetry SDK making the traced workload's 10
# spans with the same attributes, kept in memory (no conversion, no storage). CPU seconds.
TRACE_FLOOR = """
import json, sys, time
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
tracer = provider.get_tracer("floor")
SYSTEM = "You are a careful support agent. " * 20

def span(name, kind, value):
    return tracer.start_as_current_span(
        name, attributes={"cobalt.kind": kind, "cobalt.name": name, "cobalt.input": value})

started = time.process_time()
for i in range(int(sys.argv[1])):
    question = f"q{i}"
    with span("agent", "agent", question) as agent:
        with span("search", "retrieval", question) as search:
            search.set_attribute("cobalt.output", json.dumps(["faq-1", "faq-2"]))
        for step in range(3):
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
            with span(f"model call {step}", "llm", json.dumps(messages)) as call:
                call.set_attribute("cobalt.output", f"step {step}: looking up {question}")
            order = {"order": f"order-{i}-{step}"}
            with span("lookup", "tool", json.dumps(order)) as tool:
                result = {"order": order["order"], "status": "shipped", "eta": "2 days"}
                tool.set_attribute("cobalt.output", json.dumps(result))
        with span("plan", "other", question) as plan:
            plan.set_attribute("cobalt.output", "answer")
        agent.set_attribute("cobalt.output", f"answer to {question}")
    exporter.clear()
print(time.process_time() - started)
"""

WORKLOADS = {
    "noop": NOOP,
    "sync": SYNC_NOOP,
    "contains": CONTAINS,
    "traced": TRACED,
    "file": SYNC_FILE,
}


def start_fake_provider(latency: float) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.fake_provider", "--port", "0", "--latency", str(latency)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline().strip()
    return process, line.split("=", 1)[1]


class Usage(NamedTuple):
    """What a whole process took: wall seconds, CPU seconds (user + system, its threads and
    children), peak RSS in MB."""

    wall: float
    cpu: float
    rss: float


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> Usage:
    """Wall seconds, CPU seconds and peak RSS (MB) of a whole process."""
    started = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+") as stderr:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True
        )
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        elapsed = time.perf_counter() - started
        if process.returncode != 0:
            stderr.seek(0)
            raise SystemExit(f"{command} failed:\n{stderr.read()[-3000:]}")
    return Usage(elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)


def project(folder: Path, name: str, source: str, n: int, config: str = "") -> Path:
    (folder / "experiments").mkdir(parents=True, exist_ok=True)
    (folder / "cobalt.toml").write_text(config)
    (folder / "experiments" / f"{name}.cobalt.py").write_text(
        textwrap.dedent(source).replace("N)", f"{n})").replace("(N)", f"({n})")
    )
    return folder


def run_duration_s(folder: Path) -> float:
    """The newest run's own duration (its results file's `summary.totalDurationMs`), in any
    of the results file's forms (JSON or JSON Lines, gzip-compressed or not)."""
    from cobalt.results_file import read_results, results_files

    newest = max(results_files(folder / ".cobalt" / "results"), key=lambda p: p.stat().st_mtime)
    header, _ = read_results(newest)
    return header["summary"]["totalDurationMs"] / 1000


def bench_replay(args: argparse.Namespace, env: dict[str, str], tmp_path: Path) -> None:
    """Workload 1 with the judge cache warm: live versus replayed."""
    llm = project(tmp_path / "replay", "llm", EXPERIMENT, args.items)
    untraced = project(
        tmp_path / "replay-untraced", "llm", EXPERIMENT, args.items, "[trace]\nenabled = false\n"
    )
    command = [sys.executable, "-m", "cobalt_cli", "run"]
    for folder in (llm, untraced):  # records the agent's calls, warms the judge cache
        timed([*command, "--record"], folder, env)
    times: dict[str, list[tuple[float, float]]] = {"live": [], "replayed": [], "untraced": []}
    for _ in range(args.repeat):
        times["live"].append((timed(command, llm, env)[0], run_duration_s(llm)))
        times["replayed"].append((timed([*command, "--replay"], llm, env)[0], run_duration_s(llm)))
        replayed_untraced = timed([*command, "--replay"], untraced, env)[0]
        times["untraced"].append((replayed_untraced, run_duration_s(untraced)))
    print(f"Replay: {args.items} items x (agent call + judge), judge cache warm, concurrency 40")
    best = {k: (min(t[0] for t in v), min(t[1] for t in v)) for k, v in times.items()}
    rows = (
        ("live", "live (100 ms provider)"),
        ("replayed", "replayed"),
        ("untraced", "replayed, capture off"),
    )
    for key, label in rows:
        runs = ", ".join(f"{p:.2f}/{r:.2f}" for p, r in times[key])
        print(
            f"  {label:<28}: process {best[key][0]:6.2f} s, run {best[key][1]:6.2f} s"
            f"  (process/run: {runs})"
        )
    print(
        f"  ratio replayed/live        : process {best['replayed'][0] / best['live'][0]:.2f}x, "
        f"run {best['replayed'][1] / best['live'][1]:.2f}x  (target < 0.5x)"
    )


def sqlite_floor(n: int, tmp_path: Path, repeat: int) -> float:
    """Seconds of the bare script writing `n` items' rows into SQLite, best of `repeat`."""
    floor_script = tmp_path / "floor.py"
    floor_script.write_text(FLOOR)
    floors = []
    for attempt in range(repeat):
        database = tmp_path / f"floor-{attempt}.db"
        out = subprocess.run(
            [sys.executable, str(floor_script), str(n), str(database)],
            capture_output=True,
            text=True,
            check=True,
        )
        floors.append(float(out.stdout))
        database.unlink()
    return min(floors)


def trace_floor(n: int, tmp_path: Path) -> float:
    """CPU seconds of the bare OpenTelemetry SDK making `n` items' 10 spans (`TRACE_FLOOR`)."""
    script = tmp_path / "trace_floor.py"
    script.write_text(TRACE_FLOOR)
    out = subprocess.run(
        [sys.executable, str(script), str(n)], capture_output=True, text=True, check=True
    )
    return float(out.stdout)


class QuickRun(NamedTuple):
    """A `cobalt run` of quick items: the whole process, and the run's own seconds."""

    usage: Usage
    run: float


def quick_items(
    name: str, n: int, tmp_path: Path, env: dict[str, str], trees: dict[str, Path], repeat: int
) -> dict[str, QuickRun]:
    """Workload `name` at `n` items with each tree (interleaved), the fastest of `repeat`
    (by CPU time: steadier than wall time on a shared machine) per tree."""
    folder = project(tmp_path / name, name, WORKLOADS[name], n)
    if name == "file":
        with (folder / "items.jsonl").open("w") as items:
            items.writelines(f'{{"id": {i}, "input": "q{i}"}}\n' for i in range(n))
    best: dict[str, QuickRun] = {}
    for _ in range(repeat):
        for label, tree in trees.items():
            shutil.rmtree(folder / ".cobalt", ignore_errors=True)
            usage = timed(
                [sys.executable, "-m", "cobalt_cli", "run"],
                folder,
                {**env, "PYTHONPATH": str(tree)},
            )
            if label not in best or usage.cpu < best[label].usage.cpu:
                best[label] = QuickRun(usage, run_duration_s(folder))
    shutil.rmtree(folder, ignore_errors=True)
    return best


def bench_big(args: argparse.Namespace, env: dict[str, str], tmp_path: Path) -> None:
    """Workload 2: quick items, beside the bare-SQLite floor (and another tree's figures)."""
    trees = {"this": REPO, **({"against": args.against.resolve()} if args.against else {})}
    for tree in trees.values():
        compile_sources(tree)
    floor = sqlite_floor(args.big, tmp_path, args.repeat)
    print(f"Quick items: {args.big:,} items, concurrency 40 (best of {args.repeat}, by CPU)")
    print(f"  bare SQLite floor (executemany)  : {floor:6.2f} s = {args.big / floor:9,.0f} items/s")
    for name in args.workloads.split(","):
        best = quick_items(name, args.big, tmp_path, env, trees, args.repeat)
        for label, ((elapsed, cpu, rss), run) in best.items():
            print(
                f"  {name:<8} {label:<7} process {elapsed:6.2f} s = {args.big / elapsed:6,.0f}"
                f" items/s, run {run:5.2f} s = {args.big / run:6,.0f} items/s"
                f" ({run / floor:4.1f}x the floor), CPU {cpu / args.big * 1000:5.3f} ms/item,"
                f" peak RSS {rss:4.0f} MB"
            )


def compile_sources(tree: Path = REPO) -> None:
    """Byte-compile Cobalt's modules, as `pip install` does: where PYTHONDONTWRITEBYTECODE is
    set (this machine sets it) every `cobalt` process would compile them anew, a cost the
    bare script (the SDK came compiled with its wheel) and a user's install never pay."""
    packages = [
        str(tree / name) for name in ("cobalt", "cobalt_app", "cobalt_cli", "cobalt_project")
    ]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *packages], check=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--big", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--replay", action="store_true", help="Only the replay benchmark (3).")
    parser.add_argument("--only", choices=["big"], help="Only the quick-items workloads (2).")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="Of workload 2.")
    parser.add_argument("--against", type=Path, help="Another Cobalt tree, interleaved (2).")
    args = parser.parse_args()
    compile_sources()

    fake, url = start_fake_provider(0.1)
    env = {
        **os.environ,
        "OPENAI_BASE_URL": f"{url}/v1",
        "OPENAI_API_KEY": "sk-bench",
        "PYTHONPATH": str(REPO),
    }
    env = {k: v for k, v in env.items() if not k.startswith("COBALT_")}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tmp_path = Path(tmp)
            if args.replay:
                bench_replay(args, env, tmp_path)
                return
            if args.only == "big":
                bench_big(args, env, tmp_path)
                return
            bare = tmp_path / "bare.py"
            bare.write_text(BARE.replace("range(N)", f"range({args.items})"))
            llm = project(tmp_path / "llm", "llm", EXPERIMENT, args.items)
            untraced = project(
                tmp_path / "untraced", "llm", EXPERIMENT, args.items, "[trace]\nenabled = false\n"
            )
            command = [sys.executable, "-m", "cobalt_cli", "run", "--no-cache"]
            times: dict[str, list[float]] = {"bare": [], "on": [], "off": []}
            for _ in range(args.repeat):
                times["bare"].append(timed([sys.executable, str(bare)], tmp_path, env)[0])
                times["on"].append(timed(command, llm, env)[0])
                times["off"].append(timed(command, untraced, env)[0])
            best = {k: min(v) for k, v in times.items()}
            print(f"LLM workload: {args.items} items x 2 calls at 100 ms, concurrency 40")
            rows = [
                ("bare asyncio + openai SDK", "bare"),
                ("cobalt run, traces captured", "on"),
                ("cobalt run, capture off", "off"),
            ]
            for label, key in rows:
                runs = ", ".join(f"{t:.2f}" for t in times[key])
                print(f"  {label:<28}: {best[key]:6.2f} s  (runs: {runs})")
            print(
                f"  ratio, capture on          : {best['on'] / best['bare']:6.2f}x  (target <= 1.10x)"
            )
            print(
                f"  ratio, capture off         : {best['off'] / best['bare']:6.2f}x  (target <= 1.10x)"
            )

            bench_big(args, env, tmp_path)
    finally:
        fake.terminate()
        fake.wait(timeout=10)


if __name__ == "__main__":
    main()
