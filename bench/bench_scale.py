"""Cobalt at scale, in one run and side by side (issue 41): every figure beside its target.

    python bench/bench_scale.py [--dashboard-keep DIR]   # the full report
    python bench/bench_scale.py --quick                  # smaller sizes, the same rows
    python bench/bench_scale.py --skip team,dashboard    # any of the sections left out

Runtime, measured only on a busy machine (load average 15 to 18 on 2 cores): building the
pages' project of 1M traced items took 30 min (`--dashboard-keep DIR` builds it once and
reuses it); `--quick` took 16 min with twice today's quick sizes. The rest of the full report
is the 50,000-item runs (embedded: ~0.5 ms of CPU an item, traced ~2 ms; team: ~2 ms of CPU
an item over all processes) and 200,000 no-op items for the memory rows.

Runs the other benches' own functions (or, where they set Django up in their process, the
bench itself with `--json`) and prints one table:

- embedded (`bench_engine`): the bare-SQLite floor (a bare `executemany` of the same rows),
  the floor of a traced item (the bare OpenTelemetry SDK making its 10 spans), `cobalt run`
  of `--items` no-op items (a sync runner and a sync function evaluator: what users write)
  and of the same items with a 10-span trace each, whole process and the run's
  own time, with the CPU time each took (user + system);
- peak memory: the no-op run over a JSON Lines dataset file (streamed) at `--items` and at
  `--memory-items` (4x as many; 1000000 measures 1M itself), and what a straight line
  through the two gives at 1M items (an upper bound: the growth slows as SQLite's page cache
  fills); and the results file and
  `cobalt export` of a big traced run (the dashboard's), each in a process of its own;
- team (`bench_team`, PostgreSQL on 127.0.0.1:5432 and Redis on 127.0.0.1:6379 DB
  `BENCH_REDIS_DB`, default 6, flushed): the no-op items on `cobalt worker --concurrency 40
  --processes K` for K = 1, 2, 4, real worker processes, with the CPU per item of the
  workers, `cobalt run` and PostgreSQL; PostgreSQL's floor for the same rows at
  `--team-floor` items; one round trip of each server;
- storage (`bench_storage`): bytes per item of a realistic 10-span tool-using trace and of
  its recording, before and after compression;
- pages (`bench_dashboard --traces`): list, run detail, compare, the panel of an item with
  its trace and trends over two runs of `--dashboard-items` traced items (1M in all).

Wall times on a loaded machine say little: each row also gives the CPU time it took, and the
header the machine's load average. A target that cannot be met on this machine is marked ✗
with the measurement that shows why beside it (docs/concepts/scale.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import bench_engine
import bench_results

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
ONE_MILLION = 1_000_000
MEMORY_TARGET_MB = 300
SECTIONS = ("embedded", "memory", "team", "storage", "dashboard")


@dataclass
class Row:
    """One line of the report."""

    figure: str
    measured: str
    cpu: str = ""
    target: str = ""
    ok: bool | None = None  # None: no target of its own (a floor, a context figure)


def rate(items: int, seconds: float) -> str:
    return f"{items / seconds:,.0f} items/s ({seconds:.1f} s)"


def cpu_per_item(cpu: float, items: int) -> str:
    return f"{cpu / items * 1000:.3f} ms/item"


def embedded(args: argparse.Namespace, tmp_path: Path, env: dict[str, str]) -> list[Row]:
    """The bare-SQLite floor, then the no-op and traced workloads beside it."""
    n = args.items
    floor = bench_engine.sqlite_floor(n, tmp_path, args.repeat)
    rows = [Row(f"bare SQLite floor, {n:,} items (executemany)", rate(n, floor))]
    spans = bench_engine.trace_floor(n, tmp_path)
    rows.append(
        Row(
            "bare OpenTelemetry SDK, the same 10 spans an item",
            f"{n / spans:,.0f} items per CPU second",
            cpu_per_item(spans, n),
        )
    )
    targets = {"sync": 10_000, "traced": 5_000}
    for name, label in (("sync", "no-op"), ("traced", "10-span trace")):
        best = bench_engine.quick_items(name, n, tmp_path, env, {"this": REPO}, args.repeat)
        (wall, cpu, _), run = best["this"]
        rows.append(
            Row(
                f"embedded {label}, {n:,} items: whole process",
                rate(n, wall),
                cpu_per_item(cpu, n),
                f">= {targets[name]:,} items/s",
                n / wall >= targets[name],
            )
        )
        rows.append(
            Row(
                "  the run itself (its results file's duration)",
                f"{rate(n, run)} = {run / floor:.1f}x the floor",
                "",
                "<= 1.5x the floor" if name == "sync" else "",
                run / floor <= 1.5 if name == "sync" else None,
            )
        )
    return rows


def memory(args: argparse.Namespace, tmp_path: Path, env: dict[str, str]) -> list[Row]:
    """Peak RSS of the no-op run over a JSON Lines dataset file (`file`: streamed from it; an
    inline dataset is held whole, ~270 bytes an item) at `--items` and at `--memory-items` (4x
    as many); what the straight line through them gives at 1M items: an upper bound while the
    growth slows (SQLite's page cache fills up to its limit)."""
    sizes = (args.items, args.memory_items)
    peaks = {}
    for n in sizes:
        best = bench_engine.quick_items("file", n, tmp_path, env, {"this": REPO}, 1)
        peaks[n] = best["this"].usage.rss
    (small, low), (big, high) = ((n, peaks[n]) for n in sizes)
    slope = (high - low) / (big - small)
    at_million = low + slope * (ONE_MILLION - small)
    return [
        Row(
            f"peak RSS, embedded no-op run, dataset file, {small:,} / {big:,} items",
            f"{low:.0f} / {high:.0f} MB ({slope * 1e6:+.0f} MB per 1M items)",
            "",
            "flat in items",
            None,
        ),
        Row(
            "  at 1M items, at most (the straight line through both)",
            f"{at_million:.0f} MB",
            "",
            f"< {MEMORY_TARGET_MB} MB",
            at_million < MEMORY_TARGET_MB,
        ),
    ]


def team(args: argparse.Namespace, tmp_path: Path) -> list[Row]:
    """The no-op items on 1, 2 and 4 worker processes; PostgreSQL's floor; round trips."""
    import bench_team

    options = argparse.Namespace(
        big=args.team_items, big_repeat=1, history=0, workers=list(bench_team.WORKERS), against=None
    )
    with bench_team.team_services() as (_, team_env, database_url, workers):
        migrate = [sys.executable, "-m", "cobalt_cli", "migrate"]
        (tmp_path / "team").mkdir()
        bench_team.timed(migrate, tmp_path / "team", team_env)
        found = bench_team.team_throughput(options, tmp_path, team_env, database_url, workers)
        floor = bench_team.postgres_floor(database_url, args.team_floor)
        postgres_trip, redis_trip = bench_team.round_trips(database_url)
    rows = []
    for row in found:
        n, cpu = row["items"], row["cpu"]
        kinds = ("workers", "cobalt run", "postgres", "redis")
        total = sum(cpu.get(k, 0.0) for k in kinds)
        # What the item's CPU over every process would take at the target: cores, not 2.
        parts = "workers {workers:.2f} + run {cobalt run:.2f} + PG {postgres:.2f}"
        parts += f" + Redis {{redis:.3f}} = {total:.2f} ms/item"
        parts += f" = {total * bench_team.TARGET / 1000:.1f} cores at {bench_team.TARGET:,}/s"
        four = row["label"] == "4"
        rows.append(
            Row(
                f"team, {row['label']} worker process(es), {n:,} items: whole process",
                f"{rate(n, row['process'])}; run {n / row['run']:,.0f} items/s",
                parts.format(**{k: cpu.get(k, 0.0) for k in kinds}),
                ">= 5,000 items/s" if four else "",
                n / row["process"] >= 5_000 if four else None,
            )
        )
    m = args.team_floor
    for label, seconds in floor:
        rows.append(Row(f"  PostgreSQL floor, {m:,} items: {label}", rate(m, seconds)))
    trips = f"PostgreSQL {postgres_trip:.0f} µs, Redis {redis_trip:.0f} µs"
    rows.append(Row("  one round trip (SELECT 1, PING)", trips))
    return rows


def storage(args: argparse.Namespace, tmp_path: Path) -> list[Row]:
    """Bytes per item before and after compact storage (`bench_storage`, in its process)."""
    found = run_json([BENCH / "bench_storage.py", "--items", str(args.storage_items)], tmp_path)
    n = found["items"]
    rows = []
    for kind in ("traces", "recordings"):
        before, after = found[f"before {kind}"] / n, found[kind] / n
        rows.append(
            Row(
                f"bytes per item, {kind} (10 spans / 4 exchanges), {n:,} items",
                f"{before:,.0f} B -> {after:,.0f} B = {after / before:.1%}",
                "",
                "<= 25%",
                after / before <= 0.25,
            )
        )
    return rows


def dashboard(args: argparse.Namespace, tmp_path: Path) -> list[Row]:
    """The pages over two runs of `--dashboard-items` traced items; then the results file
    and `cobalt export` of one of them, each in a process of its own, for their peak RSS."""
    keep = args.dashboard_keep or tmp_path / "dashboard"
    command = [BENCH / "bench_dashboard.py", "--traces", "--items", str(args.dashboard_items)]
    command += ["--small", "20", "--repeat", str(args.page_repeat), "--keep", str(keep)]
    found = run_json(command, tmp_path, check=False)
    n = args.dashboard_items
    scale = f"{n // 1000}k" if n >= 1000 else str(n)  # as bench_dashboard names its rows
    wanted = {
        "runs list": "runs list",
        f"run detail ({scale} items)": "run detail",
        f"compare_runs() {scale} vs {scale}": "compare_runs() (what compare pages call)",
        f"compare {scale} vs {scale}": "compare page",
        "item panel with its trace": "item panel with its trace",
        "trends": "trends",
    }
    rows = []
    for name, first, median, p95, _worst, target, *_size_and_cpu in found["rows"]:
        if name not in wanted:
            continue
        rows.append(
            Row(
                f"page at {found['items']:,} traced items: {wanted[name]}",
                f"median {median:,.0f} ms, p95 {p95:,.0f} ms (first {first:,.0f} ms)",
                "",
                f"< {target:,} ms",
                median < target,
            )
        )
    ids = dict(line.split("=", 1) for line in (keep / ".bench-ids").read_text().split())
    rows.extend(big_run_memory(keep, ids["a"], args.dashboard_items, tmp_path))
    return rows


def big_run_memory(project: Path, run_id: str, items: int, tmp_path: Path) -> list[Row]:
    """Peak RSS of writing the run's results file and of exporting it (bench_results')."""
    rows = []
    results = ["-c", bench_results.WRITE, ".", run_id]
    export = ["-m", "cobalt_cli", "export", run_id, "--format", "jsonl"]
    export += ["--output", str(tmp_path / "export.jsonl")]
    for label, argv, output in (
        ("results file (auto: gzipped JSON Lines)", results, None),
        ("cobalt export --format jsonl", export, tmp_path / "export.jsonl"),
    ):
        _, seconds, peak, size, _ = bench_results.measure(project, label, argv, output)
        rows.append(
            Row(
                f"peak RSS, {label}, a {items:,}-item traced run",
                f"{peak:.0f} MB ({seconds:.1f} s, {size / 1e6:,.0f} MB written)",
                "",
                f"< {MEMORY_TARGET_MB} MB",
                peak < MEMORY_TARGET_MB,
            )
        )
    return rows


def run_json(command: list, tmp_path: Path, *, check: bool = True) -> dict:
    """Run a bench with `--json FILE` in a process of its own (it sets Django up in its
    process); its table goes to stderr, its figures come back."""
    out = tmp_path / f"{Path(command[0]).stem}.json"
    done = subprocess.run(
        [sys.executable, *map(str, command), "--json", str(out)],
        cwd=BENCH,
        env={**clean_env(), "PYTHONPATH": str(REPO)},
        stdout=sys.stderr,
    )
    if (check and done.returncode) or not out.exists():
        raise SystemExit(f"{command[0]} failed (exit {done.returncode})")
    return json.loads(out.read_text())


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("COBALT_", "DJANGO_"))}


