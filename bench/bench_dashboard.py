"""Dashboard speed (issue 4): pages over real HTTP against `cobalt serve`, embedded SQLite.

    python bench/bench_dashboard.py [--items 50000] [--traces] [--small 20] [--repeat 9]
                                    [--keep DIR] [--json FILE] [--tree DIR]

Builds a project whose history holds three runs of `--items` items (same item keys, scores
moved between them, 1% errors, two evaluators) plus `--small` runs of 100 items over three
experiments and tags (one of them still running), with bulk inserts and the real
finalisation (`run_finalise` stores each summary and score table). `--items 500000` is the
1,000,000-item size (two runs of 500,000). It times `selectors.compare_runs` of the
two big runs in-process (what `cobalt compare`, the API, MCP and the compare page call; target
< 1 s) and `page_compare.compare` of the first against the other two (N=3: the verdict strip,
both pairs' tests and the first page of items; target < 1 s), then starts `cobalt serve` as a subprocess and times each page with httpx: after a
warm-up pass over all pages, the median, p95 and max of `--repeat` keep-alive requests, and
the median CPU time the server (its workers included) spent on each: on a shared machine the
wall times move with the load, the CPU column much less (Linux: clock ticks of 10 ms). A
search and a field filter are also timed asking something new on each request (`{n}` in
their URL): a finished run's found items are kept, so repeating one search times a lookup.
The warm-up's first visit of the big run's page sets the server building the run's search
index apart (`run_search`); the timed requests wait until it is ready (the time it took is
printed), so a new search or filter value is timed against the index.
Targets: list < 200 ms, detail < 300 ms, compare of two or three big runs < 1 s, trends < 300 ms,
next items page (and the API's) < 200 ms. The run page opens on its failures (worst first);
the items pages ask for `view=all`. A run of one item with a 5 MB single-line output and
5,000 trace steps times that item's page, its panel and a page of its trace (< 300 ms, and
the bytes column shows each stays under 1 MB).

`--traces` (issue 41): every finished item of the two big runs also has a 10-step trace of a
tool-using agent (`bench_storage`'s: model calls with their system prompt and tools, tool
calls, a retrieval; ~2 KB stored), and `--items` defaults to 500,000 (1M traced items in
all); the item panel, which shows the item's trace, has 150 ms. Items, evaluations and
traces are written with bulk SQL (a 1M-item build takes minutes, not an hour).
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
from bench_results import insert  # rows by executemany, as the models store them

REPO = Path(__file__).resolve().parent.parent
HTMX = {"HX-Request": "true"}
CATEGORIES = ["refund", "shipping", "login", "billing", "other"]  # a dataset field to group by


def build(project: Path, *, items: int, small: int, traces: bool, seed: int = 7) -> dict[str, str]:
    """Fill the project's embedded database; returns the ids the pages are timed on."""
    sys.path.insert(0, str(REPO))
    from cobalt.config import load_config
    from cobalt_project import bootstrap

    bootstrap.setup(load_config(project))
    from django.db import connection, transaction
    from django.utils import timezone

    from cobalt_app.models import Evaluation, ItemResult, ItemTrace, Run, RunTag
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
            fill_run(connection, run.id, count, done=done, shift=shift, rng=rng)
            if traces:
                add_traces(run.id)
        if done == count:
            run_finalise(run.id)
        return run

    started = time.perf_counter()
    big_a = make_run("qa-agent", items, tags=["baseline"], age=30)
    big_b = make_run("qa-agent", items, tags=["v2"], age=20, shift=0.05)
    big_c = make_run("qa-agent", items, tags=["v3"], age=15, shift=-0.03)
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
    traced = ItemTrace.objects.count() if traces else 0
    print(
        f"built {ItemResult.objects.count():,} item results, "
        f"{Evaluation.objects.count():,} evaluations, {traced:,} traces, "
        f"{Run.objects.count()} runs in {time.perf_counter() - started:.1f}s"
    )
    ids = {
        "a": big_a.id,
        "b": big_b.id,
        "c": big_c.id,
        "running": small_ids[-1],
        "big_item": big_item,
    }
    if traces:  # an item whose trace was copied, as most of them are
        item = ItemTrace.objects.filter(item__run=big_a).order_by("-item_id").first().item
        ids["traced_item"] = f"/runs/{big_a.id}/items/{item.number}/"
    return ids


