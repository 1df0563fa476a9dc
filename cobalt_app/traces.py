"""Capture the OpenTelemetry spans an agent produces while one item runs.

`capture_item()` goes around the runner call of `engine.execute_item` (both modes). It sets
a context variable naming the item's collector; `ItemSpanProcessor.on_start` reads it, so a
span is attributed to the item whose code started it, with 40 items in flight on one event
loop (asyncio tasks copy context) and in the threads of sync runners (the engine runs them in
a copy of the context). A span started where the variable is not set (a thread the agent's
framework made) still joins the item of its parent span.

The processor goes on the global tracer provider, so every span is seen: the `openai` and
`anthropic` SDKs' calls (OpenInference's instrumentations, enabled by `enabled()` for as long
as a run executes), the frameworks whose OpenInference instrumentation is installed (LangChain
and LangGraph, LiteLLM, LlamaIndex, smolagents, CrewAI, DSPy, Haystack: each an extra,
`cobalt-agents[langchain]`, enabled the same way when the agent imports the framework; the
same model call seen by a framework's span and the SDK's is one step, see `trace_spans`),
a framework that instruments itself (PydanticAI, the OpenAI Agents SDK
through OpenInference's processor), the user's own tracer and `cobalt.span`. If the user set
an SDK tracer provider, Cobalt adds its processor to it (their exporters keep receiving their
spans); if not, Cobalt installs a provider with no exporter at all. Spans are only collected in
memory and stored with the item: Cobalt sends nothing anywhere.

Never a silent pass: an empty trace is a fact only when the agent could have been seen. A
library the process imported whose instrumentation refuses it (its `instrumentation_dependencies()`
are not met by the installed version, which OpenTelemetry's `instrument()` would only log) or
raises while instrumenting is recorded for the process (`refusals()`); every item that ends while
one is recorded, or runs with `trace.enabled = false`, or whose spans could not be read, is
"not captured" with why (`Captured.missing`). That is per process, not per call: with the library
left uninstrumented nothing tells whether an item called it.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import importlib.util
import logging
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import wrapt
from opentelemetry import trace
from opentelemetry.instrumentation.dependencies import get_dependency_conflicts
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

from cobalt.run_settings import RUN_DEFAULTS
from cobalt.wording import install_hint
from cobalt_app import intercepts, runaway, trace_spans

logger = logging.getLogger("cobalt.traces")

# library -> (the instrumentation's module, its instrumentor class)
INSTRUMENTATIONS = {
    "openai": ("openinference.instrumentation.openai", "OpenAIInstrumentor"),
    "anthropic": ("openinference.instrumentation.anthropic", "AnthropicInstrumentor"),
    "agents": ("openinference.instrumentation.openai_agents", "OpenAIAgentsInstrumentor"),
    "langchain_core": ("openinference.instrumentation.langchain", "LangChainInstrumentor"),
    "litellm": ("openinference.instrumentation.litellm", "LiteLLMInstrumentor"),
    "llama_index.core": ("openinference.instrumentation.llama_index", "LlamaIndexInstrumentor"),
    "smolagents": ("openinference.instrumentation.smolagents", "SmolagentsInstrumentor"),
    "crewai": ("openinference.instrumentation.crewai", "CrewAIInstrumentor"),
    "dspy": ("openinference.instrumentation.dspy", "DSPyInstrumentor"),
    "haystack": ("openinference.instrumentation.haystack", "HaystackInstrumentor"),
}
# library -> a name only the real one has (a project may have its own `agents` package)
LIBRARIES = {
    "openai": "OpenAI",
    "anthropic": "Anthropic",
    "agents": "add_trace_processor",
    "pydantic_ai": "Agent",
    "langchain_core": "__version__",
    "litellm": "completion",
    "llama_index.core": "Settings",
    "smolagents": "ToolCallingAgent",
    "crewai": "Crew",
    "dspy": "Predict",
    "haystack": "Pipeline",
}
# Frameworks whose instrumentation is an optional extra (`cobalt-agents[langchain]`): without
# it their model calls are still traced (through the SDK underneath), only their own tree is
# not, so a missing one is a hint (`flat()`), not a trace "not captured".
EXTRAS = {
    "langchain_core": ("LangChain/LangGraph", "langchain"),
    "litellm": ("LiteLLM", "litellm"),
    "llama_index.core": ("LlamaIndex", "llama-index"),
    "smolagents": ("smolagents", "smolagents"),
    "crewai": ("CrewAI", "crewai"),
    "dspy": ("DSPy", "dspy"),
    "haystack": ("Haystack", "haystack"),
}


@dataclass(frozen=True)
class TraceSettings:
    """`trace.enabled` (default on) and `trace.max_chars` (each input/output, default 2000)."""

    enabled: bool = RUN_DEFAULTS.trace.enabled
    max_chars: int = trace_spans.DEFAULT_MAX_CHARS

    @classmethod
    def from_config(cls, config: Any) -> TraceSettings:
        return cls(
            enabled=bool(config.get("trace.enabled", RUN_DEFAULTS.trace.enabled)),
            max_chars=int(config.get("trace.max_chars", trace_spans.DEFAULT_MAX_CHARS)),
        )


@dataclass
class Collector:
    """The spans of one item, finished ones in `spans`."""

    origin_ns: int = field(default_factory=time.time_ns)
    spans: list[ReadableSpan] = field(default_factory=list)
    open_ids: set[int] = field(default_factory=set)
    closed: bool = False


_current: contextvars.ContextVar[Collector | None] = contextvars.ContextVar(
    "cobalt_trace_collector", default=None
)


class ItemSpanProcessor(SpanProcessor):
    """Hands every span started inside an item to that item's collector; ignores the rest."""

    def __init__(self) -> None:
        self._owners: dict[int, Collector] = {}  # open span id -> its item's collector

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        # A timed-out item's agent starts no step: its model and tool calls raise.
        runaway.refuse(lambda: f"step {span.name!r}")
        intercepts.step_started(span)  # the item's budget (`max_llm_calls`, ...)
        collector = _current.get()
        if collector is None:
            parent = span.parent
            if parent is None or not self._owners:
                return
            collector = self._owners.get(parent.span_id)
            if collector is None:
                return
        if collector.closed:
            return
        span_id = span.context.span_id
        self._owners[span_id] = collector
        collector.open_ids.add(span_id)

    def on_end(self, span: ReadableSpan) -> None:
        intercepts.step_ended(span)
        collector = self._owners.pop(span.context.span_id, None)
        if collector is not None and not collector.closed:
            collector.open_ids.discard(span.context.span_id)
            collector.spans.append(span)

    def release(self, collector: Collector) -> None:
        """Forget the spans of a finished item that never ended."""
        collector.closed = True
        for span_id in list(collector.open_ids):
            self._owners.pop(span_id, None)

    def shutdown(self) -> None:
        self._owners.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


