"""Create, resume, cancel and finalise a run: the same functions in every mode.

`finalise` is the one way a run ends. Whoever gets there — the lane that records the last
item, `cobalt cancel` (or the API, MCP, the dashboard), an embedded run stopped by Ctrl-C or
a crash, the team sweeper — it stores the same summary, writes the results file, settles the
run's sweep when it was its last variant (`sweeps.settle`) and sends the webhooks, whether
anyone waits for the run or not.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Any

from django.db import OperationalError, transaction

from cobalt import results_file
from cobalt.config import Config, active_config
from cobalt.experiments import Experiment
from cobalt.run_settings import BUDGET_KEYS, RunSettings
from cobalt_app import aio, calibration, results, services, storable, webhooks
from cobalt_app.models import ItemResult, Run
from cobalt_app.runs.claims import RETRY_STATUSES, UNFINISHED

DEADLOCK_RETRIES = 3

logger = logging.getLogger("cobalt.runs")

_deliveries: set[concurrent.futures.Future] = set()  # webhooks on their way


def run_settings(
    experiment: Experiment, config: Config, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The run's settings: the experiment's, the project's defaults, then the overrides given
    (`--concurrency`, an API or MCP argument); None means not given."""
    project = RunSettings.from_config(config)
    settings = experiment.settings(
        default_concurrency=project.concurrency, default_timeout=project.timeout
    )
    settings["timeoutGrace"] = project.timeout_grace  # team workers follow the run's
    for name, key in BUDGET_KEYS.items():  # `[budget]`, unless the experiment set its own
        if key not in settings and getattr(project.budget, name) is not None:
            settings[key] = getattr(project.budget, name)
    settings.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return settings


def create(
    experiment: Experiment,
    config: Config,
    *,
    mode: str = Run.Mode.EMBEDDED,
    overrides: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    tags: list[str] | None = None,
    file: str = "",
) -> Run:
    """A new run with its item rows, all pending; `extra` joins its settings (team: queue).
    The judges' keys (`calibration.judge_keys`) are stored with it: only here are the
    project's `[judge]` defaults, which pick a judge's model, known."""
    described = [e.describe() for e in experiment.evaluators]
    keys = {
        "judgeKeys": calibration.judge_keys(described, config.get("judge")),
        "calibration": RunSettings.from_config(config).calibration.as_dict(),
    }
    return services.run_create(
        experiment=experiment,
        settings={**run_settings(experiment, config, overrides), **keys, **(extra or {})},
        file=file,
        tags=tags or [],
        mode=mode,
        project_dir=config.project_dir,
    )


def resume(
    run_id: str, *, grace: float, mode: str = Run.Mode.EMBEDDED, extra: dict[str, Any] | None = None
) -> Run:
    """Take an earlier run over (`RunBusy` while another process executes it) and put its
    failed, timed-out, cancelled and abandoned items back to pending."""
    with transaction.atomic():
        run = services.run_resume(run_id, grace=grace)
        services.item_reset_for_retry(run.id, [*RETRY_STATUSES, ItemResult.Status.RUNNING])
        if mode == Run.Mode.TEAM:  # queued until a worker claims an item
            run.config = {**run.config, **(extra or {})}
            Run.objects.filter(id=run.id).update(
                status=Run.Status.QUEUED,
                mode=mode,
                config=run.config,
                started_at=None,
                finished_at=None,
                failure="",
            )
    return Run.objects.get(id=run.id)


def cancel(run_id: str, config: Config | None = None) -> tuple[Run, int]:
    """Stop a run from anywhere: unfinished items become `cancelled` and the run is finalised
    `cancelled`; the lanes executing it notice between items (and the embedded process at its
    next heartbeat) and stop. Returns (the run, how many items were cancelled)."""
    for attempt in range(DEADLOCK_RETRIES):
        try:
            with transaction.atomic():
                run = Run.objects.select_for_update().get(id=run_id)
                if run.is_finished:
                    return run, 0
                cancelled = services.run_cancel_pending(run.id)
                if run.started_at is None:
                    Run.objects.filter(id=run_id).update(started_at=run.created_at)
            break
        except OperationalError as exc:
            # A worker renewing the leases of items this cancels may lock them in another
            # order; PostgreSQL then aborts one of the two, and trying again is the remedy.
            if "deadlock" not in str(exc) or attempt == DEADLOCK_RETRIES - 1:
                raise
    run = finalise(run_id, status=Run.Status.CANCELLED, config=config) or Run.objects.get(id=run_id)
    if run.mode == Run.Mode.TEAM:
        from cobalt_app.team_broker import announce_progress

        announce_progress([run.id])
    return run, cancelled