def fill_run(connection, run_id: str, count: int, *, done: int, shift: float, rng) -> None:
    """The run's item results (the first `done` finished, 1% of them errors) and two
    evaluations of each that succeeded, by bulk SQL in chunks of 5,000."""
    from cobalt_app.models import Evaluation, ItemResult

    for start in range(0, count, 5000):
        rows = []
        for i in range(start, min(count, start + 5000)):
            finished = i < done
            failed = finished and rng.random() < 0.01
            status = "pending" if not finished else "error" if failed else "ok"
            rows.append(
                {
                    "run_id": run_id,
                    "item_index": i,
                    "run_index": 0,
                    "item_key": f"item-{i:06d}",
                    "input": {
                        "id": f"item-{i:06d}",
                        "input": f"Question number {i}?",
                        "category": CATEGORIES[i % len(CATEGORIES)],
                    },
                    "output": None if status != "ok" else f"Answer {i} " + "lorem " * 20,
                    "metadata": {"model": "gpt-4o-mini"} if status == "ok" else {},
                    "status": status,
                    "error": "RuntimeError: agent crashed" if failed else "",
                    "latency_ms": rng.uniform(50, 3000) if finished else None,
                    "tokens": rng.randint(100, 900) if status == "ok" else 0,
                    "cost": 0.0001 if status == "ok" else 0.0,
                }
            )
        insert(connection, ItemResult, rows)
        ids = dict(
            ItemResult.objects.filter(
                run_id=run_id, item_index__gte=start, item_index__lt=start + 5000
            ).values_list("item_index", "id")
        )
        scores = []
        for row in rows:
            if row["status"] != "ok":
                continue
            item_id = ids[row["item_index"]]
            relevance = min(1.0, max(0.0, rng.gauss(0.7 + shift, 0.15)))
            scores.append(
                {
                    "item_id": item_id,
                    "run_id": run_id,
                    "evaluator": "relevance",
                    "score": round(relevance, 3),
                    "reason": "fake judge: plausible answer",
                    "tokens": 120,
                    "cost": 0.00002,
                }
            )
            scores.append(
                {
                    "item_id": item_id,
                    "run_id": run_id,
                    "evaluator": "exact",
                    "score": float(rng.random() < 0.6 + shift),
                }
            )
        insert(connection, Evaluation, scores)


TRACE_VARIANTS = 100


def add_traces(run_id: str) -> None:
    """A 10-step trace of a tool-using agent (`bench_storage.trace_steps`: model calls with
    their system prompt and tools, tool calls, a retrieval) for each of the run's finished
    items: the first `TRACE_VARIANTS` stored by the engine's trace write (compressed, shared
    parts as blobs), copied to the other items in one statement (item i gets variant
    i mod TRACE_VARIANTS): the same bytes per item, without compressing a million traces."""
    from bench_storage import trace_steps
    from django.db import connection

    from cobalt_app import trace_store
    from cobalt_app.models import ItemResult

    first = ItemResult.objects.filter(run_id=run_id, status="ok", item_index__lt=TRACE_VARIANTS)
    stored = []
    for item_id, index in first.values_list("id", "item_index"):
        steps = trace_steps(index)
        stored.append((item_id, json.dumps(steps, ensure_ascii=False), steps, ""))
    trace_store.write(stored)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO cobalt_app_itemtrace (item_id, data, blobs, missing, estimated) "
            "SELECT item.id, variant.data, variant.blobs, '', variant.estimated "
            "FROM cobalt_app_itemresult item "
            "JOIN cobalt_app_itemresult source ON source.run_id = item.run_id "
            "AND source.item_index = item.item_index %% %s "
            "JOIN cobalt_app_itemtrace variant ON variant.item_id = source.id "
            "WHERE item.run_id = %s AND item.status = 'ok' AND item.item_index >= %s",
            [TRACE_VARIANTS, run_id, TRACE_VARIANTS],
        )


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
    return f"/runs/{run.id}/items/{item.number}/"


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
    found = re.search(r'class="open-item" (?:id="first-failure" )?href="([^"]+)"', page)
    return found.group(1).replace("&amp;", "&")


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


