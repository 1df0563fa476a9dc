"""Team-mode benchmarks (issue 3). Run: `python bench/bench_team.py [--items 400] [--repeat 3]`.

Needs PostgreSQL on 127.0.0.1:5432 (database `cobalt_bench_team_<pid>`, dropped at the end)
and Redis on 127.0.0.1:6379 (DB 6, or `BENCH_REDIS_DB`; flushed).

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
3. Throughput (issue 41; `--throughput` alone): `--big` items (50,000) with a sync runner and a
   sync function evaluator (what users write; `bench_engine.py`'s sync workload), experiment
   concurrency 40, on `cobalt worker --concurrency 40 --processes K` for K = 1, 2, 4 (40
   lanes shared by K processes), each run on empty tables: items/s of the whole `cobalt run
   -q` process (start, create the item rows, enqueue, wait, results file) and of the run
   itself (first claim → finalised: the summary's `totalDurationMs`), best of `--big-repeat`;
   then, on 4, a run of `--history` items with the last big run's rows kept. Per item: the
   PostgreSQL transactions committed in the bench database, the Redis commands the server
   processed (`INFO commandstats`, server-wide; per lane: per message of the run), and where
   the CPU went (sampled from /proc: worker processes, `cobalt run`, PostgreSQL backends,
   Redis, and the rest of the machine; busy: the share of all cores), and how many cores
   that CPU would take at the target's 5,000 items/s (the sum times 5,000: this machine has
   two).
   Beside them, PostgreSQL's floor for the same rows with bare psycopg (tables `LIKE`
   Cobalt's, `synchronous_commit = off` as the team database): COPY; `executemany` in
   transactions of 1,000 items (`bench_engine.py`'s SQLite floor); a worker's SQL alone, 40
   lanes claiming 8 items each and one recorder committing what they hand it: as before
   issue 41's team work (`claims.CLAIM_NEXT_SQL`, a record of a statement per row), with
   claims taking the run's next ids by primary key, and with those claims and the record as
   one statement (`claims.CLAIM_RANGE_SQL`, `bulk_sql.items_record_claimed`: what workers do
   now); all start from the statistics of a team database (older items all finished). And
   one round trip of each server (`SELECT 1`, `PING`).
   `--workers 1,4` picks the process counts; `--against DIR` runs each also with the Cobalt
   tree in DIR (a worktree of another commit), interleaved: the same minutes for both;
   `--no-floor` leaves the floor out.

Workers are stopped (their processes too) and the database dropped on failure as well.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import resource
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import redis
from bench_engine import (  # the same workloads and bare script as the engine bench
    BARE,
    EXPERIMENT,
    SYNC_NOOP,
    compile_sources,
    start_fake_provider,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cobalt_cli.commands_team import process_count  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
# Redis DB 6 unless BENCH_REDIS_DB says another (it is flushed at the start and the end).
BROKER = f"redis://127.0.0.1:6379/{os.environ.get('BENCH_REDIS_DB', '6')}"

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
    stop(worker)
    raise SystemExit("the worker did not start")


def stop(process: subprocess.Popen) -> None:
    """Warm shutdown of a worker; then kill whatever of it is left (`--processes N` children)."""
    family = descendants(process.pid)
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for pid in family:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    client = redis.Redis.from_url(BROKER)
    stale = list(client.scan_iter("cobalt:worker:*"))  # a killed process's announcement
    if stale:
        client.delete(*stale)


def processes() -> dict[int, tuple[str, int, float]]:
    """Every process: pid → (command name, parent pid, CPU seconds so far), from /proc."""
    found = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                line = stat.read()
        except OSError:
            continue
        name = line[line.index("(") + 1 : line.rindex(")")]
        fields = line[line.rindex(")") + 2 :].split()
        found[int(entry.name)] = (name, int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return found


def descendants(pid: int, table: dict[int, tuple[str, int, float]] | None = None) -> list[int]:
    table = processes() if table is None else table
    children: dict[int, list[int]] = {}
    for child, (_, parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


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


# ------------------------------------------------------------------------------ throughput

WORKERS = (1, 2, 4)
LANES = 40  # the experiment's concurrency: lanes (messages) per run
TARGET = 5_000  # items/s, four worker processes (issue 41)
CHUNK = 8  # items a lane claims at once on a big run (`team.MAX_CHUNK`)
STATS_FLUSH = 11.0  # s: an idle PostgreSQL backend reports its counters within 10 s
ASYNC_COMMIT = "-c synchronous_commit=off"  # as Cobalt's team database connections


class CpuMeter:
    """CPU seconds spent by each kind of process while it runs (sampled from /proc every
    0.2 s), and the share of the machine's cores that were busy."""

    def __init__(self, worker: int) -> None:
        self.worker = worker
        self.first: dict[int, float] = {}
        self.last: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> CpuMeter:
        self.first = {pid: cpu for pid, (_, _, cpu) in processes().items()}
        self.machine = machine_times()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        busy, total = (b - a for a, b in zip(self.machine, machine_times(), strict=True))
        self.busy = busy / total if total else 0.0  # the share of all cores
        self.busy_seconds = busy / os.sysconf("SC_CLK_TCK")

    def _sample(self) -> None:
        while True:
            table = processes()
            workers = {self.worker, *descendants(self.worker, table)}
            for pid, (name, _, cpu) in table.items():
                if pid in workers:
                    kind = "workers"
                elif name == "postgres":
                    kind = "postgres"
                elif name.startswith("redis-server"):
                    kind = "redis"
                else:
                    continue
                self.last[pid] = (kind, cpu)
            if self._stop.wait(0.2):
                return

    def seconds(self) -> dict[str, float]:
        spent: dict[str, float] = {}
        for pid, (kind, cpu) in self.last.items():
            spent[kind] = spent.get(kind, 0.0) + cpu - self.first.get(pid, 0.0)
        return spent


