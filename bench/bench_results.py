"""Big results (issue 41): the results file and `cobalt export` of a big run, memory and time.

    python bench/bench_results.py [--items 1000000] [--trace-steps 2] [--keep DIR]

Builds a project whose embedded SQLite database holds one finished run of `--items` items
(two evaluators, 1% errors, a `--trace-steps`-step trace per item), written with bulk inserts
(plain `executemany`, values prepared by the models' own fields) and the real finalisation
(`run_finalise`: summary and score table), in a subprocess. Then, each in a subprocess of its
own, measures the wall time and peak RSS (`os.wait4`'s `ru_maxrss`) of:

- writing the results file as `cobalt run` does at the end (`lifecycle.write_results`), once
  as one JSON document (`[results] format = "json"`, `compress = false`) and once as
  configured by default (`auto`: above `large_run` items, gzip-compressed JSON Lines), then
  read back item by item with `cobalt.read_results`;
- `cobalt export RUN --format csv|json|jsonl --output FILE`.

The first line is Python with Django set up and nothing done, the floor of every other line.
Target: every peak < 300 MB at 1,000,000 items. `--keep DIR` builds the project there once and
reuses it afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_MB = 300
CHUNK = 10_000
QUESTION = "What is the refund policy for an order of item {i} shipped to a second address?"
ANSWER = "Orders of item {i} can be refunded within 30 days; the second address changes nothing. "

SETUP = """
import sys
from cobalt.config import load_config
from cobalt_project import bootstrap
config = bootstrap.setup(load_config(sys.argv[1]))
"""
WRITE = (
    SETUP
    + """
from cobalt_app.runs import lifecycle
run = lifecycle.write_results(sys.argv[2], config)
print(run.results_path)
"""
)
READ = """
import sys
from cobalt import read_results
header, items = read_results(sys.argv[1])
print(sum(1 for _ in items), "items", file=sys.stderr)
"""


def build(project: Path, *, items: int, trace_steps: int, seed: int = 7) -> str:
    """One finished run of `items` items in the project's database; returns its id."""
    sys.path.insert(0, str(REPO))
    from cobalt.config import load_config
    from cobalt_project import bootstrap

    bootstrap.setup(load_config(project))
    from django.db import connection, transaction
    from django.utils import timezone

    from cobalt_app import trace_store
    from cobalt_app.models import Evaluation, ItemResult, Run
    from cobalt_app.results import run_finalise

    rng = random.Random(seed)
    evaluators = [{"name": "relevance", "type": "llm-judge"}, {"name": "exact", "type": "exact"}]
    created = timezone.now() - timedelta(hours=1)
    run = Run.objects.create(
        name="support-agent",
        file="experiments/support.cobalt.py",
        status=Run.Status.RUNNING,
        config={"runs": 1, "concurrency": 16, "timeout": 30, "evaluators": evaluators},
        created_at=created,
        started_at=created,
        finished_at=created + timedelta(seconds=items / 2000),
        total_items=items,
        finished_items=items,
    )
    started = time.perf_counter()
    for start in range(0, items, CHUNK):
        indexes = range(start, min(items, start + CHUNK))
        failed = {i for i in indexes if rng.random() < 0.01}
        rows = [
            {
                "run_id": run.id,
                "item_index": i,
                "item_key": f"item-{i:07d}",
                "input": {"id": f"item-{i:07d}", "input": QUESTION.format(i=i)},
                "output": None if i in failed else ANSWER.format(i=i) * 2,
                "metadata": {} if i in failed else {"model": "gpt-4o-mini"},
                "status": "error" if i in failed else "ok",
                "error": "RuntimeError: agent crashed" if i in failed else "",
                "latency_ms": rng.uniform(50, 3000),
                "tokens": 0 if i in failed else rng.randint(100, 900),
                "cost": 0.0 if i in failed else 0.0001,
            }
            for i in indexes
        ]
        with transaction.atomic():
            insert(connection, ItemResult, rows)
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT item_index, id FROM {ItemResult._meta.db_table} "
                    "WHERE run_id = %s AND item_index >= %s AND item_index < %s",
                    [run.id, indexes.start, indexes.stop],
                )
                ids = dict(cursor.fetchall())
            evaluations, traces = [], []
            for row in rows:
                item_id = ids[row["item_index"]]
                if row["status"] != "ok":
                    continue
                relevance = round(min(1.0, max(0.0, rng.gauss(0.75, 0.15))), 3)
                evaluations.append(
                    {
                        "item_id": item_id,
                        "run_id": run.id,
                        "evaluator": "relevance",
                        "score": relevance,
                        "reason": "The answer states the policy and the exception asked about.",
                        "tokens": 120,
                        "cost": 0.00002,
                    }
                )
                score = float(rng.random() < 0.6)
                evaluations.append(
                    {"item_id": item_id, "run_id": run.id, "evaluator": "exact", "score": score}
                )
                if trace_steps:
                    steps = trace(row, trace_steps)
                    traces.append((item_id, json.dumps(steps), steps, ""))
            insert(connection, Evaluation, evaluations)
            trace_store.write(traces)
        if start and start % 100_000 == 0:
            print(f"  {start:,} items ({time.perf_counter() - started:.0f}s)", file=sys.stderr)
    run_finalise(run.id)
    print(
        f"built a run of {items:,} items in {time.perf_counter() - started:.0f}s", file=sys.stderr
    )
    return run.id


