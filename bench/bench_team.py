"""Team-mode benchmarks (issue 3). Run: `python bench/bench_team.py [--items 400] [--repeat 3]`.

Needs PostgreSQL on 127.0.0.1:5432 (database `cobalt_bench_team_<pid>`, dropped at the end)
and Redis on 127.0.0.1:6379 (DB 6, flushed).

1. 400 items × (one agent call + one llm-judge call) against the fake provider (a separate
   process) with 100 ms latency, one `cobalt worker --concurrency 40` (as it starts by
   default, one process per core; then with `--processes 1`): the whole
   `cobalt run --no-cache` process (start, enqueue, wait, stream, results file) versus a
   bare asyncio script making the same calls with the OpenAI SDK at concurrency 40.
2. Dispatch overhead per item, no-op runner (experiment concurrency 40): what `team.enqueue`
   costs per item (a run is published as at most `concurrency` lane messages); the worker's
   wall time per item at `--concurrency 40` (receive, claim, execute, record, finalise
   check, ack — overlapped as in real use); and with `--concurrency 1`, one lane, where
   nothing overlaps.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psycopg
import redis
from bench_engine import (  # the same workload and bare script as the engine bench
    BARE,
    EXPERIMENT,
    start_fake_provider,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cobalt_cli.commands_team import process_count  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
BROKER = "redis://127.0.0.1:6379/6"

NOOP = """
from cobalt import Dataset, experiment

dataset = Dataset(items=[{"id": i, "input": f"q{i}"} for i in range(N)])

@experiment("bench-team-noop", dataset, concurrency=40)
def run(ctx):
    return ctx.item["input"]
"""


def project(folder: Path, source: str, n: int) -> Path:
    (folder / "experiments").mkdir(parents=True, exist_ok=True)
    (folder / "cobalt.toml").write_text("")
    (folder / "experiments" / "bench.cobalt.py").write_text(
        textwrap.dedent(source).replace("range(N)", f"range({n})")
    )
    return folder


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{command} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return elapsed


def start_worker(
    folder: Path, env: dict[str, str], concurrency: int, processes: int | None = None
) -> tuple[subprocess.Popen, int]:
    """`cobalt worker` (its default `--processes auto` when `processes` is None)."""
    command = [sys.executable, "-m", "cobalt_cli", "worker", f"--concurrency={concurrency}"]
    if processes is not None:
        command.append(f"--processes={processes}")
    expected = processes or process_count("auto", concurrency)
    worker = subprocess.Popen(
        command, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    client = redis.Redis.from_url(BROKER)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if sum(1 for _ in client.scan_iter("cobalt:worker:*")) >= expected:
            return worker, expected
        time.sleep(0.05)
    worker.kill()
    raise SystemExit("the worker did not start")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()


def latest_run(database_url: str) -> tuple[float, int]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            "SELECT duration_ms, total_items FROM cobalt_app_run ORDER BY created_at DESC LIMIT 1"
        ).fetchone()


def publish_cost(folder: Path, env: dict[str, str], n: int) -> float:
    """Milliseconds per item of `team.enqueue` (Celery publish), measured in this process."""
    script = textwrap.dedent(
        f"""
        import time
        from cobalt.config import load_config
        from cobalt_project import bootstrap
        config = bootstrap.setup(load_config({str(folder)!r}))
        from cobalt_app import launcher, team
        from cobalt_app.runs import lifecycle
        experiments, _, _ = launcher.load_experiments(config)
        original = team.enqueue
        spent = []
        def measured(run_id, ids):
            started = time.perf_counter()
            original(run_id, ids)
            spent.append((time.perf_counter() - started) / max(len(ids), 1) * 1000)
        team.enqueue = measured
        run, ids = team.start_run(experiments[0], config, file="experiments/bench.cobalt.py")
        lifecycle.cancel(run.id)
        print(spent[0])
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=folder, env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise SystemExit(result.stderr[-3000:])
    return float(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--noop", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    database = f"cobalt_bench_team_{os.getpid()}"
    database_url = f"postgresql://postgres@127.0.0.1:5432/{database}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    redis.Redis.from_url(BROKER).flushdb()
    fake, url = start_fake_provider(0.1)
    base = {k: v for k, v in os.environ.items() if not k.startswith("COBALT_")}
    base.update({"OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": "sk-bench"})
    base["PYTHONPATH"] = str(REPO)
    team_env = {**base, "COBALT_DATABASE_URL": database_url, "COBALT_BROKER_URL": BROKER}
    workers: list[subprocess.Popen] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tmp_path = Path(tmp)
            bare = tmp_path / "bare.py"
            bare.write_text(BARE.replace("range(N)", f"range({args.items})"))
            llm = project(tmp_path / "llm", EXPERIMENT, args.items)
            timed([sys.executable, "-m", "cobalt_cli", "migrate"], llm, team_env)
            run = [sys.executable, "-m", "cobalt_cli", "run", "--no-cache", "-q"]
            bare_times = [
                timed([sys.executable, str(bare)], tmp_path, base) for _ in range(args.repeat)
            ]
            bare_best = min(bare_times)
            print(f"LLM workload: {args.items} items x 2 calls at 100 ms, concurrency 40, 1 worker")
            print(
                f"  bare asyncio + openai SDK       : {bare_best:6.2f} s  (runs: {', '.join(f'{t:.2f}' for t in bare_times)})"
            )
            for processes in (None, 1):
                worker, count = start_worker(llm, team_env, 40, processes)
                workers.append(worker)
                timed(run, llm, team_env)  # warm-up: imports and connections of the worker
                team_times, inside = [], []
                for _ in range(args.repeat):
                    team_times.append(timed(run, llm, team_env))
                    inside.append(latest_run(database_url)[0] / 1000)
                stop(workers.pop())
                best = min(team_times)
                if processes is None:
                    label = f"cobalt worker (default: {count} proc.)"
                else:
                    label = f"cobalt worker --processes {processes}"
                print(
                    f"  {label:32}: {best:6.2f} s  (runs: {', '.join(f'{t:.2f}' for t in team_times)}; first claim → finalised {min(inside):.2f} s)"
                )
                print(f"  {'ratio':32}: {best / bare_best:6.2f}x  (target <= 1.5x)")

            noop = project(tmp_path / "noop", NOOP, args.noop)
            publish = publish_cost(noop, team_env, args.noop)
            runs = [sys.executable, "-m", "cobalt_cli", "run", "-q"]
            print(f"Dispatch overhead ({args.noop} no-op items, one worker)")
            print(f"  publish per item (enqueue)                   : {publish:6.2f} ms")
            for concurrency, processes in ((40, 1), (40, 2), (1, 1)):
                workers.append(start_worker(noop, team_env, concurrency, processes)[0])
                timed(runs, noop, team_env)
                timed(runs, noop, team_env)
                duration_ms, total = latest_run(database_url)
                stop(workers.pop())
                label = f"wall/N, --concurrency {concurrency} --processes {processes}"
                print(f"  {label:45}: {duration_ms / total:6.2f} ms (target < 5 ms)")
    finally:
        for worker in workers:
            stop(worker)
        fake.terminate()
        fake.wait(timeout=10)
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        redis.Redis.from_url(BROKER).flushdb()


if __name__ == "__main__":
    main()
