"""A brand-new virtualenv installs Cobalt as a user would and runs the example project.

`pip install .` from a copy of what a clean clone would hold (tracked and untracked files
that git does not ignore: in CI, which runs on a fresh clone, that is exactly the clone),
with the isolated build pip does for a user, then `cobalt --version`, `cobalt init` and
`cobalt run` in an empty folder. The install takes constraints.txt, the tested set of
versions scripts/test installed a moment earlier, so pip serves it from its cache.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cobalt
from tests.conftest import REPO, assert_static_files_are_hashed_compressed_and_cached

IGNORED = shutil.ignore_patterns(
    ".git", "__pycache__", "*.pyc", "*.egg-info", ".venv", "build", "dist", ".cobalt", "*_cache"
)


def copy_source_tree(target: Path) -> Path:
    """The files a clean clone of the working tree would have, copied to `target`."""
    if not (REPO / ".git").exists():
        shutil.copytree(REPO, target, ignore=IGNORED)
        return target
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for relative in filter(None, listed.split("\0")):
        source = REPO / relative
        if source.is_file():  # a tracked file deleted in the working tree is not copied
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / relative)
    return target


def user_env(venv: Path) -> dict[str, str]:
    """A shell with only the new virtualenv activated: nothing of this checkout or its venv."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("COBALT_", "PYTHON", "PYTEST", "DJANGO_", "VIRTUAL_ENV"))
        and name not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
    }
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["NO_COLOR"] = "1"
    return env


def sh(args: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 120):
    started = time.monotonic()
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - started
    print(f"$ {' '.join(args)}  ({took:.1f}s, exit {result.returncode})\n{result.stdout}")
    assert result.returncode == 0, f"{args} exited {result.returncode}:\n{result.stderr}"
    return result


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_fresh_virtualenv_installs_cobalt_and_runs_the_example_project(tmp_path):
    source = copy_source_tree(tmp_path / "clone")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = user_env(venv)
    python = str(venv / "bin" / "python")

    sh(
        [python, "-m", "pip", "install", "-q", "-c", "constraints.txt", "."],
        cwd=source,
        env=env,
        timeout=600,
    )

    project = tmp_path / "demo"
    project.mkdir()
    version = sh(["cobalt", "--version"], cwd=project, env=env)
    assert version.stdout.strip() == f"cobalt-agents {cobalt.__version__}"

    sh(["cobalt", "init"], cwd=project, env=env)
    assert (project / "cobalt.toml").is_file()
    run = sh(["cobalt", "run"], cwd=project, env=env)
    (results_file,) = (project / ".cobalt" / "results").glob("*.json")
    results = json.loads(results_file.read_text(encoding="utf-8"))
    assert results["status"] == "completed" and len(results["items"]) == 8
    assert results["id"] in run.stdout and "exact" in run.stdout  # the summary was printed

    # What was installed is the wheel (not this checkout) and it carries the non-Python parts.
    installed = sh(
        [
            python,
            "-c",
            "import importlib.metadata as m, pathlib, cobalt_project;"
            "print(m.version('cobalt-agents'));"
            "print(pathlib.Path(cobalt_project.__file__).parent)",
        ],
        cwd=project,
        env=env,
    ).stdout.split()
    assert installed[0] == cobalt.__version__
    package = Path(installed[1])
    assert package.is_relative_to(venv)
    assert (package / "templates" / "cobalt" / "base.html").is_file()
    assert (package / "static" / "cobalt" / "cobalt.js").is_file()
    assert (package.parent / "cobalt_app" / "migrations" / "0001_initial.py").is_file()

    # `cobalt serve` with no setup step serves hashed, compressed, long-cached static files.
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # nothing collected beforehand
    server = subprocess.Popen(
        ["cobalt", "serve", "--port", "0"],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = next(
            match[1]
            for line in server.stdout
            if (match := re.search(r"Cobalt dashboard: (http://\S+?)/ ", line))
        )
        assert_static_files_are_hashed_compressed_and_cached(url)
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_cobalt_version_prints_the_distribution_and_its_version():
    from typer.testing import CliRunner

    from cobalt_cli.main import app

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"cobalt-agents {cobalt.__version__}\n"