def trace(row: dict, steps: int) -> list[dict]:
    """A tool-using agent's steps: a model call, then tool calls."""
    found = []
    for step in range(steps):
        llm = step == 0
        found.append(
            {
                "name": "chat gpt-4o-mini" if llm else "lookup_policy",
                "kind": "llm" if llm else "tool",
                "parent": None,
                "startMs": 10.0 * step,
                "durationMs": 8.5,
                "model": "gpt-4o-mini" if llm else None,
                "inputTokens": 320 if llm else None,
                "outputTokens": 48 if llm else None,
                "cost": 0.00008 if llm else None,
                "status": "ok",
                "error": None,
                "input": row["input"]["input"] if llm else '{"topic": "refunds"}',
                "output": "call lookup_policy" if llm else "Refunds within 30 days.",
            }
        )
    return found


def insert(connection, model, rows: list[dict]) -> None:
    """Rows of `model` (field attnames → values; the fields' defaults for the others), in one
    `executemany`: what `bulk_create` stores, without building a model instance per row."""
    if not rows:
        return
    fields = [f for f in model._meta.concrete_fields if not (f.primary_key and f.auto_created)]
    defaults = {f.attname: f.get_db_prep_save(f.get_default(), connection) for f in fields}
    values = [
        [
            f.get_db_prep_save(row[f.attname], connection)
            if f.attname in row
            else defaults[f.attname]
            for f in fields
        ]
        for row in rows
    ]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    slots = ", ".join(["%s"] * len(fields))
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {model._meta.db_table} ({columns}) VALUES ({slots})", values
        )


def measure(project: Path, name: str, argv: list[str], output: Path | None) -> tuple:
    """(name, seconds, peak RSS in MB, bytes written) of one subprocess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COBALT_", "DJANGO_"))}
    env["PYTHONPATH"] = str(REPO)
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, *argv], cwd=project, env=env, stdout=subprocess.PIPE, text=True
    )
    printed = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise SystemExit(f"{name}: exit {process.returncode}")
    if output is None and printed.strip():
        output = Path(printed.strip().splitlines()[-1])
    size = output.stat().st_size if output is not None and output.exists() else 0
    return name, elapsed, usage.ru_maxrss / 1024, size, output


def configure(project: Path, results_table: str) -> None:
    (project / "cobalt.toml").write_text(
        f'test_dir = "experiments"\n\n[results]\n{results_table}\n'
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--trace-steps", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="Build (or reuse) the project in this folder.")
    parser.add_argument("--build", type=Path, help=argparse.SUPPRESS)  # the builder subprocess
    args = parser.parse_args()
    if args.build:
        print(build(args.build, items=args.items, trace_steps=args.trace_steps))
        return

    if args.keep:
        project = args.keep.resolve()
        project.mkdir(parents=True, exist_ok=True)
    else:
        project = Path(tempfile.mkdtemp(prefix="cobalt-bench-results-"))
    configure(project, "")
    id_file = project / ".bench-run"
    if not id_file.exists():
        # In a process of its own: a child's peak RSS starts from its parent's (the memory
        # of a fork), so this one must stay small.
        command = [sys.executable, __file__, "--build", str(project), "--items", str(args.items)]
        command += ["--trace-steps", str(args.trace_steps)]
        built = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
        id_file.write_text(built.stdout.split()[-1])
    run_id = id_file.read_text().strip()
    for database in (project / ".cobalt").glob("*.db"):
        print(f"database {database.name}: {database.stat().st_size / 1e6:,.0f} MB")

    exports = project / "exports"
    exports.mkdir(exist_ok=True)
    cli = ["-m", "cobalt_cli", "export", run_id]
    rows = [measure(project, "python + Django, nothing done", ["-c", SETUP, "."], None)]
    try:
        for label, table in (("json", 'format = "json"\ncompress = false'), ("auto", "")):
            configure(project, table)
            rows.append(
                measure(project, f"results file, {label}", ["-c", WRITE, ".", run_id], None)
            )
        # JSON Lines read back item by item (a 1M-item JSON document, read whole, takes ~6 GB).
        written = str(rows[-1][-1])
        rows.append(measure(project, "  read back (read_results)", ["-c", READ, written], None))
        configure(project, "")
        for fmt in ("csv", "json", "jsonl"):
            target = exports / f"run.{fmt}"
            argv = [*cli, "--format", fmt, "--output", str(target)]
            rows.append(measure(project, f"cobalt export --format {fmt}", argv, target))
    finally:
        if not args.keep:
            shutil.rmtree(project, ignore_errors=True)

    print(f"\n{args.items:,} items, {args.trace_steps} trace steps each")
    print(f"{'':36} {'time':>8} {'peak RSS':>10} {'written':>10}  file")
    failed = 0
    for name, seconds, peak, size, path in rows:
        ok = peak < TARGET_MB
        failed += not ok
        written = f"{size / 1e6:,.0f} MB" if size else ""
        shown = path.name if path else ""
        print(
            f"{name:36} {seconds:7.1f}s {peak:7.0f} MB {written:>10}  {shown} {'✓' if ok else '✗'}"
        )
    print(f"target: peak RSS < {TARGET_MB} MB")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
