"""CLI commands of the team area: `worker`, `workers`, `watch`, `cancel`, `rejudge`."""

from __future__ import annotations

import os
from typing import Annotated

import typer

THREADS_PER_PROCESS = 8  # `--processes auto`: a process per core, but not fewer threads each


def register(app: typer.Typer) -> None:
    """Add this area's commands to the `cobalt` app."""
    app.command()(worker)
    app.command()(workers)
    app.command()(watch)
    app.command()(cancel)
    app.command()(rejudge)


def notice(message: str) -> None:
    from rich.markup import escape

    from cobalt_cli.console import err

    err().print(f"[yellow]{escape(message)}[/]")


def _team_setup():
    from cobalt_cli.console import fail
    from cobalt_cli.project import setup

    config = setup(migrate=False, database_from_env=True)
    if not config.team_mode:
        raise fail(
            "this command needs team mode: set COBALT_BROKER_URL=redis://… and "
            "COBALT_DATABASE_URL=postgresql://… (or broker_url / database_url in cobalt.toml)"
        )
    from cobalt_app.team_broker import check_broker

    check_broker()  # a clear message (the URL's password hidden), not a traceback
    os.chdir(config.project_dir)
    return config


def worker(
    concurrency: Annotated[
        int, typer.Option(min=1, max=512, help="Items in parallel (threads; I/O-bound work).")
    ] = 16,
    queues: Annotated[
        str, typer.Option(help="Comma-separated queues to consume (default: COBALT_QUEUE).")
    ] = "",
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "warning",
    processes: Annotated[
        str,
        typer.Option(
            metavar="N|auto",
            help="Processes sharing --concurrency. The SDKs' own CPU work (building requests, "
            "parsing replies) fills a core long before the threads are busy; `auto`: one per "
            f"CPU core, at most one per {THREADS_PER_PROCESS} threads.",
        ),
    ] = "auto",
) -> None:
    """Start a worker: executes the items of team runs from this project folder."""
    from rich.markup import escape

    config = _team_setup()
    from celery.signals import (
        after_setup_logger,
        after_setup_task_logger,
        worker_shutdown,
        worker_shutting_down,
    )

    from cobalt.redaction import redact
    from cobalt_app import log_redaction, team, worker_runtime
    from cobalt_cli.console import fail, out
    from cobalt_project.celery import app as celery_app

    if not config.get("database_url"):
        notice(
            "no COBALT_DATABASE_URL: this worker uses the SQLite file of this folder, "
            "which only processes on this machine share"
        )
    count = process_count(processes, concurrency)
    from django.core.exceptions import ImproperlyConfigured
    from django.db import DatabaseError

    try:
        team.ensure_schema()
    except (DatabaseError, ImproperlyConfigured, ValueError, OSError) as exc:
        raise fail(f"could not prepare the database: {redact(str(exc))}") from None
    names = [q.strip() for q in (queues or team.queue_name()).split(",") if q.strip()]
    if count > 1:
        raise typer.Exit(supervise(count, concurrency, names, loglevel))
    runtime = worker_runtime.configure(config, concurrency=concurrency, queues=names)
    worker_shutting_down.connect(lambda **_: worker_runtime.begin_shutdown(), weak=False)
    worker_shutdown.connect(lambda **_: worker_runtime.shutdown(), weak=False)
    after_setup_logger.connect(log_redaction.redact_handlers, weak=False)
    after_setup_task_logger.connect(log_redaction.redact_handlers, weak=False)
    out().print(
        f" cobalt worker [bold]{escape(runtime.name)}[/]: {concurrency} threads, "
        f"queues {escape(', '.join(names))}, project {escape(str(config.project_dir))}"
    )
    # Celery's Django fixup runs Django's system checks at every worker start: they check the
    # code Cobalt ships (the test suite runs them) and import the whole web layer (URL conf,
    # views, REST API) that a worker never serves: ~0.35 s of CPU and its memory in each worker
    # process. CELERY_SKIP_CHECKS= (empty) runs them anyway.
    os.environ.setdefault("CELERY_SKIP_CHECKS", "1")
    try:
        celery_app.worker_main(
            [
                "worker",
                "--pool=threads",
                f"--concurrency={concurrency}",
                f"--queues={','.join(names)}",
                f"--loglevel={loglevel}",
                f"--hostname=cobalt-{os.getpid()}@%h",
                "--without-gossip",
                "--without-mingle",
            ]
        )
    finally:
        worker_runtime.shutdown()


