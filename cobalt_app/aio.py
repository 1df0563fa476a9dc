"""One long-lived event loop per process, and one thread for the database.

Async runners run on a loop that lives as long as the process, so a module-level
`AsyncOpenAI()` client in an experiment file keeps working across experiments and tasks
(no "Event loop is closed"). Django's ORM is synchronous: every query of the executor goes
through a single database thread, which suits SQLite's single writer.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import ctypes
import functools
import queue
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor
from typing import Any, TypeVar

from cobalt_app.runaway import AgentStopped, RunningCall

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


class Threads:
    """Threads for synchronous user code (runners, function evaluators) awaited from the loop.

    `loop.run_in_executor` costs a concurrent future chained to an asyncio one and a write to
    the loop's self-pipe for every call; at thousands of quick calls a second those wake-ups
    are most of the loop's work and, each a system call, hand the GIL around. Here a thread
    puts its result on a queue and wakes the loop only if no wake-up is already on its way:
    the loop settles every result that arrived meanwhile in one go. Threads start as calls
    need them (up to `max_threads`), are named `<name>_<n>`, and end after `shutdown()`.
    """

    def __init__(self, name: str, max_threads: int) -> None:
        self.name = name
        self.max_threads = max(1, max_threads)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        # A token per thread waiting for a call, not yet promised one: a C queue, where a
        # `threading.Semaphore` (a Python condition and lock) cost microseconds per call.
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._landings: dict[asyncio.AbstractEventLoop, _Landing] = {}

    async def call(
        self,
        fn: Callable[..., T],
        *args: Any,
        running: RunningCall | None = None,
        then: Then | None = None,
    ) -> T:
        """`fn(*args)` on one of the threads, in a copy of the caller's context (the item's
        trace collector and OpenTelemetry context go with it); `running` lets the caller
        stop the call (`interrupt`, `abandon`). `then`: what the same thread does next with
        the value `fn` returned, once the caller has it (not if `fn` raised or the caller
        gave up): `then.follow(value)`, its result or exception settling `then.future` —
        work that would otherwise cost a second hand-over to a thread and back."""
        loop = asyncio.get_running_loop()
        landing = self._landings.get(loop)
        if landing is None:
            landing = self._landings.setdefault(loop, _Landing(loop))
        future = loop.create_future()
        job = (future, landing, contextvars.copy_context(), fn, args, running, then)
        self._jobs.put(job)
        try:
            self._idle.get_nowait()
        except queue.Empty:  # no thread is free for it: one more
            self._start_thread()
        return await future

    def interrupt(self, call: RunningCall) -> bool:
        """Raise `AgentStopped` in the thread running `call`, at its next Python instruction;
        a call not started yet never starts. False when it is not running (ended, or never
        started): a thread that moved on to another call is never hit."""
        call.given_up = True
        slot = call.slot
        if slot is None:
            return False  # its thread, when it takes it, sees `given_up` (set first)
        with slot.lock:
            if slot.call is not call:
                return False
            _set_async_exc(slot.ident, AgentStopped)
            slot.pending = True
            return True

    def running(self, call: RunningCall) -> bool:
        slot = call.slot
        return slot is not None and slot.call is call

    def abandon(self, call: RunningCall) -> None:
        """Leave the thread running `call` to it (it ends when the call does) and start
        another in its place: the pool keeps its number of threads."""
        slot = call.slot
        if slot is None:
            return
        with slot.lock:
            if slot.call is not call:
                return
            slot.abandoned = True
        with self._lock:
            if slot.thread in self._threads:
                self._threads.remove(slot.thread)
        self._start_thread()

    def shutdown(self) -> None:
        """Idle threads end now, busy ones once their call returns; calls not started yet
        are dropped (their callers were cancelled)."""
        with self._lock:
            self._closed = True
            for _ in self._threads:
                self._jobs.put(None)

    def _start_thread(self) -> None:
        with self._lock:
            if self._closed or len(self._threads) >= self.max_threads:
                return
            thread = threading.Thread(
                target=self._serve, name=f"{self.name}_{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
        thread.start()

    def _serve(self) -> None:
        slot = _Slot()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, landing, context, fn, args, running, then = job
            if future.cancelled():  # a timed-out or cancelled caller: skip the call
                pass
            elif running is not None:
                call = (fn, args, then)
                # `start_with_slot`'s job makes its stoppable calls one by one
                run = self._run_with_slot if running is SLOT else self._run_stoppable
                if not run(slot, running, future, landing, context, call):
                    return  # abandoned: another thread took this one's place
            else:
                try:
                    value = context.run(fn, *args)
                except BaseException as exc:  # noqa: BLE001 - the caller gets it, whatever it is
                    landing.land(future, False, exc)
                else:
                    landing.land(future, True, value)
                    if then is not None:
                        then.value = value
            if then is not None and then.value is not _NOTHING:
                _follow(then, landing)
            job = future = context = args = running = then = call = None  # nothing outlives it
            with self._lock:
                if self._closed:
                    self._threads.remove(threading.current_thread())
                    return
            self._idle.put(None)

    @staticmethod
    def _run_with_slot(
        slot: _Slot,
        running: object,
        future: asyncio.Future,
        landing: _Landing,
        context: contextvars.Context,
        call: tuple[Callable[..., Any], tuple, Then | None],
    ) -> bool:
        """Run a job of `start_with_slot`; False if one of its calls was abandoned."""
        fn, args, _ = call
        try:
            landing.land(future, True, context.run(fn, slot, *args))
        except BaseException as exc:  # noqa: BLE001 - the caller gets it, whatever it is
            landing.land(future, False, exc)
        return not slot.abandoned

    @staticmethod
    def _run_stoppable(
        slot: _Slot,
        running: RunningCall,
        future: asyncio.Future,
        landing: _Landing,
        context: contextvars.Context,
        call: tuple[Callable[..., Any], tuple, Then | None],
    ) -> bool:
        """Run a call that `interrupt` may stop; False if it was abandoned meanwhile."""
        fn, args, then = call
        ok, value = stoppable(slot, running, context.run, fn, *args)
        if slot.abandoned:
            return False
        landing.land(future, ok, value)
        if ok and then is not None and not running.given_up:
            then.value = value
        return True

    def start_with_slot(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """`fn(slot, *args)` on one of the threads, in a copy of the caller's context, its
        value (or exception) the future's: `fn` makes its own stoppable calls (`stoppable`)
        on the thread's `slot`, which `interrupt` and `abandon` reach one by one; the thread
        ends after `fn` if one was abandoned."""
        return self._submit(fn, args, SLOT)

    def start(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """`fn(*args)` on one of the threads, in a copy of the caller's context, its value
        (or exception) the future's: `call` for a caller on the loop that is no coroutine."""
        return self._submit(fn, args, None)

    def landing(self) -> _Landing:
        """Where results from the threads land for the running loop (one wake-up for many)."""
        loop = asyncio.get_running_loop()
        landing = self._landings.get(loop)
        if landing is None:
            landing = self._landings.setdefault(loop, _Landing(loop))
        return landing

    def _submit(self, fn: Callable[..., Any], args: tuple, running: object) -> asyncio.Future:
        landing = self.landing()
        future = landing.loop.create_future()
        self._jobs.put((future, landing, contextvars.copy_context(), fn, args, running, None))
        try:
            self._idle.get_nowait()
        except queue.Empty:
            self._start_thread()
        return future


