"""Shared fixtures: a fake LLM provider, throwaway Cobalt projects, the real `cobalt` command.

The in-process Django test database is a SQLite *file* (see `pytest_configure`) so the
engine's database thread and the test see the same data; engine tests use `transactional_db`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fake_provider import FakeProvider

REPO = Path(__file__).resolve().parent.parent
_SESSION_DIR = Path(tempfile.mkdtemp(prefix="cobalt-tests-"))
os.environ.setdefault("COBALT_PROJECT_DIR", str(_SESSION_DIR / "project"))
(_SESSION_DIR / "project").mkdir(exist_ok=True)
for _name in list(os.environ):
    if _name.startswith("COBALT_") and _name not in ("COBALT_PROJECT_DIR",):
        del os.environ[_name]
os.environ["COBALT_SQLITE_PATH"] = str(_SESSION_DIR / "history.db")


def pytest_configure(config: pytest.Config) -> None:
    from django.conf import settings

    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("sqlite3"):
        database.setdefault("TEST", {})["NAME"] = str(_SESSION_DIR / "test.db")


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
        return sorted((self.path / ".cobalt" / "results").glob("*.json"))

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
        return subprocess.run(
            [sys.executable, "-m", "cobalt_cli", *args],
            cwd=folder,
            env=cli_env(base),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
        )

    return run