def machine_times() -> tuple[float, float]:
    """(busy, total) jiffies of all cores so far."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:9]]
    idle = values[3] + values[4]  # idle, iowait
    return sum(values) - idle, sum(values)


def counters(database_url: str) -> tuple[int, int]:
    """(transactions committed in the bench database, Redis commands processed)."""
    with psycopg.connect(database_url) as conn:
        (commits,) = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    stats = redis.Redis.from_url(BROKER).info("commandstats")
    return commits, sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def timed_run(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds of a whole process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    elapsed = timed(command, cwd, env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return elapsed, cpu


def team_throughput(
    args: argparse.Namespace,
    tmp_path: Path,
    env: dict[str, str],
    database_url: str,
    workers: list[subprocess.Popen],
) -> list[dict[str, Any]]:
    """The big sync workload on 1, 2 and 4 worker processes (40 lanes in all), each run on
    empty tables; then, on 4, `--history` items with the last big run's rows kept."""
    folder = project(tmp_path / "throughput", SYNC_NOOP, args.big)
    for name, count in (("warm", 400), ("history", args.history)):
        source = textwrap.dedent(SYNC_NOOP).replace("range(N)", f"range({count})")
        (folder / "experiments" / f"{name}.cobalt.py").write_text(
            source.replace("bench-sync", name)
        )
    command = [sys.executable, "-m", "cobalt_cli", "run", "-q"]
    # `--against DIR`: the same runs with another Cobalt tree, interleaved (same minutes).
    trees = {"": env}
    if args.against:
        trees = {" this": env, " against": {**env, "PYTHONPATH": str(args.against.resolve())}}
    rows = []
    for count in args.workers:
        for tree, tree_env in trees.items():
            worker, _ = start_worker(folder, tree_env, LANES, count)
            workers.append(worker)
            # Imports, connections and the first lanes of every process.
            timed([*command, "experiments/warm.cobalt.py"], folder, tree_env)
            big = [*command, "experiments/bench.cobalt.py"]
            rows.append(
                measure(worker, big, folder, tree_env, database_url, args.big, args.big_repeat)
            )
            rows[-1]["label"] = f"{count}{tree}"
            if count == args.workers[-1] and args.history:
                history = [*command, "experiments/history.cobalt.py"]
                rows.append(
                    measure(
                        worker,
                        history,
                        folder,
                        tree_env,
                        database_url,
                        args.history,
                        1,
                        empty=False,
                    )
                )
                rows[-1]["label"] = f"{count}{tree}, {args.history:,} items, {args.big:,} older"
            stop(workers.pop())
    return rows


