"""What pages work out from finished runs, kept in this process: the one rule behind the
compare page's score tables and pair orders (`score_tables`), the item panel's lists and the
run page's groups (`page_triage`), and the sweep page's tables (`sweeps`).

A finished run's items and verdicts change only when it is finalised again (resumed or
re-judged, and unfinished meanwhile), which moves its `finished_at`: a value worked out from
finished runs is kept under each run's id and `finished_at`, so a run finalised again misses
and its old entries age out. A value of an unfinished run is worked out every time.

A memo holds at most `entries` values and `max_bytes` (as its `size` measures them; the
newest is kept whatever its size), each for at most `seconds`; the least recently used goes
first. It is safe for threads (a threaded server's requests share it): the lock is never
held while a value is worked out, so two requests that miss at once both compute it.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

from cobalt_app.models import Run

T = TypeVar("T")


def settled(run: Run) -> bool:
    """Whether the run's results no longer change until it is finalised again."""
    return run.is_finished and run.finished_at is not None


class RunMemo(Generic[T]):
    """Values worked out from finished runs, kept in this process (see the module's doc).

    `copies`: each caller gets its own deep copy (for values a caller may change); otherwise
    every caller shares the kept value and must not change it."""

    def __init__(
        self,
        *,
        entries: int | None = None,
        max_bytes: int | None = None,
        size: Callable[[T], int] | None = None,
        seconds: float | None = None,
        copies: bool = False,
    ) -> None:
        if max_bytes is not None and size is None:
            raise ValueError("a memo bounded in bytes needs `size`")
        self.entries, self.max_bytes, self.size = entries, max_bytes, size
        self.seconds, self.copies = seconds, copies
        self._kept: OrderedDict[Hashable, tuple[float, int, T]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, runs: Run | Sequence[Run], what: Hashable, compute: Callable[[], T]) -> T:
        """`compute()` for `runs` (`what` names the value among theirs), kept while they stay
        finished as they are; worked out every time while one of them is unfinished."""
        runs = (runs,) if isinstance(runs, Run) else tuple(runs)
        if not all(settled(run) for run in runs):
            return compute()
        key = (*((run.id, run.finished_at) for run in runs), what)
        now = time.monotonic()
        with self._lock:
            found = self._kept.get(key)
            if found is not None and (self.seconds is None or now - found[0] < self.seconds):
                self._kept.move_to_end(key)
                return self._out(found[2])
        value = compute()
        self._keep(key, value, now)
        return self._out(value)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._kept)

    def _keep(self, key: Hashable, value: T, now: float) -> None:
        nbytes = self.size(value) if self.size is not None else 0
        with self._lock:
            if key in self._kept:
                self._bytes -= self._kept.pop(key)[1]
            self._kept[key] = (now, nbytes, value)
            self._bytes += nbytes
            while len(self._kept) > 1 and self._over():
                self._bytes -= self._kept.popitem(last=False)[1][1]

    def _over(self) -> bool:
        if self.entries is not None and len(self._kept) > self.entries:
            return True
        if self.max_bytes is not None and self._bytes > self.max_bytes:
            return True
        if self.seconds is not None:  # the oldest used first: drop it once it has expired
            oldest = next(iter(self._kept.values()))[0]
            return time.monotonic() - oldest >= self.seconds
        return False

    def _out(self, value: T) -> T:
        return copy.deepcopy(value) if self.copies else value
