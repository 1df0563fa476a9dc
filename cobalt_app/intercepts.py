"""What one item's agent is answered when it calls a tool or an HTTP route; its state and
its budget (`cobalt.intercept` declares the stubs).

`item_scope()` goes around the runner call of `engine.execute_item` (inside the recording
tape's scope, around the trace capture). It sets a context variable holding the item's
`ItemIntercepts`: the item's stubs (its own `fixtures` first, then the experiment's, then
the project's `[[intercept]]`), a counter per stub for `times`, the state object of a
stateful fake environment (`cobalt.state()`) and the item's budget. asyncio tasks copy the
context and the engine runs sync runners in a copy of it, so with 20 items in flight each
call finds its own item's stubs, counters, state and budget.

Tools: `@cobalt.tool` asks `cobalt.intercept.plan_tool` before running; `plan()` (installed
as its handler) answers from a matching stub (`answer_tool`), else from the item's recording
in `--replay` (`tool_tapes`), else lets the tool run (recording its result in `--record`).
HTTP routes: the transports call `match_route(method, url)` and answer with
`route_answer(stub, ...)`.

Budgets: the trace's span processor reports each step as it starts and ends (`step_started`,
`step_ended`); the model call, tool call or step that would pass a limit raises
`BudgetExceeded` inside the agent (an `AgentStopped`: the item's guard is stopped, so its next
HTTP request through an intercepted transport is refused as well) and the item becomes an
error naming the budget, even if the agent swallowed the exception.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cobalt.config import ConfigError, active_config
from cobalt.intercept import (
    FIXTURES_DIR,
    MALFORMED,
    MISSING,
    Stub,
    ToolError,
    ToolPlan,
    as_stubs,
    fixture_path,
    read_fixture,
    reset_state,
    set_state,
    set_tool_handler,
)
from cobalt.run_settings import BudgetSettings
from cobalt.wording import plural
from cobalt_app import framework_tools, runaway, tool_tapes, trace_spans
from cobalt_app.tracebacks import user_traceback

BUDGET_EXCEEDED = "budget exceeded"  # how an item's error starts


class BudgetExceeded(runaway.AgentStopped):
    """Raised inside an agent whose item reached one of its budgets."""


@dataclass
class Usage:
    """An item's counted calls, as its steps start and end."""

    llm_calls: int = 0
    tool_calls: int = 0
    tokens: int = 0
    cost: float = 0.0
    open_llm: set[int] = field(default_factory=set)  # span ids of counted model calls
    open_tool: set[int] = field(default_factory=set)
    reported: set[int] = field(default_factory=set)  # llm spans whose inner call had usage


@dataclass
class ItemIntercepts:
    """One item's stubs, their counters, its state, budget and usage."""

    stubs: list[Stub]
    project_dir: Path
    budget: BudgetSettings = field(default_factory=BudgetSettings)
    state: Any = MISSING
    answered: dict[int, int] = field(default_factory=dict)  # stub position → calls answered
    usage: Usage = field(default_factory=Usage)
    exceeded: str | None = None
    tools: tool_tapes.ToolTape | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _take(self, found: Any) -> Stub | None:
        with self.lock:
            for position, stub in enumerate(self.stubs):
                if not found(stub):
                    continue
                answered = self.answered.get(position, 0)
                if stub.times is not None and answered >= stub.times:
                    continue  # used up: the next declaration, or the real thing
                self.answered[position] = answered + 1
                return stub
        return None

    def match_tool(self, name: str, arguments: dict[str, Any] | None = None) -> Stub | None:
        return self._take(lambda stub: stub.matches_tool(name))

    def match_route(self, method: str, url: str) -> Stub | None:
        return self._take(lambda stub: stub.matches_route(method, url))


_current: contextvars.ContextVar[ItemIntercepts | None] = contextvars.ContextVar(
    "cobalt_item_intercepts", default=None
)


def current() -> ItemIntercepts | None:
    """The running item's intercepts (None outside an item, or with nothing to intercept)."""
    return _current.get()


def match_tool(name: str, arguments: dict[str, Any] | None = None) -> Stub | None:
    """The stub answering this call of tool `name` in the running item (None: none)."""
    item = _current.get()
    return None if item is None else item.match_tool(name, arguments)


def match_route(method: str, url: str) -> Stub | None:
    """The stub answering this HTTP request of the running item (None: none); counted
    against the stub's `times`."""
    item = _current.get()
    return None if item is None else item.match_route(method, url)


# ------------------------------------------------------------------ answers


def _fixture(stub: Stub) -> Any:
    item = _current.get()
    project_dir = item.project_dir if item is not None else active_config().project_dir
    return read_fixture(stub.fixture, where=stub.describe(), project_dir=project_dir)


