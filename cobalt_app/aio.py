"""One long-lived event loop per process, and one thread for the database.

Async runners run on a loop that lives as long as the process, so a module-level
`AsyncOpenAI()` client in an experiment file keeps working across experiments and tasks
(no "Event loop is closed"). Django's ORM is synchronous: every query of the executor goes
through a single database thread, which suits SQLite's single writer.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._serve, name="cobalt-loop", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the loop and wait; Ctrl-C cancels it and waits for its cleanup."""
        done = threading.Event()

        async def wrapper() -> T:
            try:
                return await coro
            finally:
                done.set()

        future = asyncio.run_coroutine_threadsafe(wrapper(), self.loop)
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            done.wait(timeout=30)
            raise


_loop_thread: LoopThread | None = None
_lock = threading.Lock()


def loop_thread() -> LoopThread:
    global _loop_thread
    with _lock:
        if _loop_thread is None:
            _loop_thread = LoopThread()
        return _loop_thread


def run(coro: Coroutine[Any, Any, T]) -> T:
    return loop_thread().run(coro)


class DatabaseThread:
    """Runs ORM calls from async code on one dedicated thread (one connection)."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cobalt-db")

    async def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        from django.db import connections

        self.pool.submit(connections.close_all).result()
        self.pool.shutdown(wait=True)
