"""Stopping an item's agent when its timeout passes, sync or async.

An item's runner call carries an `ItemGuard` in a context variable (`guarded()` in
`engine.call_runner`); asyncio tasks copy it and the engine runs sync runners in a copy of
the context, as do `asyncio.to_thread` and `contextvars.copy_context().run` in a thread the
agent starts. When the timeout passes, the guard is stopped and:

- the interception layer refuses the agent's next call: an HTTP request through httpx,
  aiohttp or requests/urllib3 (the transports `transports.install()` wraps: the OpenAI and
  Anthropic SDKs, LiteLLM, most tools send through them) and any trace span it starts (a
  model call of an instrumented SDK, a `@cobalt.tool`, a framework's tool step) raise
  `AgentStopped` inside the agent;
- a sync runner still running on its thread is interrupted at its next Python instruction
  (`aio.Threads.interrupt`, again every REPEAT seconds if the code swallows it);
- an async runner's task is cancelled, again every REPEAT seconds if it swallows that.

Whatever the code does, the item ends within `timeout_grace` seconds: a thread that has not
stopped by then (blocked in C: `time.sleep`, a socket without timeout) is abandoned and the
runner threads start another in its place; a task is left behind on the loop, its calls
refused. The item's error then says its code did not stop, and the run's summary names it.

`AgentStopped` derives from BaseException: the SDKs' retry loops and an agent's
`except Exception` let it through, as they do `KeyboardInterrupt`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from cobalt_app.deadlines import DeadlineExceeded, within

T = TypeVar("T")
REPEAT = 0.5  # seconds between two interruptions of code that swallows them
POLL = 0.02  # seconds between two looks at whether the stopped code has ended
DID_NOT_STOP = "its code did not stop"  # in the item's error: what the summary looks for


class AgentStopped(BaseException):  # noqa: N818 - reads as what happened to the agent
    """Raised inside an agent whose item timed out: Cobalt is stopping it (see the module)."""

    def __init__(self, message: str = "Cobalt stopped this item's agent: its timeout passed"):
        super().__init__(message)


class ItemGuard:
    """One runner call of one item: `stopped` says why its agent is being stopped (None:
    it is not)."""

    __slots__ = ("stopped",)

    def __init__(self) -> None:
        self.stopped: str | None = None


_guard: contextvars.ContextVar[ItemGuard | None] = contextvars.ContextVar(
    "cobalt_item_guard", default=None
)


def in_item() -> bool:
    """Whether the calling code is an item's agent (its runner call, and what it started
    with the context: tasks, `asyncio.to_thread`)."""
    return _guard.get() is not None


def current_guard() -> ItemGuard | None:
    """The running item's guard (None outside a runner call)."""
    return _guard.get()


def refuse(what: str | Callable[[], str]) -> None:
    """Raise `AgentStopped` when the calling item's agent is being stopped (the interception
    layer calls this before letting a call through; `what` names the call)."""
    guard = _guard.get()
    if guard is not None and guard.stopped is not None:
        described = what() if callable(what) else what
        raise AgentStopped(f"{guard.stopped}: Cobalt refused its call ({described})")


@contextlib.contextmanager
def item_guard() -> Iterator[ItemGuard]:
    """An item's runner call in this context (a runner thread running items one by one)."""
    guard = ItemGuard()
    token = _guard.set(guard)
    try:
        yield guard
    finally:
        _guard.reset(token)


class RunningCall:
    """A call of `aio.Threads.call` its caller may have to stop: the thread it runs on."""

    __slots__ = ("slot", "given_up", "thread_name")

    def __init__(self) -> None:
        self.slot: Any = None  # set when a thread takes the call
        self.given_up = False  # by `interrupt`: a thread that takes it now skips it
        self.thread_name = ""


class NotStopped(Exception):
    """The runner's code went on after its timeout and its grace period: it was left."""