PROCESSOR = ItemSpanProcessor()
_lock = threading.RLock()  # instrumenting imports modules, which may run `_on_import`
_provider: TracerProvider | None = None
_users = 0
_instrumented: list[Any] = []
_done: set[str] = set()  # libraries instrumented (or left to the user) while enabled
_refused: dict[str, str] = {}  # library -> why it is not traced (while enabled)
_flat: dict[str, str] = {}  # framework -> its extra to install (its instrumentation is not)
_hooked: set[str] = set()  # libraries with an import hook


def provider() -> TracerProvider:
    """The SDK tracer provider Cobalt's processor is on (installing it on first use)."""
    global _provider
    with _lock:
        if _provider is not None:
            return _provider
        current = trace.get_tracer_provider()
        if isinstance(current, TracerProvider):
            current.add_span_processor(PROCESSOR)  # the user's own: their exporters stay
            _provider = current
        else:
            own = TracerProvider()
            own.add_span_processor(PROCESSOR)
            if isinstance(current, trace.ProxyTracerProvider):
                trace.set_tracer_provider(own)
            else:
                logger.info("a non-SDK tracer provider is set: Cobalt sees only its own spans")
            _provider = own
        return _provider


@contextlib.contextmanager
def enabled(settings: TraceSettings | None = None) -> Iterator[None]:
    """Instrument the `openai`/`anthropic` SDKs and frameworks while a run executes.

    Nested and concurrent uses share one instrumentation; the last to leave removes it.
    Libraries the user instruments themselves are left as they are.
    """
    global _users
    if settings is not None and not settings.enabled:
        yield
        return
    enable_for_process(settings or TraceSettings())
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                _uninstrument()


def enable_for_process(settings: TraceSettings) -> None:
    """Instrument for the rest of this process's life (a team worker executes items of many
    runs, one after another): the instrumentations are added once and stay."""
    global _users
    if not settings.enabled:
        return
    tracer_provider = provider()
    with _lock:
        _users += 1
        if _users == 1:
            _instrument(tracer_provider)


