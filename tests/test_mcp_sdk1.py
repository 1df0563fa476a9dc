"""`cobalt mcp` on the mcp 1.x SDK (frameworks such as CrewAI pin `mcp<2`).

A separate virtualenv holds only the oldest mcp 1.x Cobalt supports; a `.pth` file puts this
environment's packages after it, so its `mcp` wins and everything else is what the suite runs
with. test_mcp.py's sessions (every tool, resource and prompt; a run with progress; refused
arguments and tool errors) then run again against a server started by that interpreter, while
the client stays on mcp 2.x: the protocol between them is the same.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.test_mcp import initialised  # noqa: F401 - the fixture the sessions below use
from tests.test_mcp import (
    test_a_session_lists_every_tool_resource_and_prompt as test_mcp1_lists_every_tool_resource_and_prompt,  # noqa: E501
)
from tests.test_mcp import (
    test_cobalt_run_streams_progress_and_returns_the_results_file as test_mcp1_runs_with_progress,
)
from tests.test_mcp import (
    test_file_arguments_outside_the_project_are_refused as test_mcp1_refuses_and_reports_tool_errors,  # noqa: E501
)

# The lower bound of `mcp` in pyproject.toml: the oldest 1.x the server works with.
OLDEST_MCP1 = "1.22.0"

__all__ = [
    "test_mcp1_lists_every_tool_resource_and_prompt",
    "test_mcp1_refuses_and_reports_tool_errors",
    "test_mcp1_runs_with_progress",
]


@pytest.fixture(scope="module")
def mcp_python(tmp_path_factory) -> str:
    """A virtualenv's interpreter with mcp 1.x first on its path, then this environment's."""
    venv = tmp_path_factory.mktemp("mcp1") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q"]
    done = subprocess.run([*pip, f"mcp=={OLDEST_MCP1}"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "zz_cobalt_test_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    version = subprocess.run(
        [python, "-c", "import mcp, importlib.metadata as m; print(m.version('mcp'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version == OLDEST_MCP1
    return python