async def sync_call(
    threads: Any,
    fn: Callable[..., T],
    *args: Any,
    timeout: float,
    grace: float,
    then: Any = None,
) -> T:
    """`fn(*args)` on one of `threads` within `timeout`; past it, the call is stopped (see
    the module), `DeadlineExceeded` raised, or `NotStopped` if it went on past `grace`.
    `then` (`aio.Then`): what its thread does next with the value, outside the timeout."""

    guard = ItemGuard()
    token = _guard.set(guard)
    call = RunningCall()
    try:
        return await within(threads.call(fn, *args, running=call, then=then), timeout)
    except DeadlineExceeded:
        guard.stopped = f"the item timed out after {timeout:g}s"
        if not await thread_stopped(threads, call, grace):
            raise NotStopped(f"its thread {call.thread_name}") from None
        raise
    except asyncio.CancelledError:  # the run or the conversation stopped: so does the agent
        guard.stopped = "the item was cancelled"
        threads.interrupt(call)
        raise
    finally:
        _guard.reset(token)


async def thread_stopped(threads: Any, call: Any, grace: float) -> bool:
    loop = asyncio.get_running_loop()
    until = loop.time() + grace
    interrupted_at = None
    while True:
        now = loop.time()
        if interrupted_at is None or now - interrupted_at >= REPEAT:
            if not threads.interrupt(call):
                return True  # ended (or never started)
            interrupted_at = now
        elif not threads.running(call):
            return True
        if now >= until:
            threads.abandon(call)
            return False
        await asyncio.sleep(min(POLL, until - now))


async def async_call(coro: Coroutine[Any, Any, T], *, timeout: float, grace: float) -> T:
    """Await an async runner's coroutine within `timeout`, in a task of its own: past it, the
    task is cancelled, again if it swallows that; a task still going after `grace` is left
    (`NotStopped`), its calls refused."""
    guard = ItemGuard()
    token = _guard.set(guard)
    try:
        task = asyncio.ensure_future(_carried(coro))  # copies the context: the guard goes too
    finally:
        _guard.reset(token)
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    task.add_done_callback(lambda _: ended.done() or ended.set_result(None))
    try:
        await within(ended, timeout)
    except DeadlineExceeded:
        guard.stopped = f"the item timed out after {timeout:g}s"
        if not await _task_stopped(task, grace):
            raise NotStopped("its task") from None
        raise
    except asyncio.CancelledError:
        guard.stopped = "the item was cancelled"
        task.cancel()
        raise
    try:
        return task.result()
    except _Escaped as escaped:
        raise escaped.raised from None


class _Escaped(Exception):  # noqa: N818 - carries, it is not an error of its own
    """`SystemExit` or `KeyboardInterrupt` raised by the runner's own code: from a task,
    asyncio lets them out of the event loop (the whole run would end), so they travel as an
    ordinary exception and are raised again where the runner was awaited."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(repr(raised))
        self.raised = raised


async def _carried(coro: Coroutine[Any, Any, T]) -> T:
    try:
        return await coro
    except (SystemExit, KeyboardInterrupt) as exc:
        raise _Escaped(exc) from None


async def _task_stopped(task: asyncio.Task, grace: float) -> bool:
    loop = asyncio.get_running_loop()
    until = loop.time() + grace
    while not task.done():
        task.cancel()
        remaining = until - loop.time()
        if remaining <= 0:
            return False
        await asyncio.wait([task], timeout=min(REPEAT, remaining))
    if not task.cancelled():
        task.exception()  # retrieved: its error is the timeout's, not "never retrieved"
    return True


def did_not_stop(timeout: float, grace: float, what: str) -> str:
    """The error of an item whose code went on past its timeout and grace period."""
    return (
        f"timed out after {timeout:g}s and {DID_NOT_STOP} within {grace:g}s "
        f"(timeout_grace): {what} was left running; its model calls and HTTP requests "
        "(httpx, aiohttp, requests) are refused"
    )
