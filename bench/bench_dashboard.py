"""Dashboard speed (issue 4): pages over real HTTP against `cobalt serve`, embedded SQLite.

    python bench/bench_dashboard.py [--items 50000] [--small 20] [--repeat 9] [--keep DIR]

Builds a project whose history holds two runs of `--items` items (same item keys, scores
moved between them, 1% errors, two evaluators) plus `--small` runs of 100 items over three
experiments and tags (one of them still running), with bulk inserts and the real
finalisation (`run_finalise` stores each summary and score table). `--items 500000` is the
1,000,000-item size (two runs of 500,000). It times `selectors.compare_runs` of the
two big runs in-process (what `cobalt compare`, the API, MCP and the compare page call; target
< 1 s), then starts `cobalt serve` as a subprocess and times each page with httpx: after a
warm-up pass over all pages, the median, p95 and max of `--repeat` keep-alive requests.
Targets: list < 200 ms, detail < 300 ms, compare of the two big runs < 1 s, trends < 300 ms,
next items page (and the API's) < 200 ms. The run page opens on its failures (worst first);
the items pages ask for `view=all`. A run of one item with a 5 MB single-line output and
5,000 trace steps times that item's page, its panel and a page of its trace (< 300 ms, and
the bytes column shows each stays under 1 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
HTMX = {"HX-Request": "true"}


def build(project: Path, *, items: int, small: int, seed: int = 7) -> dict[str, str]:
    """Fill the project's embedded database; returns the ids the pages are timed on."""
    sys.path.insert(0, str(REPO))
    from cobalt.config import load_config
    from cobalt_project import bootstrap

    bootstrap.setup(load_config(project))
    from django.db import transaction
    from django.utils import timezone

    from cobalt_app.models import Evaluation, ItemResult, Run, RunTag
    from cobalt_app.results import run_finalise

    rng = random.Random(seed)
    evaluators = [
        {"name": "relevance", "type": "llm-judge"},
        {"name": "exact", "type": "exact-match"},
    ]
    now = timezone.now()

    def make_run(name, count, *, tags, age, shift=0.0, status=Run.Status.COMPLETED, done=None):
        done = count if done is None else done
        created = now - timedelta(hours=age)
        with transaction.atomic():
            run = Run.objects.create(
                name=name,
                file=f"experiments/{name}.cobalt.py",
                status=Run.Status.RUNNING,
                tags=tags,
                config={"runs": 1, "concurrency": 10, "timeout": 30, "evaluators": evaluators},
                created_at=created,
                started_at=created,
                finished_at=created + timedelta(seconds=count / 50) if done == count else None,
                total_items=count,
                finished_items=done,
            )
            RunTag.objects.bulk_create([RunTag(run=run, name=t) for t in tags])
            for start in range(0, count, 5000):
                rows = []
                for i in range(start, min(count, start + 5000)):
                    finished = i < done
                    failed = finished and rng.random() < 0.01
                    status_ = "pending" if not finished else "error" if failed else "ok"
                    rows.append(
                        ItemResult(
                            run=run,
                            item_index=i,
                            run_index=0,
                            item_key=f"item-{i:06d}",
                            input={"id": f"item-{i:06d}", "input": f"Question number {i}?"},
                            output=None if status_ != "ok" else f"Answer {i} " + "lorem " * 20,
                            metadata={"model": "gpt-4o-mini"} if status_ == "ok" else {},
                            status=status_,
                            error="RuntimeError: agent crashed" if failed else "",
                            latency_ms=rng.uniform(50, 3000) if finished else None,
                            tokens=rng.randint(100, 900) if status_ == "ok" else 0,
                            cost=0.0001 if status_ == "ok" else 0.0,
                        )
                    )
                ItemResult.objects.bulk_create(rows, batch_size=1000)
                scores = []
                for row in rows:
                    if row.status != "ok":
                        continue
                    relevance = min(1.0, max(0.0, rng.gauss(0.7 + shift, 0.15)))
                    scores.append(
                        Evaluation(
                            item_id=row.id,
                            run=run,
                            evaluator="relevance",
                            score=round(relevance, 3),
                            reason="fake judge: plausible answer",
                            tokens=120,
                            cost=0.00002,
                        )
                    )
                    scores.append(
                        Evaluation(
                            item_id=row.id,
                            run=run,
                            evaluator="exact",
                            score=float(rng.random() < 0.6 + shift),
                        )
                    )
                Evaluation.objects.bulk_create(scores, batch_size=1000)
        if done == count:
            run_finalise(run.id)
        return run

    started = time.perf_counter()
    big_a = make_run("qa-agent", items, tags=["baseline"], age=30)
    big_b = make_run("qa-agent", items, tags=["v2"], age=20, shift=0.05)
    experiments = ["qa-agent", "summariser", "router"]
    small_ids = []
    for i in range(small):
        running = i == small - 1
        run = make_run(
            experiments[i % 3],
            100,
            tags=["nightly", f"v{i % 4}"],
            age=small - i,
            shift=rng.uniform(-0.1, 0.1),
            done=40 if running else None,
        )
        small_ids.append(run.id)
    big_item = make_big_item()
    print(
        f"built {ItemResult.objects.count():,} item results, "
        f"{Evaluation.objects.count():,} evaluations, {Run.objects.count()} runs "
        f"in {time.perf_counter() - started:.1f}s"
    )
    return {"a": big_a.id, "b": big_b.id, "running": small_ids[-1], "big_item": big_item}


