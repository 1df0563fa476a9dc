"""One long-lived event loop per process, and one thread for the database.

Async runners run on a loop that lives as long as the process, so a module-level
`AsyncOpenAI()` client in an experiment file keeps working across experiments and tasks
(no "Event loop is closed"). Django's ORM is synchronous: every query of the executor goes
through a single database thread, which suits SQLite's single writer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import signal
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class Interrupted(KeyboardInterrupt):
    """The process was asked to stop (Ctrl-C, SIGTERM, SIGHUP, its output closed) while it
    executed `run_id`, which is now cancelled; `signum` is the signal that asked."""

    def __init__(self, signum: int, run_id: str | None = None) -> None:
        super().__init__(signum)
        self.signum = signum
        self.run_id = run_id


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        # Completed when the loop stops for good: with the exception that stopped it, e.g. a
        # SystemExit raised in a callback. Nobody then waits forever for a coroutine's result.
        self.stopped: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.waited: set[concurrent.futures.Future[Any]] = set()  # by `run()` callers, now
        self.thread = threading.Thread(target=self._serve, name="cobalt-loop", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits, in `run()`
            self.stopped.set_exception(exc)
        else:
            self.stopped.set_result(None)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the loop and wait; Ctrl-C cancels it and waits for its cleanup."""
        ended: concurrent.futures.Future[None] = concurrent.futures.Future()

        async def wrapper() -> T:
            try:
                return await coro
            finally:
                ended.set_result(None)

        future = asyncio.run_coroutine_threadsafe(wrapper(), self.loop)
        self.waited.add(future)
        try:
            self._wait(future)
        except KeyboardInterrupt:
            future.cancel()  # the coroutine cleans up (the run is marked cancelled) and ends
            self._wait(ended, timeout=30)
            raise
        finally:
            self.waited.discard(future)
        if future.cancelled():  # by `interrupt()`, from another thread
            self._wait(ended, timeout=30)
            raise Interrupted(signal.SIGINT)
        return future.result()

    def interrupt(self) -> None:
        """Ctrl-C for callers of `run()` on other threads (a notebook's helper thread): their
        coroutines are cancelled, clean up, and `run()` raises `Interrupted` there."""
        for future in list(self.waited):
            future.cancel()

    def _wait(self, future: concurrent.futures.Future[Any], timeout: float | None = None) -> None:
        """Until the coroutine ends, or the loop itself stopped (then its exception is raised)."""
        concurrent.futures.wait(
            [future, self.stopped], timeout=timeout, return_when=FIRST_COMPLETED
        )
        if not future.done() and self.stopped.done():
            global _loop_thread
            with _lock:
                if _loop_thread is self:
                    _loop_thread = None  # the next caller starts a new loop
            self.stopped.result()
            raise RuntimeError("the event loop stopped before the coroutine ended")


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


def guarded(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call an ORM function on a long-lived thread; drop the connection if it broke."""
    from django.db import DatabaseError, connection

    try:
        return fn(*args, **kwargs)
    except DatabaseError:
        connection.close_if_unusable_or_obsolete()  # the next call reconnects
        raise