def preload_instrumentations() -> None:
    """Import the instrumentations of the libraries the agent imported, before a run starts:
    imported when the run enables them, inside its first items, they stall every item in
    flight (OpenInference's take ~0.1 s)."""
    for library, (module_name, _) in INSTRUMENTATIONS.items():
        module = sys.modules.get(library)
        if module is not None and hasattr(module, LIBRARIES[library]):
            with contextlib.suppress(Exception):  # reported when it is enabled
                importlib.import_module(module_name)


def _instrument(tracer_provider: TracerProvider) -> None:
    """Instrument the libraries already imported; the others when they are (an import hook):
    importing a framework the agent does not use would cost seconds at every run's start."""
    for library in LIBRARIES:
        if library in sys.modules:
            _instrument_library(sys.modules[library], tracer_provider)
        elif library not in _hooked and _installed(library):
            _hooked.add(library)
            wrapt.register_post_import_hook(_on_import, library)


def _installed(library: str) -> bool:
    try:  # a dotted name imports its parent package (`llama_index`: a bare namespace)
        return importlib.util.find_spec(library) is not None
    except ImportError:
        return False


def _on_import(module: Any) -> None:
    with _lock:
        if _users > 0 and _provider is not None:
            _instrument_library(module, _provider)


def _instrument_library(module: Any, tracer_provider: TracerProvider) -> None:
    """Instrument one library, unless the module of that name is another one (a project's
    own `agents` package is not the OpenAI Agents SDK). Never fails the run or the import
    that triggered it: a library that cannot be instrumented is left untraced, with a warning."""
    library = module.__name__
    if library in _done or not hasattr(module, LIBRARIES[library]):
        return
    _done.add(library)
    try:
        if library == "pydantic_ai":
            _instrument_pydantic_ai(tracer_provider)
            return
        module_name, class_name = INSTRUMENTATIONS[library]
        try:
            instrumentation = importlib.import_module(module_name)
        except ImportError as exc:
            if library not in EXTRAS or not _missing(exc, module_name):
                raise
            _flat[library] = flat_hint(library)
            logger.info("%s", _flat[library])
            return
        instrumentor = getattr(instrumentation, class_name)()
        if instrumentor.is_instrumented_by_opentelemetry:
            return  # the user did it: theirs stays
        refused = unsupported(instrumentor)
        if refused:
            _refuse(library, refused)
            return
        options: dict[str, Any] = {"tracer_provider": tracer_provider}
        if library == "agents":
            options["exclusive_processor"] = False  # the SDK's own processors stay too
        instrumentor.instrument(**options)
        _instrumented.append(instrumentor)
    except Exception as exc:  # noqa: BLE001 - tracing must never break the agent
        _refuse(library, f"instrumenting {library} failed: {type(exc).__name__}: {exc}")


def unsupported(instrumentor: Any) -> str:
    """Why an instrumentor would instrument nothing ("" when it would): the installed version
    of what it instruments is outside its `instrumentation_dependencies()` (its `instrument()`
    then only logs and returns)."""
    conflict = get_dependency_conflicts(instrumentor.instrumentation_dependencies())
    if conflict is None:
        return ""
    found = conflict.found or "no installed version"
    return f"{found} is outside what its instrumentation traces ({conflict.required})"


def _refuse(library: str, why: str) -> None:
    _refused[library] = why
    logger.warning("%s calls are not traced: %s", library, why)


def refusals() -> dict[str, str]:
    """The libraries this process imported and could not instrument, with why (while a run
    executes: recorded when each is instrumented)."""
    with _lock:
        return dict(_refused)


def refusals_ahead() -> list[str]:
    """Why the libraries already imported would not be traced, found before any is
    instrumented (for the run's header; an item's own record is `Captured.missing`)."""
    found = []
    for library, (module_name, class_name) in INSTRUMENTATIONS.items():
        module = sys.modules.get(library)
        if module is None or not hasattr(module, LIBRARIES[library]):
            continue
        try:
            instrumentor = getattr(importlib.import_module(module_name), class_name)()
            why = unsupported(instrumentor)
        except ImportError as exc:
            why = "" if library in EXTRAS and _missing(exc, module_name) else _unloadable(exc)
        except Exception as exc:  # noqa: BLE001 - said, never raised: it is a warning
            why = _unloadable(exc)
        if why:
            found.append(why)
    return found