def answer_tool(stub: Stub, arguments: dict[str, Any], name: str = "") -> Any:
    """The value a tool stub answers, or the exception it raises (its `delay` is waited by
    the caller, sync or async)."""
    called = f"tool {name or stub.pattern}"
    if stub.timeout:
        raise TimeoutError(f"{called} timed out (injected by {stub.describe()})")
    if stub.raises is not None:
        raise ToolError(stub.raises)
    if stub.malformed:
        return MALFORMED
    if stub.fixture is not None:
        return _fixture(stub)
    if stub.fn is not None:
        return stub.fn(**arguments)
    if stub.returns is not MISSING:
        return copy.deepcopy(stub.returns)
    return None


@dataclass(frozen=True)
class RouteAnswer:
    """What a route stub answers an HTTP request: after `delay` seconds, a timeout error of
    the client (`timeout`), or a response."""

    status: int
    headers: dict[str, str]
    content: bytes
    timeout: bool = False
    delay: float = 0.0


def route_answer(stub: Stub, request: Any = None) -> RouteAnswer:
    """The response of a route stub; `request` is what `fn` receives (the transport's
    request object)."""
    if stub.timeout:
        return RouteAnswer(0, {}, b"", timeout=True, delay=stub.delay)
    headers = dict(stub.headers or {})
    status = stub.status or 200
    if stub.returns is not MISSING:  # always a JSON body, even a string
        content = json.dumps(stub.returns, ensure_ascii=False).encode("utf-8")
        headers.setdefault("content-type", "application/json")
        return RouteAnswer(status, headers, content, delay=stub.delay)
    if stub.malformed:
        value: Any = MALFORMED
    elif stub.fixture is not None:
        value = _fixture(stub)
    elif stub.fn is not None:
        value = stub.fn(request)
    elif stub.body is not MISSING:
        value = stub.body
    else:
        value = ""
    if isinstance(value, bytes):
        content = value
    elif isinstance(value, str):
        content = value.encode("utf-8")
        is_json = stub.malformed or (stub.fixture or "").endswith(".json")
        headers.setdefault("content-type", "application/json" if is_json else "text/plain")
    else:
        content = json.dumps(value, ensure_ascii=False).encode("utf-8")
        headers.setdefault("content-type", "application/json")
    return RouteAnswer(status, headers, content, delay=stub.delay)


def plan(name: str, arguments: dict[str, Any]) -> ToolPlan | None:
    """`cobalt.intercept.plan_tool`'s handler: a stub's answer, a replayed result, or the
    tool itself (its result recorded in `--record`)."""
    item = _current.get()
    if item is None:
        return None
    stub = item.match_tool(name, arguments)
    if stub is not None:
        return ToolPlan(
            mark=stub.mark, delay=stub.delay, answer=lambda: answer_tool(stub, arguments, name)
        )
    if item.tools is None:
        return None
    return item.tools.plan(name, arguments)


set_tool_handler(plan)
framework_tools.install()


# ------------------------------------------------------------------ budgets


def _exceed(item: ItemIntercepts, message: str) -> None:
    item.exceeded = item.exceeded or message
    guard = runaway.current_guard()
    if guard is not None and guard.stopped is None:
        guard.stopped = f"{BUDGET_EXCEEDED}: {item.exceeded}"
    raise BudgetExceeded(f"{BUDGET_EXCEEDED}: {item.exceeded}; Cobalt stopped this item's agent")


def step_started(span: Any) -> None:
    """A span started in the running item: counted against its budget (the traces' span
    processor calls this); raises `BudgetExceeded` for a call past a limit."""
    item = _current.get()
    if item is None or not item.budget.any:
        return
    kind = trace_spans.kind_of(span.attributes or {})
    parent = span.parent.span_id if span.parent is not None else None
    budget, usage = item.budget, item.usage
    with item.lock:
        if kind == "llm" and parent not in usage.open_llm:
            _check_usage(item)
            if budget.max_llm_calls is not None and usage.llm_calls >= budget.max_llm_calls:
                _exceed(item, _calls("max_llm_calls", usage.llm_calls, "model call"))
            usage.llm_calls += 1
            usage.open_llm.add(span.context.span_id)
        elif kind == "tool" and parent not in usage.open_tool:
            _check_usage(item)
            if budget.max_tool_calls is not None and usage.tool_calls >= budget.max_tool_calls:
                _exceed(item, _calls("max_tool_calls", usage.tool_calls, "tool call"))
            usage.tool_calls += 1
            usage.open_tool.add(span.context.span_id)
        elif kind == "llm":  # the SDK's call inside a framework's: one call
            usage.open_llm.add(span.context.span_id)


def _calls(limit: str, made: int, noun: str) -> str:
    return f"{limit}={made} reached ({plural(made, noun)} made)"


