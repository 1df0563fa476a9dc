"""Shared fixtures: a fake LLM provider, throwaway Cobalt projects, the real `cobalt` command.

The in-process Django test database is a SQLite *file* (see `pytest_configure`) so the
engine's database thread and the test see the same data; engine tests use `transactional_db`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import hypothesis
import pytest

from tests import cli_zygote
from tests.fake_provider import FakeProvider

if TYPE_CHECKING:  # imported where used: tests.team_harness imports this module
    from tests.team_harness import Services, Team

REPO = Path(__file__).resolve().parent.parent
# Property tests check what comes out, not how fast: a loaded CI machine (more xdist workers
# than cores) makes an example take seconds now and then.
hypothesis.settings.register_profile("cobalt", deadline=None)
hypothesis.settings.load_profile("cobalt")
# Under pytest-xdist (`-n 2`) every worker process ("gw0", "gw1", …) loads this file with the
# environment the controller left: each makes its own session folder (so its own SQLite files,
# the Django test database among them), takes its own Redis DB (the first one plus its number)
# and names its PostgreSQL databases after its pid, so workers never share any of them.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_WORKER_NUMBER = int(XDIST_WORKER[2:]) if XDIST_WORKER.startswith("gw") else 0
_SESSION_DIR = Path(tempfile.mkdtemp(prefix=f"cobalt-tests-{XDIST_WORKER or 'main'}-"))
# The project folder chosen here, unless the environment gave one (then every worker uses it).
_OURS = "PYTEST_COBALT_PROJECT_DIR"
if os.environ.get("COBALT_PROJECT_DIR") == os.environ.get(_OURS):
    os.environ["COBALT_PROJECT_DIR"] = os.environ[_OURS] = str(_SESSION_DIR / "project")
(_SESSION_DIR / "project").mkdir(exist_ok=True)
# The Redis DB of the team-mode tests (tests/team_harness.py): 5, or the one
# COBALT_TEST_REDIS_DB names (a suite running beside another sets its own); an xdist worker
# adds its number. COBALT_TEST_REDIS_DB stays set for the workers; the app never reads it.
TEST_REDIS_DB = int(os.environ.get("COBALT_TEST_REDIS_DB", "5")) + _WORKER_NUMBER
if TEST_REDIS_DB > 15:
    raise RuntimeError(
        f"Redis DB {TEST_REDIS_DB} for worker {XDIST_WORKER}: lower COBALT_TEST_REDIS_DB"
    )
for _name in list(os.environ):
    if _name.startswith("COBALT_") and _name not in ("COBALT_PROJECT_DIR", "COBALT_TEST_REDIS_DB"):
        del os.environ[_name]
os.environ["COBALT_SQLITE_PATH"] = str(_SESSION_DIR / "history.db")
# Started in the background of a script (`pytest … &` without job control), the suite ignores
# SIGINT, and so would every `cobalt` it starts (an ignored signal survives exec): the tests
# that interrupt a run like Ctrl-C would see it run to the end.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config: pytest.Config) -> None:
    from django.conf import settings

    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("sqlite3"):
        database.setdefault("TEST", {})["NAME"] = str(_SESSION_DIR / "test.db")


# The suite runs in parallel with `scripts/test` (`-n auto --dist loadfile
# --no-loadscope-reorder`): each module runs whole on one worker (its module fixtures, e.g. the
# team services or a browser, start once), and xdist hands a worker the next module when it
# runs out. The longest modules go first, longest first, so that the workers finish together
# rather than one of them starting a long module near the end; a module much longer than the
# rest is split (test_team and test_team_failures, test_team_concurrency and
# test_team_concurrency_loaded). Seconds: the clean-clone CI run of 2026-11 (3 workers on the
# 2-core machine), setup and teardown included, before the splits.
LONG_MODULES = (
    "test_trace_crewai.py",  # 259 s building its CrewAI virtualenv (70 s); 65 s once cached
    "test_big_items.py",  # 82 s building its two 5,000-step runs, then ~20 s
    "test_install.py",  # 79 s: a fresh virtualenv, pip install ., cobalt init/run/serve
    "test_team.py",  # test_team and test_team_failures: 198 s together
    "test_team_failures.py",
    "test_api_schema.py",  # 40-62 s
    "test_browser.py",  # 61 s
    "test_nothing_lost.py",  # 59 s
    "test_replay.py",  # 58 s
    "test_team_concurrency.py",  # 41 s + 37 s together
    "test_team_concurrency_loaded.py",
    "test_cli.py",  # 40 s
    "test_fail_fast.py",  # 40 s
    "test_contract.py",  # 38 s
    "test_significance.py",  # 35 s
    "test_mcp.py",  # 34 s
    "test_retention.py",  # 27 s
    "test_review_browser.py",  # 24 s
    "test_pytest_plugin.py",  # 24 s
    "test_ci.py",  # 22 s
    "test_mcp_lifecycle.py",  # 21 s
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if XDIST_WORKER:  # every worker collects the same list; the order only matters there
        rank = {name: number for number, name in enumerate(LONG_MODULES)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: a worker per core and one more, but no more than there are Redis DBs for
    them. A worker spends part of its time waiting for the processes it started (`cobalt`
    commands, team workers, a browser, the fake provider's latency): on 2 cores, two workers
    kept ~1.5 of them busy and three finished ~12% sooner."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min((cores or 1) + 1, 16 - TEST_REDIS_DB))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Before xdist starts its workers: GNU readline, once loaded, puts COLUMNS and LINES of
    the terminal (80×24 without one) in the process environment, where `os.environ` does not
    see them but a child process does. A worker would pass them on to every `cobalt` it
    starts, whose output would then wrap at 80 columns; leave them out as the user did."""
    for name in ("COLUMNS", "LINES"):
        if name not in os.environ:
            os.unsetenv(name)
    if not XDIST_WORKER:
        compile_cobalt()