def finish_if_done(run_id: str, *, config: Config | None = None) -> Run | None:
    """Finalise the run `completed` when no item is left unfinished; only one caller does."""
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(id=run_id).first()
        if run is None or run.is_finished:
            return None
        if ItemResult.objects.filter(run_id=run_id, status__in=UNFINISHED).exists():
            return None
        if run.started_at is None:
            Run.objects.filter(id=run_id).update(started_at=run.created_at)
    return finalise(run_id, status=Run.Status.COMPLETED, config=config)


def finalise(
    run_id: str, *, status: str, failure: str = "", config: Config | None = None
) -> Run | None:
    """End the run: store its final status and summary and write its results file (one
    commit: whoever sees the run ended sees its file), then send the webhooks (on the
    process's long-lived loop; `webhooks_sent` waits for them). None when it was finalised
    already — by a cancel from elsewhere, or by the lane that recorded its last item."""
    config = config or active_config()
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(id=run_id).first()
        if run is None or (run.is_finished and run.summary):
            return None
        if failure:
            Run.objects.filter(id=run_id).update(failure=storable.clean_message(failure))
        results.run_finalise(run_id, status=status)
        run = results_written(run_id, config)
    if run.sweep_id:
        _sweep_settled(run.sweep_id, config)
    _send_webhooks(config, run)
    return run


def _sweep_settled(sweep_id: str, config: Config) -> None:
    """A variant's run ended: when it was the sweep's last, analyse and store the sweep
    (`sweeps.settle`). A failure is logged; the run's end stands."""
    from cobalt_app import sweeps  # numpy and the statistics: only for a sweep's runs

    try:
        sweeps.settle([sweep_id], config)
    except Exception:  # noqa: BLE001 - the sweep's page still computes it when read
        logger.exception("could not analyse sweep %s", sweep_id)


def results_written(run_id: str, config: Config) -> Run:
    """`write_results`; a file that cannot be written is logged, and the run still ends."""
    try:
        return write_results(run_id, config)
    except Exception:  # noqa: BLE001 - a full disk must not leave the run unfinished
        logger.exception("could not write the results file of run %s", run_id)
        return Run.objects.get(id=run_id)


def write_results(run_id: str, config: Config) -> Run:
    """The results file, in the finalising process's project results folder and in the form
    `[results]` gives a run of its size; the run remembers its path."""
    run = Run.objects.get(id=run_id)
    form = results_file.choose(config.get("results"), run.total_items)
    path = results.write_results_file(run, config.results_dir, form)
    Run.objects.filter(id=run_id).update(results_path=str(path))
    run.results_path = str(path)
    return run


def _send_webhooks(config: Config, run: Run) -> None:
    if not webhooks.subscribers(config, webhooks.RUN_EVENTS.get(run.status, "")):
        return
    future = asyncio.run_coroutine_threadsafe(
        webhooks.notify_run(config, run), aio.loop_thread().loop
    )
    _deliveries.add(future)
    future.add_done_callback(_deliveries.discard)


def webhooks_sent(timeout: float = 60) -> None:
    """Wait for the webhooks of the runs finalised by this process (before it exits)."""
    if _deliveries:
        concurrent.futures.wait(list(_deliveries), timeout=timeout)


async def webhooks_delivered() -> None:
    """`webhooks_sent` from a coroutine on the long-lived loop."""
    if _deliveries:
        await asyncio.gather(*(asyncio.wrap_future(f) for f in list(_deliveries)))
