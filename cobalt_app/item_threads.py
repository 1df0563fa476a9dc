"""The threads an item's agent starts carry the item's context, as its asyncio tasks do.

Everything Cobalt does per item (the recording tape, stubs, the trace, the timeout guard)
follows the item through context variables: asyncio tasks, `asyncio.to_thread` and the
engine's runner threads copy them. A plain `threading.Thread` and a thread pool's tasks do
not: a request sent from one would be nobody's — in `--replay` it would go out live. So,
while an item's code runs (and only then), two entry points copy the caller's context, as
`asyncio.to_thread` does and as Python 3.14's `thread_inherit_context` does for threads:

- `threading.Thread.start`: the new thread runs in a copy of the starting item's context
  (a pool's worker thread is left alone: it serves every item, task by task);
- `concurrent.futures.ThreadPoolExecutor.submit` (and so `loop.run_in_executor`): the task
  runs in a copy of the submitting item's context (but in Cobalt's own pools: the database
  thread's calls are Cobalt's, never the item's).

Outside an item nothing changes; installed once per process with the transports.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import functools
import threading
from collections.abc import Callable
from typing import Any

from cobalt_app import runaway

_lock = threading.Lock()
_installed = False


def _is_pool_worker(thread: threading.Thread) -> bool:
    target = getattr(thread, "_target", None)
    return getattr(target, "__module__", "") == "concurrent.futures.thread"


def _wrap_start(original: Callable[..., Any]) -> Callable[..., Any]:
    def start(self: threading.Thread) -> Any:
        if runaway.in_item() and not _is_pool_worker(self):
            self.run = functools.partial(contextvars.copy_context().run, self.run)  # type: ignore[method-assign]
        return original(self)

    start.cobalt_wrapped = True  # type: ignore[attr-defined]
    return start


def _wrap_submit(original: Callable[..., Any]) -> Callable[..., Any]:
    def submit(self: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        if runaway.in_item() and not getattr(self, "cobalt_own", False):
            fn = functools.partial(contextvars.copy_context().run, fn)
        return original(self, fn, *args, **kwargs)

    submit.cobalt_wrapped = True  # type: ignore[attr-defined]
    return submit


def install() -> None:
    """Once per process (see the module)."""
    global _installed
    with _lock:
        if _installed:
            return
        threading.Thread.start = _wrap_start(threading.Thread.start)  # type: ignore[method-assign]
        pool = concurrent.futures.ThreadPoolExecutor
        pool.submit = _wrap_submit(pool.submit)  # type: ignore[method-assign]
        _installed = True