SLOT = object()  # a job of `start_with_slot`


def stoppable(slot: _Slot, running: RunningCall, fn: Callable[..., Any], *args: Any) -> tuple:
    """On a runner thread: `fn(*args)` as the thread's `running` call, which `interrupt` may
    stop: (True, its value) or (False, what it raised, or `AgentStopped` if it had been
    stopped before it started)."""
    running.thread_name = slot.thread.name
    running.slot = slot
    slot.call = running  # before looking at `given_up`: see `interrupt`
    if running.given_up:  # its caller has gone, or asked for it not to start
        slot.release()
        return False, AgentStopped("the call was stopped before it started")
    try:
        try:
            ok, value = True, fn(*args)
        except BaseException as exc:  # noqa: BLE001 - the caller gets it, whatever it is
            ok, value = False, exc
        slot.release()
    except AgentStopped as late:  # interrupted as the call ended: its caller has gone
        slot.release()
        ok, value = False, late
    return ok, value


class Then:
    """What a runner thread does right after a call (`Threads.call(then=...)`): `follow`
    gets the call's value on the same thread; `future` (on the caller's loop) gets what
    `follow` returns."""

    def __init__(self, future: asyncio.Future, follow: Callable[[Any], Any]) -> None:
        self.future = future
        self.follow = follow
        self.value: Any = _NOTHING  # the call's value, once it returned and its caller has it


