"""The engine's own CPU per quick item, without the database (issue 41).

`python bench/bench_item_step.py [--items 30000] [--repeat 5] [--against DIR]`: the run's
per-item step (`runs.lane.step_for`, what an embedded lane awaits for each item) over
`--items` items from 40 lanes on one loop, as `cobalt run` executes them but with no claim,
record or console: an async runner returning its input and a sync function evaluator (the
`noop` workload of `bench_engine.py`). Prints the CPU (user + system, every thread) per item
of the steps alone, the fastest of `--repeat` processes; `--against DIR` runs the same with
the Cobalt tree in DIR, interleaved. A whole `cobalt run` on a busy machine measures its
neighbours as much as itself: this isolates what changes in the engine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = """
import asyncio, gc, os, sys, tempfile, time
from pathlib import Path
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cobalt_project.settings")
import django
django.setup()
from cobalt import Dataset, Evaluator, experiment
from cobalt.config import load_config
from cobalt.experiments import collecting
from cobalt_app import engine, traces
from cobalt_app.aio import Threads
from cobalt_app.runs.lane import step_for
from cobalt_app.services import ItemSnapshot

N = int(sys.argv[1])

async def run(ctx):
    return ctx.item["input"]

with collecting() as found:
    experiment("step", Dataset(items=[{"id": 0, "input": "q"}]), run, concurrency=40,
               evaluators=[Evaluator(name="fn", type="function", fn=lambda ctx: 1.0)])
(noop,) = found


class Claim:
    def __init__(self, snapshot):
        self.snapshot = snapshot


async def main():
    folder = Path(tempfile.mkdtemp())
    env = engine.make_env(load_config(folder), db=None)
    step = step_for(noop, {"timeout": 60}, env, Threads("cobalt-runner", 40))
    claims = [Claim(ItemSnapshot(i, i, 0, str(i), {"id": i, "input": f"q{i}"})) for i in range(N)]

    async def lane(part):
        for claim in part:
            await step(claim)

    gc.freeze()  # as a run does (`embedded.collector_for_a_run`)
    gc.set_threshold(gc.get_threshold()[0] * 10)
    began = time.process_time()
    with traces.enabled(env.trace):
        await asyncio.gather(*(lane(claims[k::40]) for k in range(40)))
    print((time.process_time() - began) / N * 1e6)
    print(engine.__file__, file=sys.stderr)

asyncio.run(main())
"""


def once(tree: Path, items: int) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COBALT_")}
    env["PYTHONPATH"] = str(tree)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(items)],
        cwd=tree,  # `-c` puts the working directory first on the path
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    if not done.stderr.strip().splitlines()[-1].startswith(str(tree)):  # the tree's engine ran
        raise SystemExit(f"{tree}: another tree's engine ran: {done.stderr[-500:]}")
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=30_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--against", type=Path, help="Another Cobalt tree, interleaved.")
    args = parser.parse_args()
    trees = {"this": REPO, **({"against": args.against.resolve()} if args.against else {})}
    seen: dict[str, list[float]] = {label: [] for label in trees}
    for _ in range(args.repeat):
        for label, tree in trees.items():
            seen[label].append(once(tree, args.items))
    print(f"The per-item step alone: {args.items:,} items, 40 lanes (CPU µs per item)")
    for label, figures in seen.items():
        runs = ", ".join(f"{f:.1f}" for f in figures)
        print(f"  {label:<8} best {min(figures):5.1f}  (runs: {runs})")


if __name__ == "__main__":
    main()
