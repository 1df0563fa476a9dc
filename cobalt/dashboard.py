"""Where this project's dashboard is: its address, and whether it already answers there.

`cobalt serve` listens on `configured_address(config)`; `cobalt run --ui`, the reporter's
"Dashboard:" line and a report shown in a notebook look for it there. A dashboard is this
project's when its `/healthz/` names the same `project_fingerprint` (a hash of the project
folder, so the path itself is never served).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cobalt.config import Config

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4000


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
    import httpx

    base = f"http://{url_host(host)}:{port}"
    try:
        reply = httpx.get(f"{base}/healthz/", timeout=1.0)
        ours = reply.status_code == 200 and reply.json().get("project") == project_fingerprint(
            project_dir
        )
    except (httpx.HTTPError, ValueError):
        return None
    return base if ours else None