def _unloadable(exc: BaseException) -> str:
    return f"its instrumentation cannot be loaded: {type(exc).__name__}: {exc}"


def _missing(exc: ImportError, module_name: str) -> bool:
    """Whether the instrumentation itself is not installed (not a module it needs)."""
    name = getattr(exc, "name", None) or ""
    return bool(name) and module_name.startswith(name)


def flat_hint(library: str) -> str:
    framework, extra = EXTRAS[library]
    return f"{framework}'s own steps are not traced, only its model calls: {install_hint(extra)}"


def flat_ahead() -> list[str]:
    """The frameworks already imported whose instrumentation is not installed, each with the
    extra that installs it (for the run's header)."""
    found = []
    for library in EXTRAS:
        module = sys.modules.get(library)
        if module is None or not hasattr(module, LIBRARIES[library]):
            continue
        module_name = INSTRUMENTATIONS[library][0]
        if not _installed(module_name):
            found.append(flat_hint(library))
    return found


_pydantic_default: list[Any] = []


def _instrument_pydantic_ai(tracer_provider: TracerProvider) -> None:
    """PydanticAI emits OpenTelemetry spans (model calls, tools) once instrumentation is on;
    Cobalt turns it on for agents that did not choose for themselves."""
    from pydantic_ai import Agent
    from pydantic_ai.models.instrumented import InstrumentationSettings

    # No public getter: a default other than False means the user chose.
    if Agent._instrument_default is not False:
        return
    _pydantic_default.append(Agent._instrument_default)
    Agent.instrument_all(InstrumentationSettings(tracer_provider=tracer_provider))


def _uninstrument() -> None:
    _done.clear()
    _refused.clear()
    _flat.clear()
    while _instrumented:
        _instrumented.pop().uninstrument()
    if _pydantic_default:
        from pydantic_ai import Agent

        Agent.instrument_all(_pydantic_default.pop())


@contextlib.contextmanager
def capture_item(settings: TraceSettings) -> Iterator[Collector | None]:
    """Collect the spans started in this context (and its copies) until the block ends."""
    if not settings.enabled:
        yield None
        return
    if _provider is None:
        provider()
    collector = Collector()
    token = _current.set(collector)
    try:
        yield collector
    finally:
        _current.reset(token)
        PROCESSOR.release(collector)


OFF = "tracing is off (`trace.enabled = false`)"
UNSEEN = "evaluators that read the trace give errors"


def header(config: Any) -> str | None:
    """The run header's line about the agent's trace, when it will not be (wholly) captured:
    tracing off, a library already imported that its instrumentation refuses, or a framework
    whose instrumentation (an extra) is not installed."""
    if not TraceSettings.from_config(config).enabled:
        return f"not captured: {OFF}; {UNSEEN}"
    refused = refusals_ahead()
    lines = [f"not captured: {'; '.join(refused)}; {UNSEEN}"] if refused else []
    return "; ".join(lines + flat_ahead()) or None


@dataclass(frozen=True)
class Captured:
    """An item's trace: its stored steps, and why it was not (wholly) captured ("" if it was)."""

    steps: list[dict[str, Any]]
    missing: str = ""


def captured(collector: Collector | None, settings: TraceSettings) -> Captured:
    """The collected spans as stored steps (see `trace_spans`), and what kept any from being
    captured: tracing off, a library of this process refused (see the module docstring), or
    an error while reading the spans (the agent's result still stands)."""
    if collector is None:
        return Captured([], OFF if not settings.enabled else "")
    missing = "; ".join(refusals().values())
    if not collector.spans:
        return Captured([], missing)
    try:
        steps = trace_spans.steps_of(
            list(collector.spans), collector.origin_ns, max_chars=settings.max_chars
        )
    except Exception as exc:  # noqa: BLE001 - the item's outcome must not be lost to it
        logger.exception("reading an item's spans failed")
        return Captured([], f"reading its spans failed: {type(exc).__name__}: {exc}")
    return Captured(steps, missing)


def collecting() -> bool:
    """Whether a span started here would join an item's trace."""
    if _current.get() is not None:
        return True
    current = trace.get_current_span()
    return current.is_recording() and current.get_span_context().span_id in PROCESSOR._owners


def untraced() -> contextlib.AbstractContextManager[None]:
    """No instrumentation span inside (the judges' own model calls: they are not the agent's,
    and a user's exporter should not receive them)."""
    return suppress_instrumentation()
