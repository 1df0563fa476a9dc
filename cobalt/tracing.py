"""Steps no instrumentation sees, in an item's trace: `cobalt.span` and `@cobalt.tool`.

    with cobalt.span("search", kind="retrieval", input=query) as s:
        s.output = index.search(query)

    @cobalt.tool
    def get_weather(city: str) -> str: ...

Both make ordinary OpenTelemetry spans on the global tracer provider, so a user's own
exporter sees them too; outside a Cobalt run they cost next to nothing and record nothing
unless the user set up tracing. An exception inside marks the step as failed (and is raised
again); `kind` is one of `llm`, `tool`, `agent`, `retrieval`, `other`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from opentelemetry import context, trace
from opentelemetry.trace import Status, StatusCode

from cobalt import intercept

KINDS = ("llm", "tool", "agent", "retrieval", "other")
F = TypeVar("F", bound=Callable[..., Any])


def as_text(value: Any) -> str:
    """A span attribute's text: a string as it is, anything else as JSON (else its repr)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


class Step:
    """The open span of `cobalt.span`: set `output`, `model` or token counts on it."""

    def __init__(self, span: trace.Span) -> None:
        self._span = span
        self._output: Any = None

    @property
    def output(self) -> Any:
        return self._output

    @output.setter
    def output(self, value: Any) -> None:
        self._output = value
        self._span.set_attribute("cobalt.output", as_text(value))

    def set(
        self,
        *,
        model: str | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> None:
        """Model and token counts of a model call made without an instrumented SDK."""
        if model is not None:
            self._span.set_attribute("llm.model_name", model)
        if input_tokens is not None:
            self._span.set_attribute("cobalt.input_tokens", int(input_tokens))
        if output_tokens is not None:
            self._span.set_attribute("cobalt.output_tokens", int(output_tokens))

    def fail(self, error: str) -> None:
        """Mark the step as failed without raising."""
        self._span.set_status(Status(StatusCode.ERROR, error))


class span:  # noqa: N801 - used as a function: `with cobalt.span(...) as step`
    """A step of the agent's trace around the block (`input` and `s.output` are stored).

    Started and made current on the tracer of the global provider directly (a class, not a
    generator): the API's proxy tracer and its context managers doubled what a span cost."""

    __slots__ = ("_name", "_kind", "_input", "_span", "_token")

    def __init__(self, name: str, *, kind: str = "other", input: Any = None) -> None:
        self._name, self._kind, self._input = name, kind, input

    def __enter__(self) -> Step:
        if self._kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {self._kind!r}")
        attributes = {"cobalt.kind": self._kind, "cobalt.name": self._name}
        if self._input is not None:
            attributes["cobalt.input"] = as_text(self._input)
        self._span = _tracer().start_span(
            self._name,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        )
        self._token = context.attach(trace.set_span_in_context(self._span))
        return Step(self._span)

    def __exit__(self, kind: Any, exc: BaseException | None, traceback: Any) -> None:
        try:
            if exc is not None:
                self._span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        finally:
            context.detach(self._token)
            self._span.end()


def _tracer() -> trace.Tracer:
    """Cobalt's tracer on the global provider, asked again when that provider changes."""
    provider = trace.get_tracer_provider()
    if provider is not _provider_tracer[0]:
        _provider_tracer[:] = [provider, provider.get_tracer("cobalt")]
    return _provider_tracer[1]


_provider_tracer: list[Any] = [None, None]


def tool(function: F | None = None, *, name: str | None = None) -> Any:
    """Record every call of an agent's tool function as a `tool` step (sync or async):
    its arguments as input, its return value as output, an exception as the step's error."""

    def decorate(fn: F) -> F:
        tool_name = name or fn.__name__
        signature = inspect.signature(fn)

        def arguments(args: tuple, kwargs: dict) -> dict[str, Any]:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:
                return {"args": list(args), **kwargs}
            return dict(bound.arguments)

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                given = arguments(args, kwargs)
                with span(tool_name, kind="tool", input=given) as step:
                    plan = intercept.plan_tool(tool_name, given)
                    if plan is None:
                        result = await fn(*args, **kwargs)
                    else:
                        result = await _planned_async(plan, step, lambda: fn(*args, **kwargs))
                    step.output = result
                    return result

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            given = arguments(args, kwargs)
            with span(tool_name, kind="tool", input=given) as step:
                plan = intercept.plan_tool(tool_name, given)
                if plan is None:
                    result = fn(*args, **kwargs)
                else:
                    result = _planned(plan, step, lambda: fn(*args, **kwargs))
                step.output = result
                return result

        return wrapper  # type: ignore[return-value]

    if function is not None:
        return decorate(function)
    return decorate


def call_tool(name: str, arguments: dict[str, Any], real: Callable[[], Any]) -> Any:
    """A framework's tool call (LangChain's, seen by `cobalt_app.framework_tools`) as the
    engine plans it: run as is when there is nothing to do, else in a `tool` step of its own
    (stubbed, replayed, or run and recorded)."""
    plan = intercept.plan_tool(name, arguments)
    if plan is None:
        return real()
    with span(name, kind="tool", input=arguments) as step:
        result = _planned(plan, step, real)
        step.output = result
        return result


async def call_tool_async(
    name: str, arguments: dict[str, Any], real: Callable[[], Awaitable[Any]]
) -> Any:
    """`call_tool` for an async tool call."""
    plan = intercept.plan_tool(name, arguments)
    if plan is None:
        return await real()
    with span(name, kind="tool", input=arguments) as step:
        result = await _planned_async(plan, step, real)
        step.output = result
        return result


async def call_in_step_async(
    name: str, arguments: dict[str, Any], real: Callable[[], Awaitable[Any]]
) -> Any:
    """`call_tool_async` for a framework that opens the tool's step itself (PydanticAI's
    "running tool" span is the current one): that step is marked, no other is made."""
    plan = intercept.plan_tool(name, arguments)
    if plan is None:
        return await real()
    return await _planned_async(plan, Step(trace.get_current_span()), real)


def _planned(plan: intercept.ToolPlan, step: Step, real: Callable[[], Any]) -> Any:
    """A sync tool call as the engine planned it (`cobalt.intercept.plan_tool`): answered
    (after its delay) or run, its result handed to `plan.done`."""
    if plan.mark:
        step._span.set_attribute(intercept.MARK_ATTRIBUTE, plan.mark)
    if plan.delay:
        time.sleep(plan.delay)
    if plan.answer is not None:
        return plan.answer()
    try:
        result = real()
    except Exception as exc:
        if plan.done is not None:
            plan.done(None, exc)
        raise
    if plan.done is not None:
        plan.done(result, None)
    return result


async def _planned_async(
    plan: intercept.ToolPlan, step: Step, real: Callable[[], Awaitable[Any]]
) -> Any:
    """`_planned` for an async tool (a stub's `fn` may be async too)."""
    if plan.mark:
        step._span.set_attribute(intercept.MARK_ATTRIBUTE, plan.mark)
    if plan.delay:
        await asyncio.sleep(plan.delay)
    if plan.answer is not None:
        value = plan.answer()
        return await value if inspect.isawaitable(value) else value
    try:
        result = await real()
    except Exception as exc:
        if plan.done is not None:
            plan.done(None, exc)
        raise
    if plan.done is not None:
        plan.done(result, None)
    return result
