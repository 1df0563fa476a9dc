"""Start runs of experiment files: discover, import, filter, then execute or enqueue.

The CLI, the direct `python file.cobalt.py` mode, the API and the MCP server all start runs
through `execute()`, which refuses a run that cannot succeed before any agent call.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, TypedDict, Unpack

from cobalt.config import Config
from cobalt.errors import CobaltError
from cobalt.experiments import Experiment
from cobalt_app import aio, discovery, plugins, preflight, traces
from cobalt_app.engine import Reporter
from cobalt_app.models import Run
from cobalt_app.runs.embedded import run_experiment
from cobalt_app.services import RunBusy

GLOB_CHARS = set("*?[")


@dataclass
class LaunchResult:
    runs: list[Run] = field(default_factory=list)
    load_errors: list[discovery.LoadedFile] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


def name_matches(experiment: Experiment, pattern: str | None) -> bool:
    """`--filter`: a glob on the name, or a substring of the name or of a tag."""
    if not pattern:
        return True
    candidates = [experiment.name, *experiment.tags]
    if GLOB_CHARS & set(pattern):
        return any(fnmatch(c, pattern) for c in candidates)
    return any(pattern.lower() in c.lower() for c in candidates)


def load_experiments(
    config: Config,
    paths: list[str] | None = None,
    *,
    name_filter: str | None = None,
    tag: str | None = None,
) -> tuple[list[Experiment], list[discovery.LoadedFile], list[Path]]:
    plugins.load_plugins(config)  # custom evaluator types; a broken plugin raises PluginError
    files = discovery.discover(config, paths)
    experiments: list[Experiment] = []
    errors: list[discovery.LoadedFile] = []
    for path in files:
        loaded = discovery.load_file(path, config.project_dir)
        if loaded.error:
            errors.append(loaded)
            continue
        for experiment in loaded.experiments:
            if not name_matches(experiment, name_filter):
                continue
            if tag and tag not in experiment.tags:
                continue
            experiments.append(experiment)
    return experiments, errors, files


def relative_file(config: Config, experiment: Experiment) -> str:
    if not experiment.file:
        return ""
    path = Path(experiment.file)
    try:
        return path.resolve().relative_to(config.project_dir).as_posix()
    except ValueError:
        return str(path)


def preload_sdks(experiments: list[Experiment], config: Config) -> None:
    """Import the provider SDKs the evaluators will call, and those the agent's code imported,
    before items start, not on the loop.

    Importing `openai` takes about half a second and its client imports its resources on
    first use; done lazily inside the first items it would stall every item in flight and
    show up as their latency.
    """
    from cobalt_app.evaluators import calls_provider
    from cobalt_app.providers import SDK_MODULES, import_sdk

    for provider, module in SDK_MODULES.items():
        if module in sys.modules:  # the experiment file (the agent) imported it
            import_sdk(provider)
    if traces.TraceSettings.from_config(config).enabled:
        traces.preload_instrumentations()
    default = config.get("judge.provider") or "openai"
    for experiment in experiments:
        for evaluator in experiment.evaluators:
            if calls_provider(evaluator.type):
                import_sdk(evaluator.provider or default)


def prewarm_statistics() -> None:
    """Import numpy in the background while the first items run (summaries need it)."""
    import threading

    def load() -> None:
        from cobalt_app import significance  # noqa: F401

    threading.Thread(target=load, name="cobalt-prewarm", daemon=True).start()


class RunOptions(TypedDict, total=False):
    """What `execute` may be asked, whichever mode runs the experiments."""

    reporter: Reporter | None
    no_cache: bool
    overrides: dict[str, Any] | None
    resume_run_id: str | None
    tags: list[str] | None


def execute(
    experiments: list[Experiment], config: Config, **options: Unpack[RunOptions]
) -> list[Run]:
    """Run experiments one after another in this process, on the long-lived event loop.

    In team mode the runs are enqueued for the workers instead, and this waits for them.
    First, whatever can be checked without calling the agent is (`preflight.check` raises
    `PreflightError`, and nothing runs).
    """
    preflight.check(experiments, config)
    if config.team_mode:
        from cobalt_app import team_wait
        from cobalt_app.progress import ProgressReporter

        # Each experiment's on_progress hears of the items too.
        reporter = ProgressReporter(options.get("reporter"))
        return team_wait.execute(experiments, config, {**options, "reporter": reporter})

    preload_sdks(experiments, config)
    prewarm_statistics()

    async def run_all() -> list[Run]:
        db = aio.DatabaseThread()
        runs: list[Run] = []
        try:
            for experiment in experiments:
                run = await run_experiment(
                    experiment,
                    config,
                    db=db,
                    file=relative_file(config, experiment),
                    on_start=started.append,
                    **options,
                )
                runs.append(run)
        finally:
            db.close()
        return runs

    started: list[str] = []
    try:
        return aio.run(run_all())
    except aio.Interrupted as exc:
        exc.run_id = exc.run_id or (started[-1] if started else None)  # the one cancelled
        raise


class ResumeError(CobaltError):
    pass


def resume(
    config: Config, run_id: str, *, reporter: Reporter | None = None, no_cache: bool = False
) -> LaunchResult:
    """Execute only the missing, failed or timed-out items of an earlier run."""
    from cobalt_app.selectors import run_get

    run = run_get(run_id)
    if not run.file:
        raise ResumeError(f"run {run.id} has no experiment file recorded; it cannot be resumed")
    experiments, errors, files = load_experiments(config, [run.file])
    result = LaunchResult(load_errors=errors, files=files)
    if errors:
        return result
    matching = [e for e in experiments if e.name == run.name]
    if not matching:
        raise ResumeError(f"{run.file} no longer defines an experiment named {run.name!r}")
    try:
        result.runs = execute(
            matching[:1], config, reporter=reporter, no_cache=no_cache, resume_run_id=run.id
        )
    except RunBusy as exc:
        raise ResumeError(str(exc)) from None
    return result
