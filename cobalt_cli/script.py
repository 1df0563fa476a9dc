"""`cobalt.experiment(...)`: declare an experiment; run it when the file is executed directly.

Imported by `cobalt run` (or a worker, or the pytest plugin), an experiment file only
*registers* its experiments: the loader collects them (`cobalt.experiments.collecting`) and
this returns the `Experiment`. Run as `python my.cobalt.py`, in a notebook cell or a script,
the same call executes the experiment right away, on the embedded default, and
returns an `ExperimentReport`.

Where an event loop is already running in this thread (Jupyter, IPython, `asyncio.run`), the
run happens on a helper thread while this one waits: Django's database layer refuses to be
called from a thread with a running loop, and Cobalt's own loop runs the agent either way.
`experiment(...)` then returns the `ExperimentReport` as usual, and `await experiment(...)`
works as well (the report is awaitable). Interrupting the cell (Ctrl-C, the stop button)
cancels the run the way Ctrl-C does on a terminal.

`cobalt` re-exports `experiment` on first use; this module imports the engine only when a run
starts, so an experiment file that is only collected pays for nothing more.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cobalt.callers import on_call_path
from cobalt.dataset import Dataset
from cobalt.evaluator import Evaluator
from cobalt.experiments import RunContext, collect, define

on_call_path(__name__)  # `experiment(...)` points at the user's line, not at this module


def experiment(
    name: str,
    dataset: Dataset,
    runner: Callable[[RunContext], Any] | None = None,
    *,
    evaluators: list[Evaluator] | None = None,
    runs: int = 1,
    concurrency: int | None = None,
    timeout: float | None = None,
    tags: list[str] | None = None,
    thresholds: dict[str, Any] | None = None,
    on_progress: Callable[[int, int], Any] | None = None,
    conversation: bool = False,
    max_turns: int = 10,
    turn_timeout: float | None = None,
    intercept: list[Any] | None = None,
    state: Callable[[dict[str, Any]], Any] | None = None,
    max_llm_calls: int | None = None,
    max_tool_calls: int | None = None,
    max_tokens: int | None = None,
    max_cost: float | None = None,
) -> Any:
    """Declare an experiment: as a call with a runner, or as a decorator without one.

    `on_progress(done, total)` (sync or async) is called as items finish; an exception in it
    is logged once and never stops the run. `conversation=True`: each item is a conversation
    (its `turns`, or a simulated `user`), the runner is called once per turn with
    `ctx.messages` and returns the next reply. `intercept=[cobalt.stub(...)]`: what tools
    and HTTP routes answer; `state=lambda item: ...`: each item's state (`cobalt.state()`);
    `max_llm_calls`, `max_tool_calls`, `max_tokens`, `max_cost`: each item's budget."""
    options: dict[str, Any] = {
        "evaluators": evaluators,
        "runs": runs,
        "concurrency": concurrency,
        "timeout": timeout,
        "tags": tags,
        "thresholds": thresholds,
        "on_progress": on_progress,
        "conversation": conversation,
        "max_turns": max_turns,
        "turn_timeout": turn_timeout,
        "intercept": intercept,
        "state": state,
        "max_llm_calls": max_llm_calls,
        "max_tool_calls": max_tool_calls,
        "max_tokens": max_tokens,
        "max_cost": max_cost,
    }
    if runner is None:

        def decorator(fn: Callable[[RunContext], Any]) -> Any:
            return experiment(name, dataset, fn, **options)

        return decorator

    definition = define(name, dataset, runner, **options)
    if collect(definition):
        return definition
    return run_directly(definition)


def run_directly(definition: Any) -> Any:
    if _loop_running():
        return _on_helper_thread(definition)
    return _run(definition)


def _run(definition: Any, *, in_notebook: bool = False) -> Any:
    from cobalt.config import load_config
    from cobalt.report import ExperimentReport
    from cobalt_project import bootstrap

    # The project holding the experiment file, wherever Python was started from.
    config = bootstrap.setup(load_config(near=definition.file))
    from cobalt_app import launcher, results
    from cobalt_app.preflight import PreflightError
    from cobalt_cli import interrupts

    reporter = _notebook_reporter() if in_notebook else _console_reporter()
    restore_signals = interrupts.raise_on_signals()  # SIGTERM, SIGHUP: cancelled, as Ctrl-C
    try:
        (run,) = launcher.execute([definition], config, reporter=reporter)
    except PreflightError as exc:
        if not _is_script(definition.file):
            raise  # imported (a notebook, another script): the caller decides
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt as exc:
        if not _is_script(definition.file):
            raise
        print(f"\n{interrupts.hint(exc)}", file=sys.stderr)
        raise SystemExit(interrupts.exit_code(exc)) from None
    finally:
        restore_signals()
    return ExperimentReport(results.run_results(run), results_path=run.results_path or None)


def _on_helper_thread(definition: Any) -> Any:
    from cobalt_app import aio

    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["report"] = _run(definition, in_notebook=_in_notebook())
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            outcome["error"] = exc

    helper = threading.Thread(target=work, name="cobalt-experiment", daemon=True)
    helper.start()
    try:
        while helper.is_alive():
            helper.join(0.1)
    except KeyboardInterrupt:
        aio.loop_thread().interrupt()  # the run is cancelled and finalised, then we go on
        helper.join(60)
        error = outcome.get("error")
        if isinstance(error, KeyboardInterrupt):
            from cobalt_cli import interrupts

            print(f"\n{interrupts.hint(error)}", file=sys.stderr)
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["report"]


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _in_notebook() -> bool:
    """A Jupyter kernel (not a terminal IPython): progress as one updating line."""
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return type(shell).__name__ == "ZMQInteractiveShell"


def _console_reporter() -> Any:
    from cobalt_cli.reporter import ConsoleReporter

    reporter = ConsoleReporter()
    reporter.banner()
    return reporter


def _notebook_reporter() -> Any:
    from cobalt_cli.notebook import NotebookProgress

    return NotebookProgress()


def _is_script(file: str | None) -> bool:
    """Whether the experiment is declared in the file Python was started with."""
    return (
        bool(file and sys.argv and sys.argv[0])
        and Path(file).resolve() == Path(sys.argv[0]).resolve()
    )
