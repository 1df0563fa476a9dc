"""`cobalt run --watch`: run the experiments, then rerun those whose inputs change.

An experiment file's inputs are the file itself, the project modules it imports (found by
importing it here, apart from the runs) and its dataset files. Each run is a `cobalt run FILE`
subprocess: it imports the edited code afresh, and the judge cache makes the items whose
output did not change free. After each rerun the terminal shows what changed per evaluator
since the previous run of that experiment. Ctrl-C stops the run in progress (cancelled, as
always) and the watching.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from cobalt.config import Config

IGNORED_DIRS = {".cobalt", ".git", "__pycache__", ".venv", "venv", "node_modules"}


@dataclass
class Watched:
    """One experiment file: what it depends on, and the experiments it declares."""

    file: Path
    inputs: set[Path] = field(default_factory=set)
    experiments: list[str] = field(default_factory=list)


def watch(config: Config, paths: list[str], run_args: list[str], console: Console) -> int:
    """Run, then rerun on changes until Ctrl-C; returns the exit code."""
    import watchfiles

    from cobalt_app import discovery

    project = config.project_dir.resolve()
    watched = {f: inputs_of(f, project) for f in discovery.discover(config, paths or None)}
    if not watched:
        console.print("[yellow]No experiment files to watch.[/]")
        return 2
    try:
        run_files(list(watched.values()), run_args, console)
        seen = stamps(watched)
        console.print(
            f"\n[dim]Watching {len(watched)} experiment files and their inputs "
            "for changes (Ctrl-C to stop)…[/]"
        )
        # The watcher starts when first asked; what changed before (the inputs' stamps) and each
        # half second without an event are looked at too, so no edit is missed in between.
        # Events are filtered here, not by watchfiles: it yields nothing for a batch it filters
        # out whole, so while ignored files kept changing (the database's WAL and shared-memory
        # files as something reads it) the stamps were never looked at and an edit made before
        # the watcher started was missed (test_watch, on a loaded machine).
        for events in watchfiles.watch(
            project,
            watch_filter=None,
            debounce=200,
            step=50,
            raise_interrupt=True,
            yield_on_timeout=True,
            rust_timeout=500,
        ):
            now = stamps(watched)
            changed = {Path(path).resolve() for change, path in events if _relevant(change, path)}
            changed |= {path for path, stamp in now.items() if seen.get(path) != stamp}
            seen = now
            if not changed:
                continue
            for path in discovery.discover(config, paths or None):  # new experiment files
                if path not in watched:
                    watched[path] = Watched(path, {path.resolve()})
            due = [w for w in watched.values() if w.inputs & changed]
            if not due:
                continue
            names = ", ".join(sorted(_shown(p, project) for p in changed))
            console.print(f"\n[bold]Changed:[/] {escape(names)}")
            for entry in due:
                watched[entry.file] = inputs_of(entry.file, project)
            run_files([watched[w.file] for w in due], run_args, console)
            seen = stamps(watched)
            console.print("\n[dim]Watching for changes (Ctrl-C to stop)…[/]")
    except KeyboardInterrupt:
        console.print("\n[dim]Stopped watching.[/]")
        return 0
    return 0


def stamps(watched: dict[Path, Watched]) -> dict[Path, tuple[int, int] | None]:
    """Each input's modification time and size (None: gone)."""
    found: dict[Path, tuple[int, int] | None] = {}
    for entry in watched.values():
        for path in entry.inputs:
            try:
                stat = path.stat()
                found[path] = (stat.st_mtime_ns, stat.st_size)
            except OSError:
                found[path] = None
    return found


def inputs_of(file: Path, project: Path) -> Watched:
    """Import the file here (without running it) to learn its project modules and datasets."""
    from cobalt_app import discovery
    from cobalt_app.user_modules import UserModules

    modules = UserModules(project)
    modules.forget_project()
    before = set(sys.modules)
    loaded = discovery.load_file(file, project)
    inputs = {file.resolve()}
    for path in modules.loaded(set(sys.modules) - before).values():
        if modules.in_project(path):
            inputs.add(Path(path).resolve())
    for experiment in loaded.experiments:
        source = Path(experiment.dataset.source)
        candidate = source if source.is_absolute() else project / source
        if candidate.is_file():
            inputs.add(candidate.resolve())
    modules.forget_project()
    return Watched(file, inputs, [e.name for e in loaded.experiments])


def run_files(entries: list[Watched], run_args: list[str], console: Console) -> None:
    """`cobalt run FILE` for each, then each experiment's change since its previous run."""
    for entry in entries:
        command = [sys.executable, "-m", "cobalt_cli", "run", str(entry.file), *run_args]
        child = subprocess.Popen(command)
        try:
            child.wait()
        except KeyboardInterrupt:  # the run is cancelled and finalised, as Ctrl-C does
            child.send_signal(signal.SIGINT)
            child.wait()
            raise
        for name in entry.experiments:
            line = delta_line(name)
            if line:
                console.print(line, soft_wrap=True)


def delta_line(name: str) -> str | None:
    """`qa-agent since run 1ab5…: exact 0.50 → 1.00 (+0.50)`, or None before a second run."""
    from cobalt_app.models import Run
    from cobalt_app.selectors import experiment_runs

    latest = list(experiment_runs(name, statuses=Run.FINISHED, rejudged=False)[:2])
    if len(latest) < 2:
        return None
    now, before = (_averages(run) for run in latest)
    parts = []
    for evaluator, value in now.items():
        previous = before.get(evaluator)
        if value is None or previous is None:
            parts.append(f"{evaluator} {_num(previous)} → {_num(value)}")
        else:
            parts.append(f"{evaluator} {previous:.2f} → {value:.2f} ({value - previous:+.2f})")
    return f" [bold]{escape(name)}[/] since run {latest[1].id}: " + escape(", ".join(parts))


def _averages(run: Any) -> dict[str, float | None]:
    scores = (run.summary or {}).get("scores", {})
    return {name: values.get("avg") for name, values in scores.items()}


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _relevant(change: Any, path: str) -> bool:
    parts = set(Path(path).parts)
    return not parts & IGNORED_DIRS and not path.endswith((".pyc", ".tmp", "~"))


def _shown(path: Path, project: Path) -> str:
    try:
        return str(path.relative_to(project))
    except ValueError:
        return str(path)