def compile_cobalt() -> None:
    """Byte-compile Cobalt's own modules (where they changed) before any test starts a
    `cobalt`. An editable install leaves them uncompiled, and where PYTHONDONTWRITEBYTECODE is
    set (this machine and its CI set it) every `cobalt` command, worker and server the suite
    starts would compile the ~250 of them anew: 0.35 s of CPU a process, a cost an installed
    Cobalt never pays. The library dependencies came compiled (scripts/test: uv
    --compile-bytecode)."""
    import compileall

    for name in ("cobalt", "cobalt_app", "cobalt_cli", "cobalt_project"):
        compileall.compile_dir(REPO / name, quiet=1)


@pytest.fixture(scope="session")
def fake_provider_server() -> Iterator[FakeProvider]:
    with FakeProvider() as server:
        yield server


@pytest.fixture
def fake_provider(fake_provider_server: FakeProvider, monkeypatch) -> FakeProvider:
    """The fake provider, reset, with OPENAI_*/ANTHROPIC_* variables pointing at it."""
    fake_provider_server.reset()
    fake_provider_server.latency = 0.0
    monkeypatch.setenv("OPENAI_BASE_URL", fake_provider_server.openai_base_url)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_provider_server.anthropic_base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-openai-SECRET-0001")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-SECRET-0002")
    return fake_provider_server


@dataclass
class Project:
    """A throwaway Cobalt project folder."""

    path: Path

    def write(self, relative: str, content: str) -> Path:
        target = self.path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(content).lstrip(), encoding="utf-8")
        return target

    def write_jsonl(self, relative: str, items: list[dict]) -> Path:
        import json

        return self.write(relative, "".join(json.dumps(i) + "\n" for i in items))

    def results_files(self) -> list[Path]:
        from cobalt.results_file import results_files

        return results_files(self.path / ".cobalt" / "results")

    @property
    def db_path(self) -> Path:
        return self.path / ".cobalt" / "history.db"


