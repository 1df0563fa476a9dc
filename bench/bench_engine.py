"""Engine benchmarks (issue 2). Run: `python bench/bench_engine.py [--items 400] [--big 50000]`.

1. 400 items × (one agent call + one llm-judge call) against the fake provider with 100 ms
   latency, concurrency 40: the whole `cobalt run --no-cache` process versus a bare asyncio
   script making the same calls with the OpenAI SDK.
   Twice: with trace capture on (the default: every agent call becomes a span, stored with
   its item) and off (`[trace] enabled = false`); the target holds for both (issue 15: capture
   stays within 1.10x of the bare script).
2. 50,000 items, no-op runner, one function evaluator: items/s of the whole `cobalt run`
   process and its peak RSS; async, then sync (a sync runner and a sync function evaluator
   with a `pass_threshold`, scoring below it: every item fails its mark).
3. `--replay` (issue 16; `python bench/bench_engine.py --replay`, alone): workload 1 with
   the judge cache warm, live (`cobalt run`) versus replayed (`cobalt run --replay`, after one
   `--record`): the whole process, and the run's own duration from its results file. Target:
   replayed < 0.5x live.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

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


def start_fake_provider(latency: float) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.fake_provider", "--port", "0", "--latency", str(latency)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline().strip()
    return process, line.split("=", 1)[1]


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of a whole process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    result = subprocess.run(
        command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{command} failed:\n{result.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return elapsed, max(after, before) / 1024


def project(folder: Path, name: str, source: str, n: int, config: str = "") -> Path:
    (folder / "experiments").mkdir(parents=True, exist_ok=True)
    (folder / "cobalt.toml").write_text(config)
    (folder / "experiments" / f"{name}.cobalt.py").write_text(
        textwrap.dedent(source).replace("N)", f"{n})").replace("(N)", f"({n})")
    )
    return folder


def run_duration_s(folder: Path) -> float:
    """The newest run's own duration (its results file's `summary.totalDurationMs`)."""
    newest = max((folder / ".cobalt" / "results").glob("*.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(newest.read_text())["summary"]["totalDurationMs"] / 1000


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


def compile_sources() -> None:
    """Byte-compile Cobalt's modules, as `pip install` does: where PYTHONDONTWRITEBYTECODE is
    set (this machine sets it) every `cobalt` process would compile them anew, a cost the
    bare script (the SDK came compiled with its wheel) and a user's install never pay."""
    packages = [
        str(REPO / name) for name in ("cobalt", "cobalt_app", "cobalt_cli", "cobalt_project")
    ]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *packages], check=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--big", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--replay", action="store_true", help="Only the replay benchmark (3).")
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

            noop = project(tmp_path / "noop", "noop", NOOP, args.big)
            elapsed, rss = timed([sys.executable, "-m", "cobalt_cli", "run"], noop, env)
            print(f"No-op workload: {args.big} items, function evaluator")
            print(
                f"  whole process             : {elapsed:6.2f} s = {args.big / elapsed:,.0f} items/s (target >= 2,000)"
            )
            print(f"  peak RSS                  : {rss:6.0f} MB (target < 300)")

            sync = project(tmp_path / "sync", "sync", SYNC_NOOP, args.big)
            elapsed, rss = timed([sys.executable, "-m", "cobalt_cli", "run"], sync, env)
            print(f"Sync workload: {args.big} items, sync runner, sync function evaluator")
            print(
                f"  whole process             : {elapsed:6.2f} s = {args.big / elapsed:,.0f} items/s"
            )
            print(f"  peak RSS                  : {rss:6.0f} MB")
    finally:
        fake.terminate()
        fake.wait(timeout=10)


if __name__ == "__main__":
    main()
