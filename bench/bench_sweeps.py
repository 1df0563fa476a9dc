"""Sweeps (issue 38). Run: `python bench/bench_sweeps.py [--variants 12] [--items 500]
[--page-items 10000] [--repeat 9]`.

1. Throughput: the same engine work as one sweep of `--variants` × `--items` items and as one
   run of variants × items items (an async runner awaiting 5 ms, a function evaluator,
   concurrency 20), each also at half the items: the CPU time of the whole `cobalt run`
   process, and from the two sizes the engine's CPU per item (the throughput) and the fixed
   CPU (start-up; for the sweep also each run's creation and finalisation, scipy and the
   analysis). Target: the same CPU per item.
2. The sweep page at `--variants` × `--page-items` items: a project whose history holds one
   sweep of that size (bulk inserts and the real finalisation: summaries and score tables),
   the analysis timed once (`sweeps.settle`, what the last run's finalisation does), then
   `cobalt serve` and the page timed over HTTP with httpx after a warm-up: median, p95, max
   of `--repeat` keep-alive requests, for the whole page and for the next page of the matrix
   (htmx), beside the CPU time of the same request served in this process; then the page of
   the sweep with its last run marked running (computed per request, not stored).
   Target: < 500 ms.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

from bench_dashboard import serve  # noqa: E402

EXPERIMENT = """
import asyncio
from cobalt import Dataset, Evaluator, experiment

items = [{{"id": f"q{{i}}", "input": i}} for i in range({items})]

async def run(ctx):
    await asyncio.sleep(0.005)
    return {{"output": str(ctx.item["input"] * {factor})}}

experiment("work", Dataset(items=items), run, concurrency=20,
           evaluators=[Evaluator(name="even", type="function",
                                 fn=lambda c: float(int(c.output) % 2 == 0))],
           {variants})