def _check_usage(item: ItemIntercepts) -> None:
    budget, usage = item.budget, item.usage
    if budget.max_tokens is not None and usage.tokens >= budget.max_tokens:
        _exceed(item, f"max_tokens={budget.max_tokens} reached ({usage.tokens} tokens used)")
    if budget.max_cost is not None and usage.cost >= budget.max_cost:
        _exceed(item, f"max_cost=${budget.max_cost:g} reached (${usage.cost:.4f} spent)")


def step_ended(span: Any) -> None:
    """A span of the running item ended: a model call's tokens and cost are added."""
    item = _current.get()
    if item is None or not item.budget.any:
        return
    span_id = span.context.span_id
    usage = item.usage
    with item.lock:
        usage.open_tool.discard(span_id)
        if span_id not in usage.open_llm:
            return
        usage.open_llm.discard(span_id)
        if span_id in usage.reported:  # its inner call's usage is counted already
            usage.reported.discard(span_id)
            return
        step = trace_spans.step_of(span, dict(span.attributes or {}), span.start_time, 10, ())
        if step["inputTokens"] is None and step["outputTokens"] is None:
            return
        usage.tokens += (step["inputTokens"] or 0) + (step["outputTokens"] or 0)
        usage.cost += step["cost"] or 0.0
        if span.parent is not None and span.parent.span_id in usage.open_llm:
            usage.reported.add(span.parent.span_id)


# ------------------------------------------------------------------ around one item


@contextlib.contextmanager
def item_scope(
    env: Any,
    experiment: Any,
    item: dict[str, Any],
    outcome: Any,
    budget: BudgetSettings | None = None,
) -> Iterator[ItemIntercepts | None]:
    """The item's stubs, state and budget for the block (see the module). Afterwards: the
    final state goes to the output's metadata (`state`), a budget reached makes the item an
    error. A fixture that cannot be read makes the item an error before its agent runs."""
    own = item.get("fixtures") if isinstance(item, dict) else None
    project_dir = getattr(env, "project_dir", None) or active_config().project_dir
    try:
        stubs = [
            *as_stubs(own, "the item's fixtures"),
            *experiment.intercept,
            *getattr(env, "intercept", ()),
        ]
        for stub in stubs:
            if stub.fixture is not None:
                _fixture_exists(stub, project_dir)
    except ConfigError as exc:
        outcome.status, outcome.error = "error", str(exc)
        yield None
        return
    budget = budget or BudgetSettings()
    if not stubs and experiment.state is None and not budget.any and tool_tapes.idle():
        yield None  # most items of most runs: nothing to intercept
        return
    scope = ItemIntercepts(stubs=stubs, project_dir=project_dir, budget=budget)
    scope.tools = tool_tapes.for_item()
    if experiment.state is not None:
        try:
            scope.state = experiment.state(item)
        except Exception as exc:
            outcome.status = "error"
            outcome.error = f"the experiment's state(item) raised {type(exc).__name__}: {exc}"
            outcome.traceback = user_traceback(exc)
            yield None
            return
    token = _current.set(scope)
    state_token = set_state(scope.state) if experiment.state is not None else None
    try:
        yield scope
    finally:
        if state_token is not None:
            reset_state(state_token)
        _current.reset(token)
    _after(scope, outcome)


def _fixture_exists(stub: Stub, project_dir: Path) -> None:
    path = fixture_path(stub.fixture, where=stub.describe(), project_dir=project_dir)
    if not path.is_file():
        raise ConfigError(
            f"{stub.describe()}: fixture file {path} does not exist (fixtures live in the "
            f"project's {FIXTURES_DIR}/ folder)."
        )


def _after(scope: ItemIntercepts, outcome: Any) -> None:
    if scope.exceeded:
        outcome.status = "error"
        outcome.error = f"{BUDGET_EXCEEDED}: {scope.exceeded} (the agent was stopped)"
        outcome.traceback = ""
    if scope.state is not MISSING and outcome.metadata is not None:
        outcome.metadata = {**(outcome.metadata or {}), "state": _plain(scope.state)}


def _plain(value: Any) -> Any:
    """The state as JSON can hold it (sets as sorted lists, objects as their text)."""
    try:
        return json.loads(json.dumps(value, default=_fallback, ensure_ascii=False))
    except (TypeError, ValueError):
        return repr(value)


def _fallback(value: Any) -> Any:
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if hasattr(value, "__dict__"):
        return vars(value)
    return str(value)


def marks(steps: list[dict[str, Any]]) -> dict[str, int]:
    """How many steps of a trace were stubbed, injected or replayed."""
    counted: dict[str, int] = {}
    for step in steps:
        mark = step.get("intercepted")
        if mark:
            counted[mark] = counted.get(mark, 0) + 1
    return counted
