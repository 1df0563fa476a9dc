"""CLI commands of the dashboard area: `cobalt serve` and `cobalt export`; `run --ui` support.

`cobalt serve` runs the Django app under gunicorn (gthread workers), embedded through
`gunicorn.app.base.BaseApplication`: real worker processes and threads, so the dashboard
and API stay responsive with dozens of concurrent clients, unlike `runserver`.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cobalt.dashboard import (
    configured_address,
    forget_address,
    record_address,
    running_dashboard,
    url_host,
)

if TYPE_CHECKING:
    from cobalt.config import Config
    from cobalt_app.models import Run

READY_MESSAGE = "Cobalt dashboard: "


class ExportFormat(StrEnum):
    csv = "csv"
    md = "md"
    json = "json"
    jsonl = "jsonl"


def register(app: typer.Typer) -> None:
    """Add this area's commands to the `cobalt` app."""
    app.command()(serve)
    app.command()(export)


# serve --------------------------------------------------------------------------------------


def serve(
    port: Annotated[
        int | None,
        typer.Option(min=0, max=65535, help="Port (default 4000, or dashboard.port; 0 = any)."),
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="Address to listen on (default 127.0.0.1).")
    ] = None,
    open_browser: Annotated[
        bool, typer.Option("--open", help="Open the dashboard in a browser when ready.")
    ] = False,
    workers: Annotated[
        int | None, typer.Option(min=1, help="Worker processes (default: CPU count, max 4).")
    ] = None,
    threads: Annotated[int, typer.Option(min=1, help="Threads per worker process.")] = 8,
    open_path: Annotated[str, typer.Option(hidden=True)] = "/",
) -> None:
    """Serve the dashboard and the API (gunicorn; Ctrl+C stops it)."""
    from cobalt_cli.console import fail
    from cobalt_cli.project import setup

    config = setup(database_from_env=True)
    configured_host, configured_port = configured_address(config)
    host = (host or configured_host).strip()
    if port is None:
        port = configured_port
    from cobalt_app.security import check_serve_exposure

    check_serve_exposure(host)
    problem = port_problem(host, port)
    if problem:
        raise fail(problem)
    from django.conf import settings
    from django.contrib.staticfiles.storage import staticfiles_storage
    from django.db import connections

    from cobalt_project.static_root import MANIFEST

    # Static files are hashed and compressed once (see static_files), before workers fork.
    if not (Path(settings.STATIC_ROOT) / MANIFEST).is_file():
        print("Preparing the dashboard's static files (once per install)…", file=sys.stderr)
    staticfiles_storage.location  # noqa: B018
    # Worker processes are forked from this one: they must not share its connection.
    connections.close_all()
    open_browser = open_browser or bool(config.get("dashboard.open"))
    server = DashboardServer(
        host=host,
        port=port,
        workers=workers or min(4, os.cpu_count() or 1),
        threads=threads,
        open_url_path=open_path if open_browser else None,
        output_dir=config.output_dir,
    )
    server.run()


def port_problem(host: str, port: int) -> str | None:
    """A clear message when the address cannot be bound, before gunicorn tries."""
    import socket

    if port == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host.strip("[]"), port))
    except socket.gaierror:
        return f"--host {host!r} is not an address or a name this machine can resolve"
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return f"port {port} on {host} is already in use; pick another with --port"
        if exc.errno == errno.EADDRNOTAVAIL:
            return f"--host {host} is not an address of this machine"
        if exc.errno == errno.EACCES:
            return f"no permission to listen on port {port}; use a port above 1023"
        return f"cannot listen on {host}:{port}: {exc.strerror}"
    return None


def _gunicorn_base():
    from gunicorn.app.base import BaseApplication

    return BaseApplication