def print_report(args: argparse.Namespace, rows: list[Row], load: str, seconds: float) -> int:
    """The table; returns how many rows missed their target."""
    width = max(len(row.figure) for row in rows)
    measured = max(len(row.measured) for row in rows)
    print(
        f"\nCobalt at scale ({'--quick' if args.quick else 'full'}), {os.cpu_count()} cores, load"
    )
    print(f"average {load} at the start; {seconds / 60:.1f} min in all. CPU = user + system time")
    print(f"\n{'figure':<{width}}  {'measured':<{measured}}  {'CPU':<34}  {'target':<18}  ok")
    missed = 0
    for row in rows:
        mark = "" if row.ok is None else "✓" if row.ok else "✗"
        missed += row.ok is False
        print(
            f"{row.figure:<{width}}  {row.measured:<{measured}}  {row.cpu:<34}  "
            f"{row.target:<18}  {mark}"
        )
    print(f"\n{missed} figure(s) miss their target; why: docs/concepts/scale.md")
    return missed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Smaller sizes, the same rows.")
    parser.add_argument("--items", type=int, help="Embedded items (50,000; quick 5,000).")
    parser.add_argument("--memory-items", type=int, help="Second memory size (4x --items).")
    parser.add_argument("--team-items", type=int, help="Team items (50,000; quick 2,000).")
    parser.add_argument("--team-floor", type=int, help="PostgreSQL floor items (5,000; 1,000).")
    parser.add_argument("--storage-items", type=int, help="Storage items (2,000; quick 200).")
    parser.add_argument("--dashboard-items", type=int, help="Per big run (500,000; 5,000).")
    parser.add_argument("--dashboard-keep", type=Path, help="Build (or reuse) its project here.")
    parser.add_argument("--repeat", type=int, default=1, help="Embedded runs (best by CPU).")
    parser.add_argument("--page-repeat", type=int, help="Requests per page (9; quick 3).")
    parser.add_argument("--skip", default="", help=f"Sections to leave out: {','.join(SECTIONS)}.")
    args = parser.parse_args()
    quick = args.quick
    args.items = args.items or (5_000 if quick else 50_000)
    args.memory_items = args.memory_items or 4 * args.items
    args.team_items = args.team_items or (2_000 if quick else 50_000)
    args.team_floor = args.team_floor or (1_000 if quick else 5_000)
    args.storage_items = args.storage_items or (200 if quick else 2_000)
    args.dashboard_items = args.dashboard_items or (5_000 if quick else 500_000)
    args.page_repeat = args.page_repeat or (3 if quick else 9)
    skip = set(filter(None, args.skip.split(",")))
    if skip - set(SECTIONS):
        parser.error(f"--skip: one of {', '.join(SECTIONS)}")

    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    started = time.perf_counter()
    bench_engine.compile_sources()
    env = {**clean_env(), "PYTHONPATH": str(REPO)}
    steps = {
        "embedded": lambda tmp: embedded(args, tmp, env),
        "memory": lambda tmp: memory(args, tmp, env),
        "team": lambda tmp: team(args, tmp),
        "storage": lambda tmp: storage(args, tmp),
        "dashboard": lambda tmp: dashboard(args, tmp),
    }
    rows: list[Row] = []
    for name in SECTIONS:
        if name in skip:
            continue
        print(f"[{time.perf_counter() - started:5.0f} s] {name}", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix=f"cobalt-scale-{name}-") as tmp:
            rows.extend(steps[name](Path(tmp)))
    missed = print_report(args, rows, load, time.perf_counter() - started)
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
