"""`experiment()`: declare an experiment; run it when the file is executed directly.

Imported by `cobalt run` (or a worker), an experiment file only *registers* its experiments:
the loader collects them. Run as `python my.cobalt.py`, the same call executes the experiment
on the embedded default and returns an `ExperimentReport`.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from cobalt.dataset import Dataset
from cobalt.evaluator import Evaluator


@dataclass(frozen=True)
class RunContext:
    """What a runner receives: `ctx.item`, `ctx.index`, `ctx.run_index`, and `ctx.dataset`,
    the experiment's whole dataset."""

    item: dict[str, Any]
    index: int
    run_index: int
    item_key: str
    dataset: Dataset | None = None


@dataclass
class Experiment:
    name: str
    dataset: Dataset
    runner: Callable[[RunContext], Any]
    evaluators: list[Evaluator] = field(default_factory=list)
    runs: int = 1
    concurrency: int | None = None
    timeout: float | None = None
    tags: list[str] = field(default_factory=list)
    thresholds: dict[str, Any] | None = None
    on_progress: Callable[[int, int], Any] | None = None  # (done, total), as items finish
    file: str | None = None
    line: int | None = None  # of the `experiment(...)` call, for messages that point at it

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.runner)

    def settings(self, *, default_concurrency: int, default_timeout: float) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "concurrency": self.concurrency or default_concurrency,
            "timeout": self.timeout or default_timeout,
        }


_collector: contextvars.ContextVar[list[Experiment] | None] = contextvars.ContextVar(
    "cobalt_experiment_collector", default=None
)


@contextmanager
def collecting() -> Iterator[list[Experiment]]:
    """While active, `experiment()` registers into the yielded list instead of running."""
    found: list[Experiment] = []
    token = _collector.set(found)
    try:
        yield found
    finally:
        _collector.reset(token)


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
) -> Any:
    """Declare an experiment: as a call with a runner, or as a decorator without one.

    `on_progress(done, total)` (sync or async) is called as items finish; an exception in it
    is logged once and never stops the run."""
    if runner is None:

        def decorator(fn: Callable[[RunContext], Any]) -> Any:
            return experiment(
                name,
                dataset,
                fn,
                evaluators=evaluators,
                runs=runs,
                concurrency=concurrency,
                timeout=timeout,
                tags=tags,
                thresholds=thresholds,
                on_progress=on_progress,
            )

        return decorator

    _check(name, dataset, runner, runs, concurrency, timeout)
    if on_progress is not None and not callable(on_progress):
        raise TypeError(
            f"experiment {name!r}: `on_progress` must be a function (done, total), "
            f"not {type(on_progress).__name__}."
        )
    file, line = _caller()
    definition = Experiment(
        name=name,
        dataset=dataset,
        runner=runner,
        evaluators=as_evaluators(name, evaluators),
        runs=runs,
        concurrency=concurrency,
        timeout=timeout,
        tags=list(tags or []),
        thresholds=thresholds,
        on_progress=on_progress,
        file=file,
        line=line,
    )
    names = [e.name for e in definition.evaluators]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise ValueError(f"experiment {name!r}: evaluator names must be unique: {duplicates}")
    found = _collector.get()
    if found is not None:
        found.append(definition)
        return definition
    from cobalt._direct import run_directly

    return run_directly(definition)


def as_evaluators(experiment: str, given: Any) -> list[Evaluator]:
    """`Evaluator`s, or the original's dict form (`{"name": ..., "type": ..., ...}`)."""
    if given is None:
        return []
    if isinstance(given, Evaluator | dict) or not isinstance(given, list | tuple):
        raise TypeError(
            f"experiment {experiment!r}: `evaluators` must be a list of Evaluator(...) or of "
            f"dicts of their options, not {type(given).__name__}."
        )
    found: list[Evaluator] = []
    for index, value in enumerate(given):
        if isinstance(value, Evaluator):
            found.append(value)
        elif isinstance(value, dict):
            found.append(Evaluator.from_dict(value, where=f"evaluators[{index}]"))
        else:
            raise TypeError(
                f"experiment {experiment!r}: evaluators[{index}] is a {type(value).__name__}; "
                'pass Evaluator(name="...", ...) or a dict such as {"name": "exact", '
                '"type": "exact-match"}.'
            )
    return found


def _check(
    name: str,
    dataset: Any,
    runner: Any,
    runs: int,
    concurrency: int | None,
    timeout: float | None,
) -> None:
    if not isinstance(name, str) or not name.strip():
        raise ValueError("experiment() needs a non-empty name.")
    if not isinstance(dataset, Dataset):
        raise TypeError(f"experiment {name!r}: `dataset` must be a cobalt.Dataset.")
    if not callable(runner):
        raise TypeError(f"experiment {name!r}: the runner must be a function.")
    if not isinstance(runs, int) or runs < 1:
        raise ValueError(f"experiment {name!r}: `runs` must be at least 1.")
    if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
        raise ValueError(f"experiment {name!r}: `concurrency` must be at least 1.")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"experiment {name!r}: `timeout` must be above 0 seconds.")


def _caller() -> tuple[str | None, int | None]:
    frame = inspect.currentframe()
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.endswith(("cobalt/experiment.py", "cobalt\\experiment.py")):
            return filename, frame.f_lineno
        frame = frame.f_back
    return None, None
