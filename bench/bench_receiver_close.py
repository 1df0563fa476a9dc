"""How long `cobalt run` of an HTTP target takes when its service exports its spans to the
run's OTLP receiver: the receiver closes once every item's trace is complete (its service's
root span under the run's request arrived), not after a quiet spell.

    python bench/bench_receiver_close.py [--items 100] [--root-delay 0] [--repeat 5]
                                         [--against /work/base]

The service (tests/fixtures/services/split_export_agent.py, its own process, the OTel SDK's
OTLP/HTTP exporter) sends each item's tool span as it ends and its `agent` span `--root-delay`
seconds later. Each repetition runs the real `cobalt run` (concurrency 10, [receiver] grace
20 s) in a fresh project, with this tree and, interleaved, the `--against` tree; prints the
command's wall time of each (median and all) and whether the summary warned of missing spans.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_http_target import free_port, wait_for_port  # the bench folder is sys.path[0]

REPO = Path(__file__).resolve().parent.parent
SERVICE = REPO / "tests" / "fixtures" / "services" / "split_export_agent.py"
EXPERIMENT = """
import cobalt

cobalt.experiment(
    "receiver-close",
    cobalt.Dataset(items=[{"input": f"weather in c{n}"} for n in range(ITEMS)]),
    cobalt.http_target(url="URL/ask", body={"question": "{{input}}"}, output="$.answer"),
    concurrency=10,
)
"""


def once(tree: Path, items: int, root_delay: float) -> tuple[float, bool]:
    """One `cobalt run` with the source tree `tree`: its wall time, and whether it warned."""
    receiver, port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("COBALT_")}
    env.update(
        PYTHONPATH=str(tree),
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{receiver}",
        ROOT_DELAY_S=str(root_delay),
    )
    service = subprocess.Popen([sys.executable, str(SERVICE), str(port)], env=env)
    project = Path(tempfile.mkdtemp(prefix="cobalt-bench-receiver-"))
    try:
        wait_for_port(port)
        (project / "experiments").mkdir()
        (project / "cobalt.toml").write_text(
            f'test_dir = "experiments"\n[receiver]\nport = {receiver}\ngrace = 20\n'
        )
        text = EXPERIMENT.replace("ITEMS", str(items)).replace("URL", f"http://127.0.0.1:{port}")
        (project / "experiments" / "bench.cobalt.py").write_text(text)
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "cobalt_cli", "run"],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - started
        if done.returncode != 0:
            sys.exit(f"cobalt run failed:\n{done.stdout}\n{done.stderr}")
        return wall, "⚠" in done.stdout
    finally:
        service.terminate()
        service.wait(timeout=10)
        subprocess.run(["rm", "-rf", str(project)], check=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=100)
    parser.add_argument("--root-delay", type=float, default=0.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--against", type=Path, help="Another Cobalt tree, interleaved.")
    args = parser.parse_args()
    trees = {"this": REPO, **({"against": args.against.resolve()} if args.against else {})}
    walls: dict[str, list[float]] = {name: [] for name in trees}
    warned: dict[str, int] = dict.fromkeys(trees, 0)
    for _ in range(args.repeat):
        for name, tree in trees.items():
            wall, warning = once(tree, args.items, args.root_delay)
            walls[name].append(wall)
            warned[name] += warning
    print(f"{args.items} items, root span {args.root_delay:g} s after the rest, best of order:")
    for name, times in walls.items():
        shown = ", ".join(f"{t:.2f}" for t in times)
        print(
            f"  {name:8} median {statistics.median(times):.2f} s the command ({shown}); "
            f"warned in {warned[name]} of {args.repeat}"
        )


if __name__ == "__main__":
    main()