def measure(
    worker: subprocess.Popen,
    command: list[str],
    folder: Path,
    env: dict[str, str],
    database_url: str,
    n: int,
    repeat: int,
    *,
    empty: bool = True,
) -> dict[str, Any]:
    """Best of `repeat` runs of `command` (`empty`: each on empty tables); per item, the
    transactions, Redis commands and CPU of all of them."""
    commits, commands = counters(database_url)
    row: dict[str, Any] = {"items": n, "process": 1e9, "run": 1e9}
    spent: dict[str, float] = {}
    for _ in range(repeat):
        if empty:  # earlier runs' rows stay out of the comparison (see the history row)
            with psycopg.connect(database_url, autocommit=True) as conn:
                conn.execute("TRUNCATE cobalt_app_run CASCADE")
        with CpuMeter(worker.pid) as meter:
            elapsed, run_cpu = timed_run(command, folder, env)
        duration_ms, total = latest_run(database_url)
        assert total == n, (total, n)
        row["process"] = min(row["process"], elapsed)
        row["run"] = min(row["run"], duration_ms / 1000)
        ours = {**meter.seconds(), "cobalt run": run_cpu}
        # The rest of the machine's busy time: other processes (this bench's sampling too).
        ours["others"] = max(0.0, meter.busy_seconds - sum(ours.values()))
        for kind, seconds in ours.items():
            spent[kind] = spent.get(kind, 0.0) + seconds
        spent["wall"] = spent.get("wall", 0.0) + elapsed
        spent["busy"] = spent.get("busy", 0.0) + meter.busy * elapsed
    time.sleep(STATS_FLUSH)
    after_commits, after_commands = counters(database_url)
    items = n * repeat
    row["xacts"] = (after_commits - commits) / items
    row["redis"] = (after_commands - commands) / items
    row["redis_lane"] = (after_commands - commands) / (LANES * repeat)
    row["busy"] = spent.pop("busy") / spent.pop("wall")
    row["load"] = os.getloadavg()[0]  # the machine's load average (`uptime`) at the end
    row["cpu"] = {kind: seconds / items * 1000 for kind, seconds in spent.items()}
    return row