_NOTHING = object()


def _follow(then: Then, landing: _Landing) -> None:
    """`then.follow` in the thread's own context: it chooses the context it runs in."""
    value, then.value = then.value, _NOTHING
    try:
        landing.land(then.future, True, then.follow(value))
    except BaseException as exc:  # noqa: BLE001 - the caller gets it, whatever it is
        landing.land(then.future, False, exc)


class _Slot:
    """One runner thread and the call it runs, so that an interruption reaches that call and
    no other: `interrupt` raises into the thread only while, under `lock`, the call is this
    one, and `release` (under the same lock) clears an interruption that had not arrived."""

    __slots__ = ("thread", "ident", "call", "lock", "pending", "abandoned")

    def __init__(self) -> None:
        self.thread = threading.current_thread()
        self.ident = threading.get_ident()
        self.call: RunningCall | None = None
        self.lock = threading.Lock()
        self.pending = False  # an interruption sent, perhaps not arrived yet
        self.abandoned = False

    def release(self) -> None:
        with self.lock:
            self.call = None
            if self.pending:
                self.pending = False
                _set_async_exc(self.ident, None)


# CPython's way to raise in another thread (None: clear what was not raised yet). A function
# object of our own: setting argtypes on `ctypes.pythonapi`'s would change it for everyone.
_raise_in_thread = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
)


def _set_async_exc(ident: int, exc_type: type[BaseException] | None) -> None:
    _raise_in_thread(ident, ctypes.py_object() if exc_type is None else exc_type)


class _Landing:
    """Where results from the threads wait for their loop, which takes them all per wake-up."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiting: collections.deque = collections.deque()
        self.woken = False

    def land(self, future: asyncio.Future, ok: bool, value: Any) -> None:
        self.waiting.append((future, ok, value))
        if not self.woken:
            self.woken = True
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                self.loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        self.woken = False  # before taking: a result landing from now on wakes the loop again
        while self.waiting:
            future, ok, value = self.waiting.popleft()
            if future.done():  # cancelled, or settled meanwhile by the loop (a deadline)
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)


class DatabaseThread:
    """Runs ORM calls from async code on dedicated threads (one connection each; one thread
    by default, which suits SQLite's single writer)."""

    def __init__(self, threads: int = 1) -> None:
        self.pool = _DatabasePool(max_workers=threads, thread_name_prefix="cobalt-db")

    async def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))

    def make_way(self) -> None:
        """Let a database call under way take the GIL now (see `_DatabasePool`)."""
        if self.pool.under_way:
            time.sleep(0)

    def close(self) -> None:
        from django.db import connections

        self.pool.submit(connections.close_all).result()
        self.pool.shutdown(wait=True)


class _DatabasePool(ThreadPoolExecutor):
    """The database threads, knowing whether a call is under way.

    A database call gives up the GIL at every step of every statement and needs it back to
    go on; beside an event loop busy with quick items it waited for it most of the time (a
    claim of 200 items: 1 ms of work, 18 ms of waiting). The loop's lanes call `make_way`
    between items: while a call is under way, a `time.sleep(0)` hands the GIL over."""

    cobalt_own = True  # Cobalt's own: its calls never run in an item's context (`item_threads`)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.under_way: set[concurrent.futures.Future[Any]] = set()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        future = super().submit(fn, *args, **kwargs)
        self.under_way.add(future)
        future.add_done_callback(self.under_way.discard)
        return future


def guarded(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call an ORM function on a long-lived thread; drop the connection if it broke."""
    from django.db import DatabaseError, connection

    try:
        return fn(*args, **kwargs)
    except DatabaseError:
        connection.close_if_unusable_or_obsolete()  # the next call reconnects
        raise
