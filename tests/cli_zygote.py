"""`cobalt ...` for the tests, a fork away: a process that has imported the libraries every
command imports (Django, Typer, Rich, numpy) forks one child per command.

The child is a real, separate process: it takes the command's folder, environment, arguments
and standard streams, runs `cobalt_cli.main.main()` and exits as `python -m cobalt_cli` would
(non-daemon threads joined, `atexit` run, streams flushed). Only third-party libraries are
imported ahead: Cobalt's own modules read the environment, so the child imports them itself.
A test's command then costs a fork instead of an interpreter start and ~0.3 s of imports.

`run(args, cwd, env, input, timeout)` is `subprocess.run([python, -m, cobalt_cli, *args])`
with the same result; an environment the zygote cannot take (another PYTHONPATH) gets the
real thing. The zygote answers on a pipe, one JSON line per command.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

# Not the SDKs an agent imports, nor httpx: when they are first imported is what the tests of
# tracing and recording look at.
PRELOAD = (
    "django",
    "django.db.models",
    "django.urls",
    "django.http",
    "django.core.management",
    "typer",
    "rich.console",
    "rich.table",
    "numpy",
)
# What the child must see as the zygote saw it: modules found through it, bytecode written.
SAME = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED", "PYTHONSAFEPATH")


def serve(control_in: int, control_out: int) -> None:
    """The zygote's loop: a request per line, a fork per request, its exit status back."""
    import importlib

    for name in PRELOAD:  # each a dependency of Cobalt
        importlib.import_module(name)
    pending = b""
    while True:
        chunk = os.read(control_in, 65536)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            answer = _fork(request, (control_in, control_out))
            answer["id"] = request["id"]
            os.write(control_out, json.dumps(answer).encode() + b"\n")


def _fork(request: dict[str, Any], control: tuple[int, int]) -> dict[str, Any]:
    pid = os.fork()
    if pid == 0:
        for fd in control:
            os.close(fd)
        _child(request)
    pidfd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([pidfd], [], [], request["timeout"])
        if not ready:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(pidfd)
    return {"returncode": os.waitstatus_to_exitcode(status), "timed_out": not ready}


def _child(request: dict[str, Any]) -> None:
    code: Any = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path, flags in (
            (0, request["stdin"], os.O_RDONLY),
            (1, request["stdout"], os.O_WRONLY | os.O_TRUNC),
            (2, request["stderr"], os.O_WRONLY | os.O_TRUNC),
        ):
            opened = os.open(path, flags)
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)
        sys.argv = ["cobalt", *request["args"]]
        sys.path[0] = request["cwd"]  # `python -m` puts the working folder first
        from cobalt_cli.main import main

        main()
        code = 0
    except SystemExit as stop:
        code = stop.code
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        try:
            threading._shutdown()  # type: ignore[attr-defined]  # as the interpreter's exit
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code or 0)


class Zygote:
    """The test process's zygote, started on first use."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()
        self.ids = itertools.count(1)

    def _start(self) -> subprocess.Popen[bytes]:
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "import tests.cli_zygote as z; z.serve(0, 1)"],
                cwd=Path(__file__).resolve().parent.parent,
                env={**self.env, "OPENBLAS_NUM_THREADS": "1"},  # no BLAS threads to fork
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            atexit.register(self.process.kill)
        return self.process

    def takes(self, env: dict[str, str]) -> bool:
        return all(env.get(name) == self.env.get(name) for name in SAME)

    def run(
        self, args: list[str], cwd: Path, env: dict[str, str], input: str | None, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        with tempfile.TemporaryDirectory(prefix="cobalt-cli-") as folder:
            streams = {name: Path(folder, name) for name in ("stdin", "stdout", "stderr")}
            streams["stdin"].write_text(input or "")
            for name in ("stdout", "stderr"):
                streams[name].touch()
            request = {
                "id": next(self.ids),
                "args": args,
                "cwd": str(cwd),
                "env": env,
                "timeout": timeout,
                **{name: str(path) for name, path in streams.items()},
            }
            with self.lock:
                process = self._start()
                process.stdin.write(json.dumps(request).encode() + b"\n")
                process.stdin.flush()
                # An earlier request's answer is skipped: its caller was interrupted while it
                # waited (pytest-timeout), and the zygote answered after it had gone.
                answer = {}
                while answer.get("id") != request["id"]:
                    answer = json.loads(process.stdout.readline())
            out = streams["stdout"].read_text(errors="replace")
            err = streams["stderr"].read_text(errors="replace")
        command = [sys.executable, "-m", "cobalt_cli", *args]
        if answer["timed_out"]:
            raise subprocess.TimeoutExpired(command, timeout, output=out, stderr=err)
        return subprocess.CompletedProcess(command, answer["returncode"], out, err)


_zygote: Zygote | None = None


def run(
    args: list[str],
    cwd: Path,
    env: dict[str, str],
    input: str | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """`python -m cobalt_cli *args` in `cwd` with `env`, as `subprocess.run(...,
    capture_output=True, text=True)` returns it; forked from the zygote when it can be."""
    global _zygote
    if _zygote is None:
        from tests.conftest import cli_env

        _zygote = Zygote(cli_env())
    if not _zygote.takes(env):
        return subprocess.run(
            [sys.executable, "-m", "cobalt_cli", *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
        )
    return _zygote.run(args, cwd, env, input, timeout)