# A finished no-op item as the team path stores it (`services.ITEM_UPDATE_SQL`, an evaluation).
FLOOR_ITEM = (
    "INSERT INTO floor_item (run_id, item_index, run_index, item_key, input, output, metadata, "
    "status, error, traceback, tokens, cost, attempts, worker) "
    "VALUES ('run', %s, 0, %s, %s, NULL, '{}', 'pending', '', '', 0, 0, 0, '')"
)
FLOOR_RECORD = (
    "UPDATE floor_item SET status = 'ok', output = %s, metadata = '{}', error = '', "
    "traceback = '', latency_ms = 0.01, tokens = 0, cost = 0, started_at = now(), "
    "finished_at = now(), lease_expires_at = NULL WHERE id = %s "
    "AND status NOT IN ('ok', 'error', 'timeout', 'cancelled')"
)
FLOOR_EVALUATION = (
    "INSERT INTO floor_evaluation (item_id, run_id, evaluator, score, reason, status, error, "
    "cached, tokens, cost, chain_of_thought, unpriced_model) "
    "VALUES (%s, 'run', 'fn', 0.6, '', 'ok', '', false, 0, 0, '', '') "
    "ON CONFLICT (item_id, evaluator) DO UPDATE SET score = excluded.score"
)
FLOOR_CLAIM = (  # `claims.CLAIM_NEXT_SQL`
    "WITH next AS (SELECT id FROM floor_item WHERE run_id = 'run' AND status = 'pending' "
    "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) UPDATE floor_item SET status = 'running', "
    "worker = %s, attempts = attempts + 1, lease_expires_at = now() + interval '60 s', "
    "started_at = now() FROM next WHERE floor_item.id = next.id AND status = 'pending' "
    "RETURNING floor_item.id, input"
)
# The same items taken by primary key: the next 8 ids of the run's list (a shared cursor, as
# Redis' INCRBY would be for many workers), "still pending" a plain condition (`|| ''`) that
# no status index can serve. By `run_id` and `status`, the planner (whose statistics say
# pending items are rare: every older item is finished) reads the run's pending items
# through a status index and sorts them, every one of them at every claim.
FLOOR_CLAIM_BY_ID = (
    "UPDATE floor_item SET status = 'running', worker = %s, attempts = attempts + 1, "
    "lease_expires_at = now() + interval '60 s', started_at = now() "
    "WHERE id = ANY(%s) AND status || '' = 'pending' RETURNING id, input"
)


def postgres_floor(database_url: str, n: int) -> list[tuple[str, float]]:
    """Seconds to store `n` finished items with bare psycopg, four ways."""
    found = []
    with psycopg.connect(database_url, autocommit=True, options=ASYNC_COMMIT) as conn:
        fresh_floor(conn, 0)
        started = time.perf_counter()
        with conn.transaction(), conn.cursor() as cursor:
            item_columns = "run_id, item_index, run_index, item_key, input, output, metadata, "
            item_columns += "status, error, traceback, tokens, cost, attempts, worker"
            with cursor.copy(f"COPY floor_item ({item_columns}) FROM STDIN") as copy:
                for i in range(n):
                    item = f'{{"id": {i}, "input": "q{i}"}}'
                    copy.write_row(
                        ("run", i, 0, str(i), item, f'"q{i}"', "{}", "ok", "", "", 0, 0, 1, "w")
                    )
            ids = [row[0] for row in cursor.execute("SELECT id FROM floor_item ORDER BY id")]
            evaluation_columns = "item_id, run_id, evaluator, score, reason, status, error, "
            evaluation_columns += "cached, tokens, cost, chain_of_thought, unpriced_model"
            with cursor.copy(f"COPY floor_evaluation ({evaluation_columns}) FROM STDIN") as copy:
                for item_id in ids:
                    copy.write_row((item_id, "run", "fn", 0.6, "", "ok", "", False, 0, 0, "", ""))
        found.append(("COPY of finished rows, one transaction", time.perf_counter() - started))

        fresh_floor(conn, 0)
        started = time.perf_counter()
        with conn.transaction(), conn.cursor() as cursor:
            cursor.executemany(
                FLOOR_ITEM, [(i, str(i), f'{{"id": {i}, "input": "q{i}"}}') for i in range(n)]
            )
        ids = [row[0] for row in conn.execute("SELECT id FROM floor_item ORDER BY id")]
        for first in range(0, n, 1000):
            record_floor(conn, [(item_id, f"q{item_id}") for item_id in ids[first : first + 1000]])
        found.append(("executemany, 1,000 items per transaction", time.perf_counter() - started))

        variants = (
            ("as today (main before issue 41's team work)", False, False),
            ("by primary key (the run's id list)", True, False),
            ("by primary key, record in one statement (as now)", True, True),
        )
        for label, by_id, one_statement in variants:
            fresh_floor(conn, n)
            # Statistics as a team database has them when a run starts: its older items finished.
            conn.execute("UPDATE floor_item SET status = 'ok'")
            conn.execute("ANALYZE floor_item")
            conn.execute("UPDATE floor_item SET status = 'pending'")
            conn.execute("VACUUM floor_item")
            started = time.perf_counter()
            floor_lanes(database_url, by_id, one_statement)
            found.append(
                (f"{LANES} lanes + a recorder, claim {label}", time.perf_counter() - started)
            )
            (done,) = conn.execute("SELECT finished_items FROM floor_run").fetchone()
            assert done == n, (done, n)
        conn.execute("DROP TABLE floor_item, floor_evaluation, floor_run")
    return found


