"""Where a run is executed: the one way in, for every door and both modes.

`launch()` is the engine's entry point. The CLI, the direct `python file.cobalt.py` mode, the
API and the MCP server all await it on the engine's long-lived loop (`aio`); a synchronous
door calls `execute()`, which runs it there and waits. It refuses a run that cannot succeed
before any agent call (`preflight`), then executes the experiments in this process
(`runs.embedded`) or, in team mode, enqueues them for the workers and follows them
(`team_wait`). Whatever the mode, the run's finalisation writes its results file
(`runs.lifecycle.finalise`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, Unpack

from cobalt import variants
from cobalt.config import Config
from cobalt.errors import CobaltError
from cobalt.experiments import Experiment
from cobalt.run_settings import RUN_DEFAULTS
from cobalt_app import aio, discovery, otlp_server, plugins, preflight, traces
from cobalt_app.engine import Reporter
from cobalt_app.models import Run
from cobalt_app.run_options import RunOptions, relative_file
from cobalt_app.runs import lifecycle
from cobalt_app.runs.embedded import run_experiment
from cobalt_app.services import RunBusy

__all__ = ["RunOptions", "execute", "launch", "relative_file"]

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
    default = config.get("judge.provider") or RUN_DEFAULTS.judge.provider
    for experiment in experiments:
        for evaluator in experiment.evaluators:
            if calls_provider(evaluator.type):
                import_sdk(evaluator.provider or default)


def prewarm_statistics() -> None:
    """Import numpy in the background while the first items run (summaries need it)."""
    import threading

    def load() -> None:
        from cobalt import significance  # noqa: F401

    threading.Thread(target=load, name="cobalt-prewarm", daemon=True).start()


def prepare(experiments: list[Experiment], config: Config) -> None:
    """Before any run starts: check what can be checked without calling the agent
    (`preflight.check` raises `PreflightError`, and nothing runs); an embedded run also
    imports the SDKs its items will need and starts loading numpy."""
    preflight.check(experiments, config)
    if not config.team_mode:
        preload_sdks(experiments, config)
        prewarm_statistics()


async def launch(
    experiments: list[Experiment],
    config: Config,
    *,
    on_start: Callable[[str], None] | None = None,
    **options: Unpack[RunOptions],
) -> list[Run]:
    """The one way in: run the experiments one after another, on the engine's long-lived
    loop (await it there). Embedded mode executes them in this process; team mode enqueues
    them for the workers and follows each to its end (cancelled, this stops following and
    the run goes on on the workers: `team_wait.Detached`).

    `on_start` is told each run's id as this process takes it up (created, or followed).
    An experiment with variants runs as a sweep: one ordinary run per variant (`sweeps`).
    """
    experiments = variants.expand_all(experiments)
    db = aio.DatabaseThread()
    try:
        # Off the loop: preflight may read the database, an SDK takes half a second to import.
        await db(prepare, experiments, config)
        if not options.get("resume_run_id"):  # a resumed run keeps its sweep
            await db(assign_sweeps, experiments, config)
    except BaseException:
        db.close()
        raise
    if config.team_mode:
        from cobalt_app import team_wait
        from cobalt_app.progress import ProgressReporter

        # Each experiment's on_progress hears of the items too.
        options["reporter"] = ProgressReporter(options.get("reporter"))
        try:
            runs = await team_wait.follow(experiments, config, options, on_start=on_start)
            # The worker finalising a sweep's last run settles it too; the first one does.
            await db(settle_sweeps, experiments, config)
        finally:
            db.close()
        return runs
    runs: list[Run] = []
    receiver = otlp_server.open_for(experiments, config)  # HTTP targets' services' spans
    summaries = None
    if receiver is not None and options.get("reporter") is not None:
        summaries = options["reporter"] = AfterSpans(options["reporter"])
    try:
        for experiment in experiments:
            run = await run_experiment(
                experiment,
                config,
                db=db,
                file=relative_file(config, experiment),
                on_start=on_start,
                **options,
            )
            runs.append(run)
        await db(settle_sweeps, experiments, config)
    finally:
        try:
            if receiver is not None:
                try:
                    notices = await db(receiver.finish, config)
                    if summaries is None:
                        otlp_server.log_notices(notices)
                    # Spans that came after a run ended added their model calls' tokens and cost.
                    runs = [await db(lifecycle.results_written, r.id, config) for r in runs]
                finally:
                    if summaries is not None:
                        await db(summaries.release, runs)
        finally:
            db.close()
    return runs


class AfterSpans:
    """A reporter whose runs' summaries wait for their services' spans: while an HTTP target's
    run has a receiver, each run's summary is told once the receiver has waited for the last
    spans (`otlp_server.wait_for_spans`), with the totals those spans changed."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter
        self.finished: list[Run] = []

    def run_started(self, run: Run, experiment: Experiment) -> None:
        self.reporter.run_started(run, experiment)

    def item_finished(self, outcome: Any, done: int, total: int) -> None:
        self.reporter.item_finished(outcome, done, total)

    def run_finished(self, run: Run) -> None:
        self.finished.append(run)

    def release(self, runs: list[Run]) -> None:
        """Each finished run's summary, as `runs` (read again) have it: with what the
        receiver stored of its items' spans (`serviceSpans`)."""
        latest = {run.id: run for run in runs}
        for run in self.finished:
            self.reporter.run_finished(latest.get(run.id, run))
        self.finished = []