def time_compare_three(project: Path, ids: dict[str, str], repeat: int, size: str) -> tuple:
    """`page_compare.compare` of the first big run against the other two (what the compare
    page reads for `?a=…&b=…&b=…`), in this process."""
    from cobalt_app import page_compare
    from cobalt_app.models import Run

    run_a = Run.objects.get(id=ids["a"])
    others = [Run.objects.get(id=ids["b"]), Run.objects.get(id=ids["c"])]
    times = []
    for _ in range(repeat + 1):
        started = time.perf_counter()
        comparison = page_compare.compare(run_a, others)
        times.append((time.perf_counter() - started) * 1000)
    first, times = times[0], sorted(times[1:])
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    length = len(json.dumps(comparison.strip, default=str))
    return (
        f"compare() N=3, {size} each",
        first,
        statistics.median(times),
        p95,
        times[-1],
        1000,
        length,
    )


def time_compare_groups(project: Path, ids: dict[str, str], repeat: int, size: str) -> tuple:
    """`page_compare.compare` of the first two big runs grouped by `category` (the compare page
    with `?group=category`), in this process, each time with the groups' kept values dropped
    (as on a first visit: runs' groups, group positions and counts, the runs' paired tests; the
    score tables stay loaded, as after a visit of the plain compare). Says whether the runs'
    search indexes were ready (the groups then read the fields' values from them). Its CPU
    column is this process's."""
    import importlib

    from cobalt_app import page_compare, page_triage, score_tables
    from cobalt_app.models import Run, SearchIndex

    memos = [page_triage._lists, score_tables._remembered]
    for module, names in (
        ("group_counts", ["_positions", "_counts"]),
        ("page_compare_groups", ["_codes"]),
    ):
        try:
            found = importlib.import_module(f"cobalt_app.{module}")
        except ImportError:  # a tree before it
            continue
        memos += [getattr(found, name) for name in names if hasattr(found, name)]
    run_a, run_b = Run.objects.get(id=ids["a"]), Run.objects.get(id=ids["b"])
    ready = SearchIndex.objects.filter(run__in=[run_a, run_b], ready=True).count()
    times, cpu = [], []
    for _ in range(repeat + 1):
        for memo in memos:
            memo.clear()
        started, used = time.perf_counter(), time.process_time()
        comparison = page_compare.compare(run_a, [run_b], group_by="category")
        times.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - used) * 1000)
    first, times = times[0], sorted(times[1:])
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    length = len(json.dumps([row.regressed for row in comparison.groups.rows]))
    name = f"grouped compare() cold, {ready}/2 ix"
    median_cpu = statistics.median(cpu[1:])
    return (name, first, statistics.median(times), p95, times[-1], 1000, length, median_cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, help="Items per big run (50,000; 500,000 --traces).")
    parser.add_argument("--small", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--traces", action="store_true", help="A 10-step trace per item.")
    parser.add_argument("--keep", type=Path, help="Build (or reuse) the project in this folder.")
    parser.add_argument("--json", type=Path, help="Also write the table's rows to this file.")
    parser.add_argument(
        "--tree",
        type=Path,
        help="Time this checkout's code (another worktree, for an A/B on the same --keep).",
    )
    args = parser.parse_args()
    if args.tree:
        global REPO
        REPO = args.tree.resolve()
    items = args.items or (500_000 if args.traces else 50_000)

    project = prepare_project(args.keep)
    ids = project_runs(project, items=items, small=args.small, traces=args.traces)
    # The selector first, in this process, before the server competes for the cores.
    scale = f"{items // 1000}k" if items >= 1000 else str(items)
    selectors = [time_compare_runs(project, ids["a"], ids["b"], args.repeat, scale)]
    if "c" in ids:  # absent from a project `--keep` built before it
        selectors.append(time_compare_three(project, ids, args.repeat, scale))
    selectors.append(time_compare_groups(project, ids, args.repeat, scale))
    process, base = serve(project)
    try:
        cases = page_cases(ids, scale, traces=args.traces)

        def settle() -> None:
            wait_for_indexes(project, ids["a"])
            wait_for_indexes(project, ids["b"], claimed_only=True)

        rows = [*selectors, *time_pages(base, cases, ids["a"], args.repeat, process.pid, settle)]
    finally:
        process.terminate()
        process.wait(timeout=30)
        if not args.keep:
            shutil.rmtree(project, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"items": 2 * items, "traces": args.traces, "rows": rows}))
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


