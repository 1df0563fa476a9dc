"""`Experiment`: what `cobalt.experiment(...)` declares, and how a loader collects it.

`define()` checks the arguments and builds the `Experiment`; `collect()` hands it to the loader
that is importing the file (`cobalt run`, a worker, the pytest plugin: see `collecting()`).
The user's `cobalt.experiment(...)` is the door above both (`cobalt_cli.script`): collected,
it returns the definition; otherwise (`python my.cobalt.py`, a notebook) it runs it.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from cobalt.callers import in_call_path
from cobalt.dataset import Dataset
from cobalt.evaluator import Evaluator
from cobalt.intercept import Stub, as_stubs
from cobalt.run_settings import BUDGET_KEYS, BUDGETS, check_budget
from cobalt.variants import Variant, declare, default_label


@dataclass(frozen=True)
class RunContext:
    """What a runner receives: `ctx.item`, `ctx.index`, `ctx.run_index`, `ctx.dataset` (the
    experiment's whole dataset); in a conversation also `ctx.messages` (so far, the user's
    latest last) and `ctx.turn` (1 for the first); in a sweep `ctx.variant`, the values of
    the variant being run (`ctx.variant["model"]`; `{}` outside a sweep)."""

    item: dict[str, Any]
    index: int
    run_index: int
    item_key: str
    dataset: Dataset | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    turn: int = 0
    variant: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Conversation:
    """`experiment(..., conversation=True)`: Cobalt plays the user, turn after turn."""

    max_turns: int = 10
    turn_timeout: float | None = None  # seconds per assistant turn; the item's timeout
    # covers the whole conversation


_async_runners: dict[int, tuple[Any, bool]] = {}  # id(runner) → (runner, is it async)


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
    conversation: Conversation | None = None
    # Variants (`cobalt.variants`): declared ones, or, once expanded, the one this runs.
    variants: list[Variant] = field(default_factory=list)
    default_variant: dict[str, Any] | None = None
    variant: Variant | None = None
    sweep_of: str | None = None  # the declaring experiment's name
    sweep_id: str | None = None  # set by the launcher for the sweep being run
    intercept: list[Stub] = field(default_factory=list)  # `cobalt.stub(...)` declarations
    state: Callable[[dict[str, Any]], Any] | None = None  # an item's state (`cobalt.state()`)
    budget: dict[str, Any] = field(default_factory=dict)  # max_llm_calls, ... given here

    @property
    def is_async(self) -> bool:
        """Whether the runner is async (asked for every item: the answer is kept per runner)."""
        runner = self.runner
        known = _async_runners.get(id(runner))
        if known is not None and known[0] is runner:
            return known[1]
        answer = inspect.iscoroutinefunction(runner)
        if not answer:
            # A callable object whose `__call__` is async (an HTTP target, `cobalt.targets`).
            call = inspect.getattr_static(type(runner), "__call__", None)
            answer = not inspect.isfunction(runner) and inspect.iscoroutinefunction(call)
        if len(_async_runners) > 1024:
            _async_runners.clear()
        _async_runners[id(runner)] = (runner, answer)  # the runner kept: its id stays its own
        return answer

    def settings(self, *, default_concurrency: int, default_timeout: float) -> dict[str, Any]:
        settings: dict[str, Any] = {
            "runs": self.runs,
            "concurrency": self.concurrency or default_concurrency,
            "timeout": self.timeout or default_timeout,
        }
        if self.conversation is not None:
            settings["conversation"] = {
                "maxTurns": self.conversation.max_turns,
                "turnTimeout": self.conversation.turn_timeout,
            }
        for name, value in self.budget.items():
            if value is not None:
                settings[BUDGET_KEYS[name]] = value
        return settings


_collector: contextvars.ContextVar[list[Experiment] | None] = contextvars.ContextVar(
    "cobalt_experiment_collector", default=None
)


@contextmanager
def collecting() -> Iterator[list[Experiment]]:
    """While active, `cobalt.experiment()` registers into the yielded list (`collect()`)
    instead of running."""
    found: list[Experiment] = []
    token = _collector.set(found)
    try:
        yield found
    finally:
        _collector.reset(token)


def define(
    name: str,
    dataset: Dataset,
    runner: Callable[[RunContext], Any],
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
    variants: Any = None,
    default_variant: dict[str, Any] | None = None,
    intercept: list[Any] | None = None,
    state: Callable[[dict[str, Any]], Any] | None = None,
    max_llm_calls: int | None = None,
    max_tool_calls: int | None = None,
    max_tokens: int | None = None,
    max_cost: float | None = None,
) -> Experiment:
    """The checked `Experiment` of `cobalt.experiment(...)`'s arguments.

    It remembers the file and line of the user's call: the first frame outside Cobalt's call
    path (this module and the door that wraps it: `cobalt.callers`)."""
    _check(name, dataset, runner, runs, concurrency, timeout)
    if on_progress is not None and not callable(on_progress):
        raise TypeError(
            f"experiment {name!r}: `on_progress` must be a function (done, total), "
            f"not {type(on_progress).__name__}."
        )
    if conversation:
        _check_conversation(name, dataset, max_turns, turn_timeout)
    declared = [] if variants is None else declare(name, variants)
    _check_default(name, declared, default_variant)
    if state is not None and not callable(state):
        raise TypeError(
            f"experiment {name!r}: `state` must be a function of the item returning its state "
            f"(e.g. state=lambda item: {{'orders': dict(item['orders'])}}), not "
            f"{type(state).__name__}."
        )
    budget = dict(zip(BUDGETS, (max_llm_calls, max_tool_calls, max_tokens, max_cost), strict=True))
    for key, value in budget.items():
        check_budget(key, value, f"experiment {name!r}")
    stubs = as_stubs(intercept, f"experiment {name!r}: intercept")
    _check_fixtures(name, dataset)
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
        conversation=Conversation(max_turns, turn_timeout) if conversation else None,
        variants=declared,
        default_variant=dict(default_variant) if default_variant else None,
        intercept=stubs,
        state=state,
        budget={k: v for k, v in budget.items() if v is not None},
    )
    names = [e.name for e in definition.evaluators]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise ValueError(f"experiment {name!r}: evaluator names must be unique: {duplicates}")
    return definition


def collect(definition: Experiment) -> bool:
    """Register `definition` with the loader importing its file; False when none is (the file
    was executed directly, or imported by a script or a notebook)."""
    found = _collector.get()
    if found is None:
        return False
    found.append(definition)
    return True


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


def _check_default(name: str, declared: list[Variant], default: Any) -> None:
    if default is None:
        return
    if not declared:
        raise ValueError(f"experiment {name!r}: `default_variant` needs `variants`.")
    if not isinstance(default, dict) or not default:
        raise TypeError(
            f"experiment {name!r}: `default_variant` must be a dict such as {{'model': 'a'}}."
        )
    label = default_label(declared, default)
    found = [v for v in declared if v.label == label]
    if not all(found[0].values.get(k) == v for k, v in default.items()):
        raise ValueError(
            f"experiment {name!r}: `default_variant` {default!r} matches none of the variants "
            f"({', '.join(v.label for v in declared)})."
        )


def _check_fixtures(name: str, dataset: Dataset) -> None:
    """Each item's `fixtures` (stubs of its own, `cobalt.intercept.parse_stub`) are checked
    when the experiment is declared: a mistake names the item, not a failure at run time."""
    for position, item in enumerate(dataset, start=1):
        if isinstance(item, dict) and item.get("fixtures") is not None:
            as_stubs(item["fixtures"], f"experiment {name!r}, item #{position}: fixtures")


def _check_conversation(name: str, dataset: Dataset, max_turns: Any, turn_timeout: Any) -> None:
    """Each item of a conversation experiment has `turns` (the user's messages) or `user`
    (a simulated user: `goal`, optional `persona`, `max_turns`, `stop_when`)."""
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"experiment {name!r}: `max_turns` must be at least 1.")
    if turn_timeout is not None and (
        isinstance(turn_timeout, bool)
        or not isinstance(turn_timeout, int | float)
        or turn_timeout <= 0
    ):
        raise ValueError(f"experiment {name!r}: `turn_timeout` must be above 0 seconds.")
    for position, item in enumerate(dataset, start=1):
        turns, user = item.get("turns"), item.get("user")
        if turns is not None:
            if (
                not isinstance(turns, list)
                or not turns
                or not all(isinstance(t, str) and t.strip() for t in turns)
            ):
                raise ValueError(
                    f"experiment {name!r}, item #{position}: `turns` must be a non-empty list "
                    "of the user's messages (strings)."
                )
        elif isinstance(user, dict):
            if not isinstance(user.get("goal"), str) or not user["goal"].strip():
                raise ValueError(
                    f"experiment {name!r}, item #{position}: a simulated `user` needs a `goal`."
                )
        else:
            raise ValueError(
                f"experiment {name!r}, item #{position}: a conversation item needs `turns` "
                '(["first user message", ...]) or `user` ({"goal": "...", "persona": "..."}).'
            )


def _caller() -> tuple[str | None, int | None]:
    frame = inspect.currentframe()
    while frame is not None:
        filename = frame.f_code.co_filename
        if not in_call_path(frame):
            return filename, frame.f_lineno
        frame = frame.f_back
    return None, None