def fresh_floor(conn: psycopg.Connection, pending: int) -> None:
    """Empty scratch tables shaped as Cobalt's, with `pending` items waiting for a claim."""
    conn.execute(
        "DROP TABLE IF EXISTS floor_item, floor_evaluation, floor_run;"
        "CREATE TABLE floor_item (LIKE cobalt_app_itemresult INCLUDING ALL);"
        "CREATE TABLE floor_evaluation (LIKE cobalt_app_evaluation INCLUDING ALL);"
        "CREATE TABLE floor_run (id text PRIMARY KEY, finished_items int);"
        "INSERT INTO floor_run VALUES ('run', 0)"
    )
    if pending:
        with conn.transaction(), conn.cursor() as cursor:
            rows = [(i, str(i), f'{{"id": {i}, "input": "q{i}"}}') for i in range(pending)]
            cursor.executemany(FLOOR_ITEM, rows)


def record_floor(conn: psycopg.Connection, items: list[tuple[int, str]]) -> None:
    """Record finished items as `claims.items_record` does: lock the run, update the items,
    insert their evaluations, count them on the run; one transaction."""
    with conn.transaction(), conn.cursor() as cursor:
        cursor.execute("SELECT 1 FROM floor_run WHERE id = 'run' FOR UPDATE")
        cursor.executemany(FLOOR_RECORD, [(f'"{value}"', item_id) for item_id, value in items])
        cursor.executemany(FLOOR_EVALUATION, [(item_id,) for item_id, _ in items])
        cursor.execute("UPDATE floor_run SET finished_items = finished_items + %s", [len(items)])


# `bulk_sql.items_record_claimed` on the floor's tables: the batch as arrays, the claims
# checked, the evaluations and the run's counter, one autocommitted statement.
FLOOR_RECORD_ONE = (
    "WITH run AS (SELECT id FROM floor_run WHERE id = 'run' FOR UPDATE), "
    "stored AS (UPDATE floor_item AS i SET status = 'ok', output = v.output::jsonb, "
    "metadata = '{}', error = '', traceback = '', latency_ms = 0.01, tokens = 0, cost = 0, "
    "started_at = now(), finished_at = now(), lease_expires_at = NULL "
    "FROM run, unnest(%s::int8[], %s::text[]) AS v(id, output) "
    "WHERE i.id = ANY(%s::int8[]) AND i.id = v.id "
    "AND i.status NOT IN ('ok', 'error', 'timeout', 'cancelled') RETURNING i.id), "
    "scored AS (INSERT INTO floor_evaluation (item_id, run_id, evaluator, score, reason, status, "
    "error, cached, tokens, cost, chain_of_thought, unpriced_model) "
    "SELECT id, 'run', 'fn', 0.6, '', 'ok', '', false, 0, 0, '', '' FROM stored "
    "ON CONFLICT (item_id, evaluator) DO UPDATE SET score = excluded.score) "
    "UPDATE floor_run SET finished_items = finished_items + (SELECT count(*) FROM stored) "
    "WHERE id IN (SELECT id FROM run)"
)