def project_runs(project: Path, *, items: int, small: int, traces: bool) -> dict[str, str]:
    """The ids of the benchmark's runs: built once, then read from `.bench-ids`."""
    ids_file = project / ".bench-ids"
    if ids_file.exists():
        return dict(line.split("=", 1) for line in ids_file.read_text().split())
    ids = build(project, items=items, small=small, traces=traces)
    ids_file.write_text("\n".join(f"{k}={v}" for k, v in ids.items()))
    return ids


def page_cases(
    ids: dict[str, str], scale: str, *, traces: bool = False
) -> list[tuple[str, str | None, dict, int]]:
    """(name, URL, headers, target in ms) of each page timed; the item panel's URL (None) is
    found at run time. With traces, the panel of an item with its trace has 150 ms (issue 41).
    """
    a, b, c, running = ids["a"], ids["b"], ids.get("c"), ids["running"]
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
        ("item panel (in its failures)", None, HTMX, 200),
        ("search: all items", f"/runs/{a}/?view=all&q=number+42", items_partial, 300),
        ("search: failures", f"/runs/{a}/?q=crashed", items_partial, 300),
        # `{n}`: a new text on each request, so none is one searched before (kept a while)
        (
            "search: a new text each time",
            f"/runs/{a}/?view=all&q=number+4{{n}}x",
            items_partial,
            300,
        ),
        (
            "filter: category = refund",
            f"/runs/{a}/?view=all&key=category&value=refund",
            items_partial,
            300,
        ),
        (
            "filter: a new value each time",
            f"/runs/{a}/?view=all&key=category&value=refund{{n}}",
            items_partial,
            300,
        ),
        ("group by category", f"/runs/{a}/?group=category", items_partial, 300),
        ("item panel in all items", f"/runs/{a}/items/2/?view=all", HTMX, 300),
        ("item panel in a search", f"/runs/{a}/items/43/?view=all&q=number+42", HTMX, 300),
        *([("item panel with its trace", ids["traced_item"], HTMX, 150)] if traces else []),
        ("live progress (running run)", f"/runs/{running}/", {**HTMX, "HX-Target": "live"}, 200),
        (f"compare {scale} vs {scale}", f"/compare/?a={a}&b={b}", {}, 1000),
        (
            "compare: regressed, page 5",
            f"/compare/?a={a}&b={b}&change=regressed&page=5",
            {**HTMX, "HX-Target": "pairs"},
            1000,
        ),
        (f"compare by category, {scale}", f"/compare/?a={a}&b={b}&group=category", {}, 1000),
        *(
            [
                (f"compare N=3, {scale} each", f"/compare/?a={a}&b={b}&b={c}", {}, 1000),
                (
                    "compare N=3: score down, page 2",
                    f"/compare/?a={a}&b={b}&b={c}&change=score-down&page=2",
                    {**HTMX, "HX-Target": "pairs"},
                    1000,
                ),
                (
                    "compare: an item side by side",
                    f"/compare/item/?a={a}&b={b}&key=item-000007",
                    {**HTMX, "HX-Target": "side-host"},
                    1000,
                ),
            ]
            if c
            else []
        ),
        ("API: items, page 2", f"/api/runs/{a}/items/?page=2", {}, 200),
        ("trends", "/trends/?experiment=qa-agent", {}, 300),
        ("trends, tag filter", "/trends/?experiment=qa-agent&tag=nightly", HTMX, 300),
    ]


def server_cpu(pid: int) -> float:
    """Seconds of CPU (user and system) the server and its worker processes have used so far
    (Linux `/proc`): a page's own cost, whatever else the machine is doing meanwhile."""
    parents, used = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        parents[int(entry.name)] = int(fields[1])
        used[int(entry.name)] = int(fields[11]) + int(fields[12])
    tree = {pid}
    while True:
        more = {child for child, parent in parents.items() if parent in tree} - tree
        if not more:
            break
        tree |= more
    return sum(used.get(p, 0) for p in tree) / os.sysconf("SC_CLK_TCK")


