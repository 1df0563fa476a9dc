"""The one per-process memo of what pages work out from finished runs (`run_memo.RunMemo`):
kept per run id and `finished_at`, never for an unfinished run, bounded in entries, bytes and
age, a copy per caller when asked, and safe for threads."""

from __future__ import annotations

import threading
from datetime import timedelta

from django.utils import timezone

from cobalt_app.models import Run
from cobalt_app.run_memo import RunMemo


def finished(run_id: str = "r1", status: str = "completed", **extra) -> Run:
    return Run(id=run_id, status=status, finished_at=timezone.now(), **extra)


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, value=None):
        def compute():
            self.calls += 1
            return value if value is not None else [self.calls]

        return compute


def test_a_finished_runs_value_is_kept_until_it_is_finalised_again():
    memo, count = RunMemo(entries=8), Counter()
    run = finished()
    assert memo.get(run, "list", count()) == [1]
    assert memo.get(run, "list", count()) == [1]
    assert memo.get(run, "other", count()) == [2]  # another value of the run
    run.finished_at += timedelta(seconds=1)  # re-judged: finalised again
    assert memo.get(run, "list", count()) == [3]
    assert count.calls == 3


def test_an_unfinished_runs_value_is_worked_out_every_time():
    memo, count = RunMemo(entries=8), Counter()
    for status in ("queued", "running"):
        run = finished(status=status)
        assert memo.get(run, "list", count()) != memo.get(run, "list", count())
    no_end = Run(id="r2", status="interrupted", finished_at=None)
    memo.get(no_end, "list", count())
    memo.get(no_end, "list", count())
    assert count.calls == 6 and len(memo) == 0
    # A pair: kept only when both runs are finished.
    a, b = finished("a"), finished("b", status="running")
    memo.get((a, b), "pair", count())
    memo.get((a, b), "pair", count())
    assert count.calls == 8 and len(memo) == 0


def test_the_least_recently_used_goes_first_past_the_entries_or_the_bytes():
    memo, count = RunMemo(entries=2), Counter()
    a, b, c = finished("a"), finished("b"), finished("c")
    memo.get(a, "x", count())
    memo.get(b, "x", count())
    memo.get(a, "x", count())  # a used last: b goes first
    memo.get(c, "x", count())
    assert count.calls == 3
    memo.get(a, "x", count())
    assert count.calls == 3  # still kept
    memo.get(b, "x", count())
    assert count.calls == 4  # dropped, worked out again

    sized = RunMemo(max_bytes=100, size=len)
    sized.get(a, "x", count("a" * 60))
    sized.get(b, "x", count("b" * 30))
    assert len(sized) == 2
    sized.get(c, "x", count("c" * 30))  # 120 bytes: the oldest (a) goes
    assert len(sized) == 2
    big = sized.get(a, "y", count("d" * 500))  # the newest is kept whatever its size
    assert big == "d" * 500 and len(sized) == 1


def test_values_expire_after_their_seconds():
    memo, count = RunMemo(entries=8, seconds=0), Counter()
    run = finished()
    memo.get(run, "x", count())
    memo.get(run, "x", count())
    assert count.calls == 2


def test_copies_let_a_caller_change_its_value():
    shared, copied, count = RunMemo(entries=8), RunMemo(entries=8, copies=True), Counter()
    run = finished()
    mine = copied.get(run, "x", count())
    mine.append("changed")
    assert copied.get(run, "x", count()) == [1]
    assert shared.get(run, "x", count()) is shared.get(run, "x", count())


def test_threads_share_it_within_its_bounds():
    memo = RunMemo(entries=16, max_bytes=64, size=len)
    runs = [finished(f"r{n}") for n in range(40)]
    failures: list[BaseException] = []

    def visit(offset: int) -> None:
        try:
            for step in range(400):
                run = runs[(offset + step) % len(runs)]
                value = memo.get(run, "x", lambda run=run: run.id.encode())
                assert value == run.id.encode()
        except BaseException as exc:  # noqa: BLE001 (reported below)
            failures.append(exc)

    threads = [threading.Thread(target=visit, args=(n * 7,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert 1 <= len(memo) <= 16
    assert memo._bytes == sum(entry[1] for entry in memo._kept.values()) <= 64