class DashboardServer:
    """gunicorn with gthread workers, configured in code (no config file, no control socket)."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        workers: int,
        threads: int,
        open_url_path: str | None = None,
        output_dir: Path | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.workers = workers
        self.threads = threads
        self.open_url_path = open_url_path
        self.output_dir = output_dir  # where it says its address (`cobalt.dashboard`)

    def options(self) -> dict[str, Any]:
        return {
            "bind": [f"{url_host(self.host)}:{self.port}"],
            "worker_class": "gthread",
            "workers": self.workers,
            "threads": self.threads,
            "timeout": 120,
            "graceful_timeout": 5,
            "keepalive": 5,
            "loglevel": "warning",
            "accesslog": None,
            "errorlog": "-",
            "proc_name": "cobalt-serve",
            "control_socket_disable": True,
            "when_ready": self.when_ready,
            "on_exit": self.on_exit,
        }

    def when_ready(self, arbiter: Any) -> None:
        port = arbiter.LISTENERS[0].getsockname()[1]
        base = f"http://{url_host(self.host)}:{port}"
        if self.output_dir is not None:  # `cobalt run`'s "Dashboard:" line gives this address
            record_address(self.output_dir, base)
        print(f"{READY_MESSAGE}{base}/  (Ctrl+C stops it)", flush=True)
        if self.open_url_path:
            import webbrowser

            url = base + self.open_url_path
            # A BROWSER command may wait for its child; never block the arbiter on it.
            threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()

    def on_exit(self, arbiter: Any) -> None:
        if self.output_dir is not None:
            forget_address(self.output_dir)

    def run(self) -> None:
        options = self.options()

        class Application(_gunicorn_base()):
            def load_config(self) -> None:
                for key, value in options.items():
                    if key in self.cfg.settings:
                        self.cfg.set(key, value)

            def load(self):
                from django.core.wsgi import get_wsgi_application

                application = get_wsgi_application()
                log_request_errors()
                from cobalt_app import run_search

                run_search.build_in_background()  # finished runs' search indexes, apart
                threading.Thread(target=warm_up, daemon=True).start()
                return application

        Application(prog="cobalt serve").run()


def log_request_errors() -> None:
    """A page that fails (HTTP 500) logs its traceback to the server's stderr."""
    import logging

    logger = logging.getLogger("django.request")
    if not logger.handlers:
        from cobalt_app.log_redaction import redacting

        handler = redacting(logging.StreamHandler())
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.ERROR)


def warm_up() -> None:
    """Import in the background what the first requests would otherwise wait for: the URL
    configuration (views, API) and scipy (about a second; compare pages need it)."""
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 - imports every view module
    import scipy.special  # noqa: F401
    import scipy.stats  # noqa: F401


# run --ui -----------------------------------------------------------------------------------


def open_ui(config: Config, runs: list[Run]) -> None:
    """After `cobalt run --ui`: show the run's page in a browser, serving it if need be.

    Like `cypress open`, the dashboard stays up until Ctrl+C. A dashboard of this project
    already answering (where its `cobalt serve` said it listens, or on the configured port) is
    reused (the command then returns at once).
    """
    import signal
    import subprocess
    import webbrowser

    from cobalt_cli.console import out

    host, port = configured_address(config)
    path = f"/runs/{runs[0].id}/" if len(runs) == 1 else "/"
    running = running_dashboard(config)
    if running:
        url = running + path
        out().print(f"\n Dashboard: {url}")
        webbrowser.open(url)
        return
    if port_problem(host, port):
        port = 0
    out().print("\n Starting the dashboard (Ctrl+C stops it)…")
    command = [sys.executable, "-m", "cobalt_cli", "serve", "--host", host, "--port", str(port)]
    command += ["--open", "--open-path", path]
    child = subprocess.Popen(command, cwd=config.project_dir)
    # Ctrl+C reaches both processes; a SIGTERM sent to this one is passed on to the server.
    previous = signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    try:
        child.wait()
    except KeyboardInterrupt:
        child.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)


# export -------------------------------------------------------------------------------------


def export(
    run_id: Annotated[str, typer.Argument(help="Run id (or a unique prefix).")],
    fmt: Annotated[
        ExportFormat,
        typer.Option("--format", "-f", help="csv, md (Markdown), json or jsonl (JSON Lines)."),
    ] = ExportFormat.json,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="File to write (default: stdout); a name ending .gz is gzipped."
        ),
    ] = None,
) -> None:
    """Export a run's items and scores as CSV, Markdown, JSON or JSON Lines, streamed."""
    import tempfile

    from rich.markup import escape

    from cobalt_cli.console import fail, out
    from cobalt_cli.project import setup

    setup()
    from cobalt import results_file
    from cobalt_app import exports
    from cobalt_app.selectors import run_get

    run = run_get(run_id)
    chunks = exports.export(run, fmt.value)
    if output is None:
        for chunk in chunks:
            sys.stdout.write(chunk)
        sys.stdout.flush()
        return
    target = output.expanduser().resolve()
    if target.is_dir():
        target = target / exports.filename(run, fmt.value)
    if not target.parent.is_dir():
        raise fail(f"--output {output}: folder {target.parent} does not exist")
    # Written next to the target and renamed: an interrupted export leaves no half file.
    handle, temporary = tempfile.mkstemp(prefix=".cobalt-export-", dir=target.parent)
    os.close(handle)
    try:
        compressed = target.name.endswith(".gz")
        with results_file.open_text(temporary, "w", compressed=compressed) as fh:
            fh.writelines(chunks)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    out().print(f" Exported run {run.id} ({run.total_items} items) to {escape(str(target))}")