def sweeps_of(experiments: list[Experiment]) -> list[str]:
    """The sweeps the runs belong to (created now, or resumed)."""
    return list(dict.fromkeys([e.sweep_id for e in experiments if e.sweep_id]))


# `sweeps` (numpy, the sweeps' statistics) imported only for experiments with variants: an
# ordinary run's numpy is loaded by `prewarm_statistics` while its items' rows are created,
# not on the main thread before (issue 41).
def assign_sweeps(experiments: list[Experiment], config: Config) -> None:
    """`sweeps.assign` of the variant experiments (each gets its sweep); none for the others."""
    if any(e.variant is not None for e in experiments):
        from cobalt_app import sweeps

        sweeps.assign(experiments, file_of=lambda e: relative_file(config, e))


def settle_sweeps(experiments: list[Experiment], config: Config) -> None:
    """`sweeps.settle` of the sweeps the runs belong to, if any."""
    if swept := sweeps_of(experiments):
        from cobalt_app import sweeps

        sweeps.settle(swept, config)


def execute(
    experiments: list[Experiment], config: Config, **options: Unpack[RunOptions]
) -> list[Run]:
    """`launch` for a synchronous door: run it on the engine's loop and wait. Ctrl-C (or
    SIGTERM, SIGHUP) cancels it: an embedded run ends `cancelled` (`aio.Interrupted` names
    it); a team run goes on on the workers (`team_wait.Detached` names it)."""
    started: list[str] = []
    try:
        return aio.run(launch(experiments, config, on_start=started.append, **options))
    except KeyboardInterrupt as exc:
        current = started[-1] if started else None
        if config.team_mode:
            from cobalt_app import team_wait

            if current is not None and not isinstance(exc, team_wait.Detached):
                raise team_wait.Detached(current) from None
            raise
        if isinstance(exc, aio.Interrupted):
            exc.run_id = exc.run_id or current  # the one cancelled
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
    matching[0].sweep_id = run.sweep_id  # a variant's run: its sweep is analysed again
    try:
        result.runs = execute(
            matching[:1], config, reporter=reporter, no_cache=no_cache, resume_run_id=run.id
        )
    except RunBusy as exc:
        raise ResumeError(str(exc)) from None
    return result


def resume_sweep(
    config: Config, sweep_id: str, *, reporter: Reporter | None = None, no_cache: bool = False
) -> LaunchResult:
    """`cobalt run --resume SWEEP`: each variant whose run did not complete is resumed (its
    missing, failed or timed-out items), each variant without a run is run; completed
    variants are left as they are. Then the sweep is analysed again."""
    from cobalt_app import sweeps
    from cobalt_app.models import Run

    sweep = sweeps.sweep_get(sweep_id)
    if not sweep.file:
        raise ResumeError(f"sweep {sweep.id} has no experiment file recorded; it cannot resume")
    experiments, errors, files = load_experiments(config, [str(config.project_dir / sweep.file)])
    result = LaunchResult(load_errors=errors, files=files)
    if errors:
        return result
    by_label = {e.variant.label: e for e in experiments if e.sweep_of == sweep.name and e.variant}
    runs = sweeps.variant_runs(sweep)
    for declared in sweep.variants:
        experiment = by_label.get(declared["label"])
        if experiment is None:
            raise ResumeError(
                f"{sweep.file} no longer declares the variant {declared['label']!r} of "
                f"{sweep.name!r}"
            )
        experiment.sweep_id = sweep.id
        earlier = runs.get(declared["label"])
        if earlier is not None and earlier.status == Run.Status.COMPLETED:
            result.runs.append(earlier)
            continue
        resume_id = earlier.id if earlier is not None else None
        try:
            result.runs += execute(
                [experiment], config, reporter=reporter, no_cache=no_cache, resume_run_id=resume_id
            )
        except RunBusy as exc:
            raise ResumeError(str(exc)) from None
    return result