def floor_lanes(database_url: str, by_id: bool, one_statement: bool = False) -> None:
    """A worker's SQL alone: `LANES` threads each claim 8 pending items and wait until their
    records are committed (`records_before_claims`); one recorder thread commits what the
    lanes handed it meanwhile as one transaction (`runs.recorder`). `by_id`: the claims take
    the next ids of the run's list by primary key."""
    inbox: queue.Queue = queue.Queue()
    with psycopg.connect(database_url) as conn:
        ids = [row[0] for row in conn.execute("SELECT id FROM floor_item ORDER BY id")]
    cursor = iter(range(0, len(ids), CHUNK))
    taking = threading.Lock()

    def claim(conn: psycopg.Connection, number: int) -> list[tuple[int, Any]]:
        if not by_id:
            return conn.execute(FLOOR_CLAIM, [CHUNK, f"lane-{number}"]).fetchall()
        with taking:
            start = next(cursor, None)
        if start is None:
            return []
        return conn.execute(
            FLOOR_CLAIM_BY_ID, [f"lane-{number}", ids[start : start + CHUNK]]
        ).fetchall()

    def lane(number: int) -> None:
        with psycopg.connect(database_url, autocommit=True, options=ASYNC_COMMIT) as conn:
            while claimed := claim(conn, number):
                done = threading.Event()
                inbox.put(([(item_id, item["input"]) for item_id, item in claimed], done))
                done.wait()

    def recorder() -> None:
        with psycopg.connect(database_url, autocommit=True, options=ASYNC_COMMIT) as conn:
            while (first := inbox.get()) is not None:
                batch = [first]
                with contextlib.suppress(queue.Empty):
                    while True:
                        batch.append(inbox.get_nowait())
                stop = None in batch
                batch = [entry for entry in batch if entry is not None]
                items = [item for items, _ in batch for item in items]
                if one_statement:
                    ids = [item_id for item_id, _ in items]
                    outputs = [f'"{value}"' for _, value in items]
                    conn.execute(FLOOR_RECORD_ONE, [ids, outputs, ids])
                else:
                    record_floor(conn, items)
                for _, done in batch:
                    done.set()
                if stop:
                    return

    committing = threading.Thread(target=recorder)
    committing.start()
    try:
        with ThreadPoolExecutor(LANES) as pool:
            list(pool.map(lane, range(LANES)))
    finally:
        inbox.put(None)
        committing.join()