@pytest.fixture
def project(tmp_path: Path) -> Project:
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "cobalt.toml").write_text('test_dir = "experiments"\n')
    return Project(folder)


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("COBALT_", "OPENAI_", "ANTHROPIC_", "PYTEST_", "DJANGO_"))
    }
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on (free when asked)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(project: Project, *args: str) -> tuple[subprocess.Popen, str]:
    """`cobalt serve --port 0` in the project folder; returns it and the URL it printed."""
    server = subprocess.Popen(
        [sys.executable, "-m", "cobalt_cli", "serve", "--port", "0", *args],
        cwd=project.path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in server.stdout:  # the first line says where it listens
        match = re.search(r"Cobalt dashboard: (http://\S+?)/ ", line)
        if match:
            return server, match.group(1)
    server.wait(timeout=10)
    raise AssertionError(f"cobalt serve exited with {server.returncode}")


def cobalt_run(project: Project, *args: str, env: dict[str, str], timeout: float = 120) -> str:
    """`cobalt run *args` in the project (the zygote's fork), which must succeed; its run id."""
    done = cli_zygote.run(["run", *args], project.path, cli_env(env), timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return re.search(r"Run ID: (\w+)", done.stdout).group(1)


@contextlib.contextmanager
def served(project: Project, *args: str) -> Iterator[str]:
    """`cobalt serve` (`start_server`) for the block: its URL; stopped when the block ends."""
    server, url = start_server(project, *args)
    try:
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def new_project(tmp_path_factory, name: str, files: dict[str, str]) -> Project:
    """A project folder of its own (cobalt.toml: experiments/) with these files written."""
    project = Project(tmp_path_factory.mktemp(name) / "proj")
    project.path.mkdir()
    project.write("cobalt.toml", 'test_dir = "experiments"\n')
    for relative, content in files.items():
        project.write(relative, content)
    return project


def logged_in(base_url: str, username: str, password: str):
    """An httpx client of `base_url` logged in through its login form (the session cookie
    kept); the caller closes it."""
    import httpx

    client = httpx.Client(base_url=base_url, timeout=60)
    form = client.get("/login/").text
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    answer = client.post(
        "/login/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": csrf},
        headers={"Referer": f"{base_url}/login/"},
    )
    assert answer.status_code == 302, answer.text
    return client


@pytest.fixture
def cobalt_cli(fake_provider_server: FakeProvider):
    """Run the real `cobalt` command in a project folder (a subprocess)."""

    def run(
        project: Project | Path,
        *args: str,
        env: dict[str, str] | None = None,
        timeout: float = 120,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        folder = project.path if isinstance(project, Project) else project
        base = {
            "OPENAI_BASE_URL": fake_provider_server.openai_base_url,
            "ANTHROPIC_BASE_URL": fake_provider_server.anthropic_base_url,
            "OPENAI_API_KEY": "sk-test-openai-SECRET-0001",
            "ANTHROPIC_API_KEY": "sk-ant-test-SECRET-0002",
        }
        base.update(env or {})
        return cli_zygote.run(list(args), folder, cli_env(base), input=input, timeout=timeout)

    return run


# Team mode: PostgreSQL, Redis, real `cobalt worker` processes (tests/team_harness.py).


@pytest.fixture(scope="module")
def services() -> Iterator[Services]:
    """A PostgreSQL database and a Redis DB for this module's team-mode tests."""
    from tests import team_harness as harness

    created = harness.create_services()
    try:
        yield created
    finally:
        harness.drop_services(created)


@pytest.fixture(scope="module")
def compose(tmp_path_factory) -> dict:
    from tests import team_harness as harness

    return harness.compose_config(
        {
            "COBALT_WORKER_CONCURRENCY": "4",
            "COBALT_WEB_PORT": str(harness.free_port()),
            "COBALT_PROJECT": str(tmp_path_factory.mktemp("compose-project")),
        }
    )


@pytest.fixture(scope="session")
def migrated_template(tmp_path_factory) -> Iterator[str]:
    """A database whose tables the compose `migrate` command created, once a session: each
    module's team database is a copy of it (`CREATE DATABASE … TEMPLATE`: 0.1 s of CPU,
    where migrating took 1.2 s and several seconds of a loaded machine)."""
    from tests import team_harness as harness

    name = f"cobalt_test_template_{os.getpid()}"
    compose = harness.compose_config({})
    folder = tmp_path_factory.mktemp("migrate")
    command = harness.local_command(compose["services"]["migrate"]["command"])
    env = harness.cli_env(
        {
            "COBALT_DATABASE_URL": harness.create_database(name),
            "COBALT_BROKER_URL": harness.REDIS_URL,
            "COBALT_PROJECT_DIR": str(folder),  # as the compose file sets it (/project)
        }
    )
    try:
        result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        yield name
    finally:
        harness.drop_database(name)


@pytest.fixture(scope="module")
def migrated(services: Services, migrated_template: str) -> Services:
    """The team database with its tables: a copy of the one `cobalt migrate` created."""
    from tests import team_harness as harness

    harness.create_database(services.database, template=migrated_template)
    tables = services.query("SELECT count(*) FROM pg_tables WHERE tablename = 'cobalt_app_run'")
    assert tables == [(1,)]
    return services


@pytest.fixture
def team(
    request, migrated: Services, compose: dict, fake_provider_server: FakeProvider, tmp_path
) -> Iterator[Team]:
    """A project folder with its own queue on the team services; its processes stopped after."""
    from tests.team_harness import Team  # noqa: F811

    fake_provider_server.reset()
    fake_provider_server.latency = 0.0
    folder = tmp_path / "proj"
    (folder / "experiments").mkdir(parents=True)
    (folder / "cobalt.toml").write_text('test_dir = "experiments"\n')
    provider_env = {
        "OPENAI_BASE_URL": fake_provider_server.openai_base_url,
        "ANTHROPIC_BASE_URL": fake_provider_server.anthropic_base_url,
        "OPENAI_API_KEY": "sk-test-openai-SECRET-0001",
        "ANTHROPIC_API_KEY": "sk-ant-test-SECRET-0002",
    }
    queue = f"test-{request.node.name[:40]}-{time.monotonic_ns() % 10**6}"
    team = Team(migrated, compose, folder, queue, provider_env)
    try:
        yield team
    finally:
        team.stop_all()


def assert_static_files_are_hashed_compressed_and_cached(url: str) -> None:
    """The page's scripts and stylesheet carry a content hash in their names; Chart.js comes
    gzipped when asked, with a year-long immutable Cache-Control, so browsers keep it."""
    import httpx

    # A page with a chart; the first request of a new server collects the static files.
    page = httpx.get(f"{url}/trends/", timeout=60).text
    hashed = r"\.[0-9a-f]{12}\."
    assert re.search(rf'<link rel="stylesheet" href="/static/cobalt/cobalt{hashed}css"', page)
    assert re.search(rf'<script src="/static/cobalt/cobalt{hashed}js"', page), page[:2000]
    chart = re.search(rf'<script src="(/static/cobalt/vendor/chart\.umd\.min{hashed}js)"', page)
    assert chart, page[:2000]
    reply = httpx.get(f"{url}{chart[1]}", headers={"Accept-Encoding": "gzip"})
    assert reply.status_code == 200 and reply.headers["content-encoding"] == "gzip"
    assert int(reply.headers["content-length"]) < 100_000  # 205 KB uncompressed
    cache = reply.headers["cache-control"]
    assert "immutable" in cache and int(re.search(r"max-age=(\d+)", cache)[1]) >= 31_536_000
    assert "Chart.js" in reply.text  # httpx decompressed it: the real library
