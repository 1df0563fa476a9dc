"""How fast `cobalt` starts (issue 18). Run: `python bench/bench_cli.py [--repeat 15]`.

Times whole processes, as a user waits for them, in a throwaway project with two runs of
the example experiment (`cobalt init`, `cobalt run` twice): `cobalt --help`, `--version`,
`history` and `compare`, next to `python -c pass` (the interpreter alone) and
`pytest --version`, the yardstick the issue names. Prints the minimum (the start-up cost
without the machine's noise) and the median of `--repeat` runs, interleaved so a busy
moment slows every command alike.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_engine import compile_sources

RUN_IDS = "SELECT id FROM cobalt_app_run ORDER BY created_at"


def cobalt(*args: str) -> list[str]:
    return [str(Path(sys.executable).with_name("cobalt")), *args]


def make_project(folder: Path) -> tuple[str, str]:
    """A project with two runs of the example experiment; their ids, oldest first."""
    subprocess.run(cobalt("init"), cwd=folder, check=True, capture_output=True)
    for _ in range(2):
        subprocess.run(cobalt("run", "-q"), cwd=folder, check=True, capture_output=True)
    with sqlite3.connect(folder / ".cobalt" / "history.db") as db:
        oldest, newest = [row[0] for row in db.execute(RUN_IDS)]
    return oldest, newest


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    compile_sources()
    folder = Path(tempfile.mkdtemp(prefix="cobalt-bench-cli-"))
    try:
        a, b = make_project(folder)
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "pytest --version": [str(Path(sys.executable).with_name("pytest")), "--version"],
            "cobalt --help": cobalt("--help"),
            "cobalt --version": cobalt("--version"),
            "cobalt history": cobalt("history"),
            "cobalt compare A B": cobalt("compare", a, b),
        }
        env = {k: v for k, v in os.environ.items() if not k.startswith("COBALT_")}
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.repeat):
            for name, argv in commands.items():
                start = time.perf_counter()
                subprocess.run(argv, cwd=folder, env=env, check=True, capture_output=True)
                times[name].append((time.perf_counter() - start) * 1000)
        yardstick = min(times["pytest --version"])
        print(f"{'command':22} {'min ms':>8} {'median ms':>10} {'min / pytest --version':>24}")
        for name, values in times.items():
            print(
                f"{name:22} {min(values):8.1f} {statistics.median(values):10.1f}"
                f" {min(values) / yardstick:23.2f}×"
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