def round_trips(database_url: str, count: int = 2000) -> tuple[float, float]:
    """Microseconds of one round trip: PostgreSQL `SELECT 1`, Redis `PING`."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        started = time.perf_counter()
        for _ in range(count):
            conn.execute("SELECT 1")
        postgres = (time.perf_counter() - started) / count * 1e6
    client = redis.Redis.from_url(BROKER)
    started = time.perf_counter()
    for _ in range(count):
        client.ping()
    return postgres, (time.perf_counter() - started) / count * 1e6


def print_throughput(
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    floor: list[tuple[str, float]],
    trips: tuple[float, float],
) -> None:
    print(
        f"Team throughput: {args.big:,} items, sync runner + sync function evaluator, concurrency"
        f" {LANES}; `cobalt worker --concurrency {LANES} --processes K`, best of {args.big_repeat}"
    )
    width = max(len(row["label"]) for row in rows)
    print(
        f"  {'K':<{width}}  {'whole process':>19}  {'run (1st claim → end)':>21}"
        f"  {'PG xact':>8}  {'Redis cmd':>9}  {'Redis cmd':>9}"
    )
    print(f"  {'':<{width}}  {'':>19}  {'':>21}  {'per item':>8}  {'per item':>9}  {'per lane':>9}")
    for row in rows:
        n = row["items"]
        print(
            f"  {row['label']:<{width}}  {row['process']:6.2f} s {n / row['process']:6,.0f}/s"
            f"  {row['run']:8.2f} s {n / row['run']:6,.0f}/s  {row['xacts']:8.3f}"
            f"  {row['redis']:9.3f}  {row['redis_lane']:9.0f}"
        )
    print(f"  target, 4 worker processes: >= {TARGET:,} items/s")
    kinds = ("workers", "cobalt run", "postgres", "redis", "others")
    print("  CPU ms per item (2 cores: 5,000 items/s leaves 0.4 ms per item for everything);")
    print(f"  cores at {TARGET:,}/s: the sum (without others) times {TARGET:,} items/s")
    print(
        f"  {'K':<{width}}  {' '.join(f'{k:>10}' for k in kinds)}  {'sum':>6}"
        f"  {'cores':>5}  machine busy  load"
    )
    for row in rows:
        cpu = [row["cpu"].get(k, 0.0) for k in kinds]
        cores = sum(cpu[:4]) * TARGET / 1000
        print(
            f"  {row['label']:<{width}}  {' '.join(f'{v:10.3f}' for v in cpu)}"
            f"  {sum(cpu[:4]):6.3f}  {cores:5.1f}  {row['busy']:12.0%}  {row['load']:4.1f}"
        )
    if not floor:
        return
    n = args.big
    print(f"PostgreSQL floor: {n:,} items, finished (item row + evaluation), bare psycopg")
    for label, seconds in floor:
        print(f"  {label:<60}: {seconds:6.2f} s = {n / seconds:7,.0f} items/s")
    print(f"  one round trip: PostgreSQL SELECT 1 {trips[0]:.0f} µs, Redis PING {trips[1]:.0f} µs")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--noop", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--big", type=int, default=50_000, help="Items of the throughput runs.")
    parser.add_argument("--big-repeat", type=int, default=2, help="Throughput runs per K.")
    parser.add_argument(
        "--history", type=int, default=10_000, help="Items of the run after a big one (0: none)."
    )
    parser.add_argument("--throughput", action="store_true", help="Only the throughput (3).")
    parser.add_argument(
        "--workers",
        type=lambda text: [int(k) for k in text.split(",")],
        default=list(WORKERS),
        help="Worker process counts of the throughput runs (default 1,2,4).",
    )
    parser.add_argument(
        "--against", type=Path, help="Another Cobalt tree: its throughput runs interleaved."
    )
    parser.add_argument("--no-floor", action="store_true", help="Skip PostgreSQL's floor.")
    args = parser.parse_args()
    compile_sources()
    # A `kill` of the bench stops its workers and drops its database too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    with (
        team_services() as (base, team_env, database_url, workers),
        tempfile.TemporaryDirectory() as tmp,
    ):
        tmp_path = Path(tmp)
        llm = project(tmp_path / "llm", EXPERIMENT, args.items)
        timed([sys.executable, "-m", "cobalt_cli", "migrate"], llm, team_env)
        if not args.throughput:
            latency_and_dispatch(args, tmp_path, llm, base, team_env, database_url, workers)
        rows = team_throughput(args, tmp_path, team_env, database_url, workers)
        floor = [] if args.no_floor else postgres_floor(database_url, args.big)
        print_throughput(args, rows, floor, round_trips(database_url))


@contextlib.contextmanager
def team_services() -> Iterator[tuple[dict, dict, str, list[subprocess.Popen]]]:
    """A database of its own on PostgreSQL, the Redis DB flushed, the fake provider at 100 ms:
    (the environment without team settings, with them, the database URL, the workers started
    meanwhile). Workers are stopped, the database dropped and Redis flushed at the end."""
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
        yield base, team_env, database_url, workers
    finally:
        for worker in workers:
            stop(worker)
        fake.terminate()
        fake.wait(timeout=10)
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        redis.Redis.from_url(BROKER).flushdb()


def latency_and_dispatch(
    args: argparse.Namespace,
    tmp_path: Path,
    llm: Path,
    base: dict[str, str],
    team_env: dict[str, str],
    database_url: str,
    workers: list[subprocess.Popen],
) -> None:
    """Sections 1 and 2."""
    bare = tmp_path / "bare.py"
    bare.write_text(BARE.replace("range(N)", f"range({args.items})"))
    run = [sys.executable, "-m", "cobalt_cli", "run", "--no-cache", "-q"]
    bare_times = [timed([sys.executable, str(bare)], tmp_path, base) for _ in range(args.repeat)]
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


if __name__ == "__main__":
    main()