def process_count(given: str, concurrency: int) -> int:
    """`--processes`: a number, or `auto` (one per usable core, at least 8 threads each)."""
    from cobalt_cli.console import fail

    if given.strip().lower() == "auto":
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            cores = os.cpu_count() or 1
        return max(1, min(cores, concurrency // THREADS_PER_PROCESS))
    try:
        count = int(given)
    except ValueError:
        count = 0
    if not 1 <= count <= 64:
        raise fail(f"--processes must be `auto` or a number from 1 to 64, not {given!r}")
    return count


def supervise(processes: int, concurrency: int, queues: list[str], loglevel: str) -> int:
    """Run `processes` single-process workers; restart one that dies, stop all on a signal."""
    import signal
    import subprocess
    import sys
    import time

    from cobalt_app.worker_runtime import SUPERVISOR_ENV
    from cobalt_cli.console import out

    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]

    def start(share: int) -> subprocess.Popen:
        command = [sys.executable, "-m", "cobalt_cli", "worker", f"--concurrency={max(share, 1)}"]
        command += [f"--queues={','.join(queues)}", f"--loglevel={loglevel}", "--processes=1"]
        # Own session: a terminal's Ctrl-C reaches the children once, through us.
        env = {**os.environ, SUPERVISOR_ENV: str(os.getpid())}  # they stop if we are killed
        return subprocess.Popen(command, start_new_session=True, env=env)

    children = [start(share) for share in shares]
    started = [time.monotonic()] * processes
    out().print(f" cobalt worker: {processes} processes, {concurrency} threads in all")
    stopping: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        stopping.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        for position, child in enumerate(children):
            code = child.poll()
            if code is not None and not stopping:
                # An error exit right after starting (not a kill) would only repeat: give up.
                if code > 0 and time.monotonic() - started[position] < 10:
                    stop(signal.SIGTERM, None)
                    notice(f"worker process {child.pid} exited with {code} at start")
                    return code or 1
                notice(f"worker process {child.pid} exited with {code}; starting another")
                children[position] = start(shares[position])
                started[position] = time.monotonic()
        if stopping and all(child.poll() is not None for child in children):
            return 0
        time.sleep(0.5)


def workers(
    here: Annotated[
        bool, typer.Option("--here", help="Only workers on this host; exit 1 if there is none.")
    ] = False,
) -> None:
    """List the workers that are alive (a health check with --here)."""
    import socket
    import time

    from rich.markup import escape
    from rich.table import Table

    _team_setup()

    from cobalt_app import team_broker
    from cobalt_cli.console import out

    alive = team_broker.live_workers()
    if here:
        alive = [w for w in alive if w.get("host") == socket.gethostname()]
    if not alive:
        out().print("No worker is running." + ("" if here else " Start one with `cobalt worker`."))
        raise typer.Exit(1 if here else 0)
    table = Table(box=None, padding=(0, 2), header_style="bold")
    for column in ("Worker", "Queues", "Threads", "Busy", "Done", "Up"):
        table.add_column(column)
    for w in alive:
        table.add_row(
            escape(w["name"]),
            escape(",".join(w.get("queues", []))),
            str(w.get("concurrency")),
            str(w.get("held")),
            str(w.get("processed")),
            f"{time.time() - w.get('started', time.time()):.0f}s",
        )
    out().print(table, soft_wrap=False)


def watch(
    run_id: Annotated[str, typer.Argument(help="Run id (or an unambiguous prefix).")],
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No per-item lines.")] = False,
) -> None:
    """Re-attach to a team run: stream its items and summary until it ends."""
    config = _team_setup()
    from cobalt_app import team_wait
    from cobalt_app.models import Run
    from cobalt_app.selectors import run_get
    from cobalt_cli.console import err, out
    from cobalt_cli.reporter import ConsoleReporter

    run = run_get(run_id)
    reporter = ConsoleReporter(out(), quiet=quiet)
    reporter.banner()
    reporter.run_started(run, None)
    try:
        run = team_wait.wait(run.id, config, reporter=reporter, on_notice=notice)
    except KeyboardInterrupt:
        reporter.stop_progress()
        err().print(
            f"\n[yellow]Stopped watching.[/] Run {run.id} goes on; re-attach with "
            f"[bold]cobalt watch {run.id}[/], stop it with [bold]cobalt cancel {run.id}[/]."
        )
        raise typer.Exit(130) from None
    raise typer.Exit(0 if run.status == Run.Status.COMPLETED else 1)


def cancel(run_id: Annotated[str, typer.Argument(help="Run id (or an unambiguous prefix).")]):
    """Stop a run, started here or anywhere: its unfinished items are cancelled; the workers,
    or the process executing it (`cobalt run`, the API, MCP), stop within seconds."""
    from rich.markup import escape

    from cobalt_cli.console import out
    from cobalt_cli.project import setup

    config = setup()
    os.chdir(config.project_dir)
    from cobalt_app.runs import lifecycle
    from cobalt_app.selectors import run_get

    run = run_get(run_id)
    if run.is_finished:
        out().print(f" Run {run.id} is already {run.status}; nothing to cancel.")
        return
    run, cancelled = lifecycle.cancel(run.id, config)
    lifecycle.webhooks_sent()
    out().print(
        f" Cancelled run [bold]{run.id}[/] ({escape(run.name)}): {cancelled} unfinished "
        f"item{'s' * (cancelled != 1)} will not run; {run.total_items - cancelled} finished."
    )


def rejudge(
    run_id: Annotated[str, typer.Argument(help="The run whose outputs to score again.")],
    evaluator: Annotated[
        str | None, typer.Option("--evaluator", "-e", help="Only this evaluator.")
    ] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Bypass the judge cache.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No per-item lines.")] = False,
    labelled: Annotated[
        bool,
        typer.Option(
            "--labelled", help="Only the items people labelled (the others keep their verdicts)."
        ),
    ] = False,
) -> None:
    """Score a run's stored outputs again as a new run (after editing a judge prompt, say)."""
    from cobalt_cli.console import err, out
    from cobalt_cli.project import setup

    config = setup()
    os.chdir(config.project_dir)
    from cobalt_app import rejudge as rejudging
    from cobalt_app import team_wait
    from cobalt_cli.reporter import ConsoleReporter

    reporter = ConsoleReporter(out(), quiet=quiet)
    reporter.banner()
    try:
        run = rejudging.rejudge(
            config,
            run_id,
            evaluator=evaluator,
            reporter=reporter,
            no_cache=no_cache,
            on_notice=notice,
            labelled=labelled,
        )
    except team_wait.Detached as exc:
        reporter.stop_progress()
        err().print(
            f"\n[yellow]Interrupted.[/] Re-judge run {exc.run_id} goes on on the workers; "
            f"re-attach with [bold]cobalt watch {exc.run_id}[/]."
        )
        raise typer.Exit(130) from None
    except KeyboardInterrupt:
        reporter.stop_progress()
        err().print("\n[yellow]Interrupted.[/] The re-judge run was cancelled.")
        raise typer.Exit(130) from None
    out().print(f" Re-judged run {run.parent_id} → new run [bold]{run.id}[/]")