def wait_for_indexes(
    project: Path, run_id: str, deadline: float = 3600, *, claimed_only: bool = False
) -> None:
    """Wait until the run's search index, which the warm-up's first visit of its page set the
    server building apart, is ready (`run_search`; a tree without it has no such table), so
    that its build's CPU is not counted against the pages timed. Says how long it took.
    `claimed_only`: return at once when no build of it was claimed (the grouped compare's
    other run: a tree whose compare page sets the runs' indexes building claims it)."""
    import sqlite3

    started = time.monotonic()
    with sqlite3.connect(project / ".cobalt" / "history.db") as db:
        while time.monotonic() - started < deadline:
            try:
                row = db.execute(
                    "SELECT ready, started_at FROM cobalt_app_searchindex WHERE run_id = ?",
                    [run_id],
                ).fetchone()
            except sqlite3.OperationalError:  # no index in this tree
                return
            if row is None and claimed_only:
                return
            if row and row[0]:
                print(
                    f"search index of run {run_id} ready {time.monotonic() - started:.1f} s "
                    f"after the warm-up (its build claimed at {row[1]})",
                    flush=True,
                )
                return
            time.sleep(0.5)
    raise SystemExit(f"the search index of run {run_id} was not ready in {deadline:.0f} s")


def time_pages(
    base: str, cases: list, run_id: str, repeat: int, pid: int, settle=lambda: None
) -> list[tuple]:
    """Each page's row: (name, first, median, p95, max, target, bytes, median CPU of the
    server). A URL's `{n}` is the request's number (each asks something new). `settle` is
    called between the warm-up pass and the timed requests."""
    rows = []
    with httpx.Client(base_url=base, timeout=60) as client:
        item_url = first_item(client, run_id)
        # One pass over every page first: each worker process imports its views and
        # scipy (in a background thread at start) before anything is timed.
        first: dict[str, float] = {}
        for n in range(2):
            for name, url, headers, _target in cases:
                started = time.perf_counter()
                asked = (url or item_url).replace("{n}", f"w{n}")
                client.get(asked, headers=headers).raise_for_status()
                first.setdefault(name, (time.perf_counter() - started) * 1000)
        settle()
        for name, url, headers, target in cases:
            times, cpu = [], []
            for n in range(repeat):
                asked = (url or item_url).replace("{n}", str(n))
                started, used = time.perf_counter(), server_cpu(pid)
                reply = client.get(asked, headers=headers)
                times.append((time.perf_counter() - started) * 1000)
                cpu.append((server_cpu(pid) - used) * 1000)
                if reply.status_code not in (200, 286):
                    raise SystemExit(f"{asked}: HTTP {reply.status_code}")
            times.sort()
            p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
            median = statistics.median(times)
            size = len(reply.content)
            row = (name, first[name], median, p95, times[-1], target, size, statistics.median(cpu))
            rows.append(row)
    return rows


def print_table(rows: list[tuple]) -> int:
    """Print each row against its target; returns how many missed it."""
    print(
        f"\n{'page':32} {'first':>9} {'median':>8} {'p95':>8} {'max':>8} {'target':>8} "
        f"{'bytes':>9} {'CPU':>8}  ok"
    )
    failed = 0
    for name, cold, median, p95, worst, target, size, *cpu in rows:
        ok = median < target
        failed += not ok
        used = f"{cpu[0]:6.1f}ms" if cpu else f"{'—':>8}"
        print(
            f"{name:32} {cold:7.1f}ms {median:6.1f}ms {p95:6.1f}ms {worst:6.1f}ms {target:6d}ms "
            f"{size:9,} {used}  {'✓' if ok else '✗'}"
        )
    print("first = the first request after the server started (workers still warming up)")
    print("CPU = the server's CPU time per request (median; its workers included)")
    print(f"\n{len(rows) - failed}/{len(rows)} pages under target (median)")
    return failed


if __name__ == "__main__":
    main()
