"""The tools of agent frameworks, answered like `@cobalt.tool`s (stubs, replay, record).

OpenAI Agents SDK: a function tool runs through `agents.tool._invoke_function_tool_with_metadata`
inside its function span (made current by OpenInference's processor); that function is
wrapped and marks the span. A stub's fault reaches the model as the SDK's own tool errors do:
the text of the tool's `failure_error_function` (the SDK's default message).

PydanticAI: every tool function is called through `FunctionSchema.call(args, ctx)` inside
the tool's own "running tool" span; that call is wrapped (once `pydantic_ai` is imported) and
asks the engine first, marking that span (`cobalt.tracing.call_in_step_async`).

LangChain: every tool built with `@tool`, `StructuredTool` or `Tool` runs its function
through `StructuredTool._run`/`_arun` or `Tool._run`/`_arun`; once `langchain_core.tools` is
imported (an import hook: nothing is imported for an agent that does not use it), those four
are wrapped so that each call asks the engine first (`cobalt.tracing.call_tool`). A call
the engine has nothing to do with runs as before, untouched; one it answers or records gets a
`tool` step of its own in the trace. LangChain still builds its `ToolMessage`, callbacks and
errors around the answer as for the real function.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import json
import threading
from collections.abc import Callable
from typing import Any

import wrapt

from cobalt.tracing import call_in_step_async, call_tool, call_tool_async

LANGCHAIN = "langchain_core.tools"
PYDANTIC_AI = "pydantic_ai._function_schema"
AGENTS = "agents.tool"
NOT_ARGUMENTS = ("config", "run_manager", "callbacks")
_lock = threading.Lock()
_hooked = False


def install() -> None:
    """Wrap the frameworks' tool calls when (if) they are imported; once per process."""
    global _hooked
    with _lock:
        if _hooked:
            return
        _hooked = True
    if importlib.util.find_spec("langchain_core") is not None:
        wrapt.register_post_import_hook(_wrap_langchain, LANGCHAIN)
    if importlib.util.find_spec("agents") is not None:
        wrapt.register_post_import_hook(_wrap_agents, AGENTS)
    if importlib.util.find_spec("pydantic_ai") is not None:
        wrapt.register_post_import_hook(_wrap_pydantic_ai, PYDANTIC_AI)


def _arguments(args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    given = {k: v for k, v in kwargs.items() if k not in NOT_ARGUMENTS}
    if len(args) == 1 and not given:
        return {"input": args[0]}
    if args:
        given["args"] = list(args)
    return given


def _sync(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)  # LangChain reads `_run`'s signature: it stays the original's
    def _run(self: Any, *args: Any, **kwargs: Any) -> Any:
        return call_tool(
            self.name, _arguments(args, kwargs), lambda: original(self, *args, **kwargs)
        )

    _run.cobalt_wrapped = True  # type: ignore[attr-defined]
    return _run


def _async(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def _arun(self: Any, *args: Any, **kwargs: Any) -> Any:
        return await call_tool_async(
            self.name, _arguments(args, kwargs), lambda: original(self, *args, **kwargs)
        )

    _arun.cobalt_wrapped = True  # type: ignore[attr-defined]
    return _arun


def _wrap_langchain(module: Any) -> None:
    from langchain_core.tools import StructuredTool, Tool

    for cls in (StructuredTool, Tool):
        if not getattr(cls._run, "cobalt_wrapped", False):
            cls._run = _sync(cls._run)
        if not getattr(cls._arun, "cobalt_wrapped", False):
            cls._arun = _async(cls._arun)


def _wrap_pydantic_ai(module: Any) -> None:
    schema = module.FunctionSchema
    original = schema.call
    if getattr(original, "cobalt_wrapped", False):
        return

    @functools.wraps(original)
    async def call(self: Any, args_dict: dict[str, Any], ctx: Any) -> Any:
        name = getattr(ctx, "tool_name", None) or getattr(self.function, "__name__", "tool")
        return await call_in_step_async(
            name, dict(args_dict), lambda: original(self, args_dict, ctx)
        )

    call.cobalt_wrapped = True  # type: ignore[attr-defined]
    schema.call = call


def _tool_arguments(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except (TypeError, ValueError):
        return {"input": text}
    return value if isinstance(value, dict) else {"input": value}


def _wrap_agents(module: Any) -> None:
    original = getattr(module, "_invoke_function_tool_with_metadata", None)
    if original is None or getattr(original, "cobalt_wrapped", False):
        return  # another version of the SDK: its tools are not intercepted
    result_type = module._FunctionToolInvocationResult

    @functools.wraps(original)
    async def invoke(*, function_tool: Any, context: Any, arguments: str) -> Any:
        ran: list[Any] = []

        async def real() -> Any:
            ran.append(
                await original(function_tool=function_tool, context=context, arguments=arguments)
            )
            return ran[0].output

        try:
            output = await call_in_step_async(function_tool.name, _tool_arguments(arguments), real)
        except Exception as exc:  # a stub's fault: what the SDK tells the model of a failure
            if ran:
                raise
            failure = getattr(function_tool, "_failure_error_function", None)
            if not callable(failure):
                failure = module.default_tool_error_function
            output = failure(context, exc)
            if inspect.isawaitable(output):
                output = await output
        return ran[0] if ran else result_type(output)

    invoke.cobalt_wrapped = True  # type: ignore[attr-defined]
    module._invoke_function_tool_with_metadata = invoke