"""


def write_project(folder: Path, items: int, variants: int | None) -> Path:
    (folder / "experiments").mkdir(parents=True, exist_ok=True)
    (folder / "cobalt.toml").write_text('test_dir = "experiments"\n')
    declared = f'variants={{"factor": list(range(1, {variants} + 1))}}' if variants else ""
    factor = 'ctx.variant.get("factor", 1)'
    source = EXPERIMENT.format(items=items, factor=factor, variants=declared)
    (folder / "experiments" / "work.cobalt.py").write_text(source)
    return folder


def engine_seconds(folder: Path) -> float:
    """The newest runs' own durations (their results files' `totalDurationMs`), summed: the
    engine's time without the process's start-up."""
    from cobalt.results_file import read_results, results_files

    total = 0.0
    for path in results_files(folder / ".cobalt" / "results"):
        if "_sweep_" in path.name:
            continue
        header, _ = read_results(path)
        total += header["summary"]["totalDurationMs"] / 1000
    return total


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (MB) of a whole process: on a
    machine others load, CPU time says what the work costs and wall time what it waited."""
    started = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+") as stderr:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True
        )
        _, status, usage = os.wait4(process.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            stderr.seek(0)
            raise SystemExit(f"{command} failed:\n{stderr.read()[-3000:]}")
    elapsed = time.perf_counter() - started
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def bench_throughput(args: argparse.Namespace, tmp: Path) -> None:
    """Each workload at half and at full size: the CPU seconds per item between the two are
    the engine's cost of an item (start-up, imports and each run's fixed costs cancel out),
    what is left at zero items its fixed cost. CPU, not wall: other work on the machine
    stretches wall time (and a GIL-holding thread it preempts) but not CPU time."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COBALT_")}
    env["PYTHONPATH"] = str(REPO)
    total = args.variants * args.items
    command = [sys.executable, "-m", "cobalt_cli", "run", "--quiet"]
    shapes = {"one run": lambda n: (args.variants * n, None), "sweep": lambda n: (n, args.variants)}
    sizes = (args.items // 2, args.items)
    least: dict[tuple[str, int], tuple[float, float, float, float]] = {}
    for round_ in range(args.rounds):  # interleaved: every workload sees the same load
        for n in sizes:
            for shape, given in shapes.items():
                items, variants = given(n)
                folder = write_project(tmp / f"{round_}-{shape}-{n}", items, variants)
                seconds, cpu, rss = timed(command, folder, env)
                if (shape, n) not in least or cpu < least[(shape, n)][1]:
                    least[(shape, n)] = (seconds, cpu, engine_seconds(folder), rss)
    print(f"\n{'workload (least CPU of ' + str(args.rounds) + ')':<34} {'wall s':>8} "
          f"{'CPU s':>7} {'runs s':>8} {'RSS MB':>8}")  # fmt: skip
    for (shape, n), (seconds, cpu, engine, rss) in least.items():
        items, variants = shapes[shape](n)
        label = f"sweep {variants} × {items:,} items" if variants else f"one run of {items:,} items"
        print(f"{label:<34} {seconds:>8.2f} {cpu:>7.2f} {engine:>8.2f} {rss:>8.0f}")
    half = total - args.variants * sizes[0]
    for shape in shapes:
        slope = (least[(shape, sizes[1])][1] - least[(shape, sizes[0])][1]) / half
        fixed = least[(shape, sizes[1])][1] - slope * total
        print(f"{shape:<8} engine CPU per item {slope * 1e6:>6.0f} µs ({1 / slope:>5.0f} items "
              f"per CPU second); fixed CPU {fixed:.2f} s")  # fmt: skip
    single, sweep = (least[(shape, sizes[1])] for shape in shapes)
    print(f"sweep / one run at {total:,} items: CPU {sweep[1] / single[1]:.2f}x, "
          f"wall {sweep[0] / single[0]:.2f}x, runs {sweep[2] / single[2]:.2f}x")  # fmt: skip


def build_sweep(project: Path, *, variants: int, items: int, seed: int = 7) -> str:
    from cobalt.config import load_config
    from cobalt_project import bootstrap

    bootstrap.setup(load_config(project))
    from django.db import transaction

    from cobalt_app import sweeps
    from cobalt_app.models import Evaluation, ItemResult, Run, Sweep
    from cobalt_app.results import run_finalise

    rng = random.Random(seed)
    evaluators = [{"name": "relevance", "type": "llm-judge"}, {"name": "exact"}]
    declared = [{"label": f"model=m{v}", "values": {"model": f"m{v}"}} for v in range(variants)]
    sweep = Sweep.objects.create(name="qa", variants=declared, default_label="model=m0")
    started = time.perf_counter()
    for v, variant in enumerate(declared):
        shift = (v - variants / 2) * 0.01
        with transaction.atomic():
            run = Run.objects.create(
                name=f"qa [{variant['label']}]",
                status=Run.Status.RUNNING,
                config={"runs": 1, "evaluators": evaluators},
                total_items=items,
                finished_items=items,
                sweep=sweep,
                variant=variant,
            )
            rows = [
                ItemResult(
                    run=run,
                    item_index=i,
                    item_key=f"item-{i:06d}",
                    input={"id": i},
                    output=f"answer {i} {v}",
                    status="ok" if rng.random() > 0.01 else "error",
                    latency_ms=rng.uniform(50, 3000),
                    tokens=rng.randint(100, 900),
                    cost=0.0001 * (v + 1),
                )
                for i in range(items)
            ]
            ItemResult.objects.bulk_create(rows, batch_size=2000)
            scores = []
            for row in rows:
                if row.status != "ok":
                    continue
                score = min(1.0, max(0.0, rng.gauss(0.7 + shift, 0.15)))
                scores.append(
                    Evaluation(item_id=row.id, run=run, evaluator="relevance", score=score)
                )
                exact = float(rng.random() < 0.6 + shift)
                scores.append(Evaluation(item_id=row.id, run=run, evaluator="exact", score=exact))
            Evaluation.objects.bulk_create(scores, batch_size=2000)
        run_finalise(run.id)
    print(f"built {variants} runs × {items:,} items in {time.perf_counter() - started:.1f}s")
    started = time.perf_counter()
    sweeps.settle([sweep.id], load_config(project))  # as the last run's finalisation does
    print(f"analysis (ranking, {variants - 1} paired tests, Holm, Pareto): "
          f"{(time.perf_counter() - started) * 1000:.0f} ms")  # fmt: skip
    return sweep.id


def bench_page(args: argparse.Namespace, tmp: Path) -> None:
    project = tmp / "page"
    project.mkdir()
    (project / "cobalt.toml").write_text('test_dir = "experiments"\n')
    sweep_id = build_sweep(project, variants=args.variants, items=args.page_items)
    server, base = serve(project)
    cases = [
        ("sweep page", f"/sweeps/{sweep_id}/", {}),
        ("matrix page 2 (htmx)", f"/sweeps/{sweep_id}/?page=2", {"HX-Request": "true"}),
        ("API sweep", f"/api/sweeps/{sweep_id}/", {}),
    ]
    try:
        with httpx.Client(base_url=base, timeout=60) as client:
            print(f"\n{'page (HTTP wall; CPU in process)':<30} {'median ms':>10} {'p95 ms':>8} "
                  f"{'max ms':>8} {'CPU ms':>8}")  # fmt: skip
            time_pages(client, cases, args.repeat)
            # A sweep still running: its page computes what is known so far (not stored).
            from cobalt_app.models import Run

            last = Run.objects.filter(sweep_id=sweep_id).order_by("-created_at").first()
            Run.objects.filter(id=last.id).update(status=Run.Status.RUNNING, finished_at=None)
            running = [("sweep page, 1 run running", f"/sweeps/{sweep_id}/", {})]
            time_pages(client, running, max(3, args.repeat // 3))
    finally:
        server.terminate()
        server.wait(timeout=30)


def time_pages(client: httpx.Client, cases: list[tuple[str, str, dict]], repeat: int) -> None:
    """Median, p95 and max of `repeat` requests of each page, after one to warm up."""
    for name, url, headers in cases:
        assert client.get(url, headers=headers).status_code == 200  # warm-up
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            response = client.get(url, headers=headers)
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200
        times.sort()
        p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
        cpu = statistics.median(page_cpu_ms(url, headers) for _ in range(repeat))
        print(f"{name:<30} {statistics.median(times):>10.0f} {p95:>8.0f} {times[-1]:>8.0f} "
              f"{cpu:>8.0f}")  # fmt: skip


def page_cpu_ms(url: str, headers: dict[str, str]) -> float:
    """The CPU time of one request served in this process (Django's test client, the same
    view and database): what the page costs, whatever else the machine is doing."""
    from django.test import Client

    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    started = time.thread_time()
    response = Client(HTTP_HOST="127.0.0.1").get(url, **extra)
    assert response.status_code == 200, response.status_code
    return (time.thread_time() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", type=int, default=12)
    parser.add_argument("--items", type=int, default=500)
    parser.add_argument("--page-items", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=2, help="Throughput rounds (best kept).")
    parser.add_argument("--only", choices=("throughput", "page"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cobalt-bench-sweeps-") as folder:
        tmp = Path(folder)
        if args.only != "page":
            bench_throughput(args, tmp)
        if args.only != "throughput":
            bench_page(args, tmp)


if __name__ == "__main__":
    main()
