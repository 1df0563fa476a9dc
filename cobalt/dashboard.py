"""Where this project's dashboard is: its address, and whether it already answers there.

`cobalt serve` listens on `configured_address(config)` unless told another port (`--port`,
0 for any), and says where in the project's output folder (`ADDRESS_FILE`) while it runs;
`cobalt run --ui`, the reporter's "Dashboard:" line and a report shown in a notebook look for
it there (`running_dashboard`). A dashboard is this project's when its `/healthz/` names the
same `project_fingerprint` (a hash of the project folder, so the path itself is never served).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cobalt.config import Config

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4000
ADDRESS_FILE = "dashboard.json"  # in the output folder: where its `cobalt serve` listens now


def configured_address(config: Config) -> tuple[str, int]:
    """(host, port) of this project's dashboard: `[dashboard]` in the config, else the defaults."""
    host = (config.get("dashboard.host") or DEFAULT_HOST).strip()
    return host, int(config.get("dashboard.port") or DEFAULT_PORT)


def url_host(host: str) -> str:
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


def project_fingerprint(project_dir: str | Path) -> str:
    """Names a project folder in `/healthz/` without revealing its path."""
    return hashlib.sha256(str(project_dir).encode()).hexdigest()[:16]


def existing_dashboard(host: str, port: int, project_dir: str | Path) -> str | None:
    """The base URL of the dashboard of the project at `project_dir` if one answers at
    host:port."""
    base = f"http://{url_host(host)}:{port}"
    return base if answers(base, project_dir) else None


def answers(base: str, project_dir: str | Path, timeout: float = 1.0) -> bool:
    """Whether the dashboard of the project at `project_dir` answers at `base`."""
    import httpx

    try:
        reply = httpx.get(f"{base}/healthz/", timeout=timeout)
        return reply.status_code == 200 and reply.json().get("project") == project_fingerprint(
            project_dir
        )
    except (httpx.HTTPError, ValueError, AttributeError):
        return False


def record_address(output_dir: Path, base: str) -> None:
    """Say where this process's `cobalt serve` listens (its real port, whatever was asked)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    address = {"url": base, "pid": os.getpid()}
    (output_dir / ADDRESS_FILE).write_text(json.dumps(address), encoding="utf-8")


def forget_address(output_dir: Path) -> None:
    """This process's `cobalt serve` stops: its address goes (not another's that replaced it)."""
    path = output_dir / ADDRESS_FILE
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if json.loads(path.read_text(encoding="utf-8")).get("pid") == os.getpid():
            path.unlink()


def recorded_address(output_dir: Path) -> str | None:
    """The address a `cobalt serve` of the project said it listens on, if its process is
    still there (a killed one left its file)."""
    with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
        said = json.loads((output_dir / ADDRESS_FILE).read_text(encoding="utf-8"))
        os.kill(int(said["pid"]), 0)
        url = said["url"]
        return url if isinstance(url, str) and url.startswith("http") else None
    return None


def recorded_dashboard(config: Config) -> str | None:
    """The base URL of this project's dashboard where its `cobalt serve` said it listens (any
    port; given time to answer, a busy server being there), if it answers there. Without such
    a record nothing is asked: a run's closing line connects to nothing else."""
    recorded = recorded_address(config.output_dir)
    if recorded is not None and answers(recorded, config.project_dir, timeout=5.0):
        return recorded
    return None


def running_dashboard(config: Config) -> str | None:
    """The base URL of this project's dashboard if one answers: where its `cobalt serve` said
    it listens, else on the configured address. None when none does."""
    return recorded_dashboard(config) or existing_dashboard(
        *configured_address(config), config.project_dir
    )