BIG_OUTPUT_CHARS = 5_000_000
BIG_TRACE_STEPS = 5_000


def make_big_item() -> str:
    """A run of one item whose output is a 5 MB single-line string and whose trace has 5,000
    steps (1,200 model calls, 2,400 searches, then calls and fetches in turn), stored by the
    engine's trace write; returns the item page's path."""
    from cobalt_app import trace_store
    from cobalt_app.models import ItemResult, Run

    output = "".join(f"{i:07d}," for i in range(BIG_OUTPUT_CHARS // 8))
    run = Run.objects.create(
        name="big-item",
        file="experiments/big.cobalt.py",
        status=Run.Status.COMPLETED,
        config={"runs": 1, "concurrency": 1, "timeout": 30, "evaluators": []},
        total_items=1,
        finished_items=1,
    )
    item = ItemResult.objects.create(
        run=run,
        item_index=0,
        run_index=0,
        item_key="big",
        input={"id": "big"},
        output=output,
        status="ok",
        latency_ms=5000.0,
    )
    steps = []
    for i in range(BIG_TRACE_STEPS):
        llm = i < 1_200 or (i >= 3_600 and i % 2 == 0)
        steps.append(
            {
                "name": "chat" if llm else ("search" if i < 3_600 else "fetch"),
                "kind": "llm" if llm else "tool",
                "parent": None,
                "startMs": float(i),
                "durationMs": 0.8,
                "model": "gpt-4o-mini" if llm else None,
                "inputTokens": 100 if llm else None,
                "outputTokens": 20 if llm else None,
                "cost": 0.00002 if llm else None,
                "status": "ok",
                "error": None,
                "input": f"step {i} input " + "x" * 200,
                "output": f"step {i} output " + "y" * 200,
            }
        )
    trace_store.write([(item.id, json.dumps(steps, ensure_ascii=False), steps, "")])
    return f"/runs/{run.id}/items/{item.id}/"


def serve(project: Path) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COBALT_", "DJANGO_"))}
    env["PYTHONPATH"] = str(REPO)
    process = subprocess.Popen(
        [sys.executable, "-m", "cobalt_cli", "serve", "--port", "0"],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        match = re.search(r"Cobalt dashboard: (http://\S+?)/ ", line)
        if match:
            return process, match.group(1)
        if not line and process.poll() is not None:
            break
    process.kill()
    raise SystemExit("cobalt serve did not start")


def first_item(client: httpx.Client, run_id: str) -> str:
    page = client.get(f"/runs/{run_id}/", headers={**HTMX, "HX-Target": "items"}).text
    return re.search(r'href="(/runs/[^"]+/items/\d+/)"', page).group(1)


def time_compare_runs(project: Path, a: str, b: str, repeat: int, size: str) -> tuple:
    """`selectors.compare_runs` of the two big runs in this process, as `cobalt compare`, the
    API, the MCP tool and the compare page call it: a table row like the pages' ones."""
    sys.path.insert(0, str(REPO))
    from cobalt.config import load_config
    from cobalt_project import bootstrap

    bootstrap.setup(load_config(project))
    from cobalt_app.models import Run
    from cobalt_app.selectors import compare_runs

    run_a, run_b = Run.objects.get(id=a), Run.objects.get(id=b)
    times = []
    for _ in range(repeat + 1):
        started = time.perf_counter()
        diff = compare_runs(run_a, run_b)
        times.append((time.perf_counter() - started) * 1000)
    first, times = times[0], sorted(times[1:])
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    length = len(json.dumps(diff, default=str))
    median = statistics.median(times)
    return (f"compare_runs() {size} vs {size}", first, median, p95, times[-1], 1000, length)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=50_000)
    parser.add_argument("--small", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--keep", type=Path, help="Build (or reuse) the project in this folder.")
    args = parser.parse_args()

    project = prepare_project(args.keep)
    ids = project_runs(project, items=args.items, small=args.small)
    # The selector first, in this process, before the server competes for the cores.
    scale = f"{args.items // 1000}k" if args.items >= 1000 else str(args.items)
    selector = time_compare_runs(project, ids["a"], ids["b"], args.repeat, scale)
    process, base = serve(project)
    try:
        rows = [selector, *time_pages(base, page_cases(ids, scale), ids["a"], args.repeat)]
    finally:
        process.terminate()
        process.wait(timeout=30)
        if not args.keep:
            shutil.rmtree(project, ignore_errors=True)
    failed = print_table(rows)
    sys.exit(1 if failed else 0)


def prepare_project(keep: Path | None) -> Path:
    """The project folder: `--keep`'s (made if need be), else a new temporary one."""
    if keep:
        project = keep.resolve()
        project.mkdir(parents=True, exist_ok=True)
    else:
        project = Path(tempfile.mkdtemp(prefix="cobalt-bench-dashboard-"))
    (project / "cobalt.toml").write_text('test_dir = "experiments"\n')
    return project


def project_runs(project: Path, *, items: int, small: int) -> dict[str, str]:
    """The ids of the benchmark's runs: built once, then read from `.bench-ids`."""
    ids_file = project / ".bench-ids"
    if ids_file.exists():
        return dict(line.split("=", 1) for line in ids_file.read_text().split())
    ids = build(project, items=items, small=small)
    ids_file.write_text("\n".join(f"{k}={v}" for k, v in ids.items()))
    return ids


def page_cases(ids: dict[str, str], scale: str) -> list[tuple[str, str | None, dict, int]]:
    """(name, URL, headers, target in ms) of each page timed; the item panel's URL (None) is
    found at run time."""
    a, b, running = ids["a"], ids["b"], ids["running"]
    items_partial = {**HTMX, "HX-Target": "items"}
    big = ids.get("big_item")  # absent from a project `--keep` built before it
    big_cases = [
        ("item: 5 MB output, 5,000 steps", big, {}, 300),
        ("  its panel (htmx)", big, HTMX, 300),
        ("  its trace, page 30 (htmx)", f"{big}?page=30", {**HTMX, "HX-Target": "item-trace"}, 300),
    ]
    return [
        *(big_cases if big else []),
        ("runs list", "/", {}, 200),
        ("runs list, tag filter", "/?tag=v2", HTMX, 200),
        (f"run detail ({scale} items)", f"/runs/{a}/", {}, 300),
        ("failures: page 2", f"/runs/{a}/?view=failures&page=2", items_partial, 200),
        ("failures of one evaluator", f"/runs/{a}/?evaluator=exact", items_partial, 200),
        ("items: next page", f"/runs/{a}/?view=all&page=2", items_partial, 200),
        ("items: page 500", f"/runs/{a}/?view=all&page=500", items_partial, 200),
        ("items: sort by score", f"/runs/{a}/?sort=-score:relevance&page=2", items_partial, 200),
        ("items: score ≤ 0.3", f"/runs/{a}/?evaluator=relevance&max=0.3", items_partial, 200),
        ("items: status error", f"/runs/{a}/?status=error", items_partial, 200),
        ("item panel", None, HTMX, 200),
        ("live progress (running run)", f"/runs/{running}/", {**HTMX, "HX-Target": "live"}, 200),
        (f"compare {scale} vs {scale}", f"/compare/?a={a}&b={b}", {}, 1000),
        (
            "compare: regressed, page 5",
            f"/compare/?a={a}&b={b}&change=regressed&page=5",
            {**HTMX, "HX-Target": "pairs"},
            1000,
        ),
        ("API: items, page 2", f"/api/runs/{a}/items/?page=2", {}, 200),
        ("trends", "/trends/?experiment=qa-agent", {}, 300),
        ("trends, tag filter", "/trends/?experiment=qa-agent&tag=nightly", HTMX, 300),
    ]


def time_pages(base: str, cases: list, run_id: str, repeat: int) -> list[tuple]:
    """Each page's row: (name, first, median, p95, max, target, bytes)."""
    rows = []
    with httpx.Client(base_url=base, timeout=60) as client:
        item_url = first_item(client, run_id)
        # One pass over every page first: each worker process imports its views and
        # scipy (in a background thread at start) before anything is timed.
        first: dict[str, float] = {}
        for _ in range(2):
            for name, url, headers, _target in cases:
                started = time.perf_counter()
                client.get(url or item_url, headers=headers).raise_for_status()
                first.setdefault(name, (time.perf_counter() - started) * 1000)
        for name, url, headers, target in cases:
            url = url or item_url
            times = []
            for _ in range(repeat):
                started = time.perf_counter()
                reply = client.get(url, headers=headers)
                times.append((time.perf_counter() - started) * 1000)
                if reply.status_code not in (200, 286):
                    raise SystemExit(f"{url}: HTTP {reply.status_code}")
            times.sort()
            p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
            median = statistics.median(times)
            rows.append((name, first[name], median, p95, times[-1], target, len(reply.content)))
    return rows


def print_table(rows: list[tuple]) -> int:
    """Print each row against its target; returns how many missed it."""
    print(
        f"\n{'page':32} {'first':>9} {'median':>8} {'p95':>8} {'max':>8} {'target':>8} "
        f"{'bytes':>9}  ok"
    )
    failed = 0
    for name, cold, median, p95, worst, target, size in rows:
        ok = median < target
        failed += not ok
        print(
            f"{name:32} {cold:7.1f}ms {median:6.1f}ms {p95:6.1f}ms {worst:6.1f}ms {target:6d}ms "
            f"{size:9,}  {'✓' if ok else '✗'}"
        )
    print("first = the first request after the server started (workers still warming up)")
    print(f"\n{len(rows) - failed}/{len(rows)} pages under target (median)")
    return failed


if __name__ == "__main__":
    main()
