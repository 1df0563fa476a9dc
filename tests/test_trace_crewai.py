"""A real CrewAI crew, run by the real `cobalt run` in a CrewAI project's own virtualenv.

CrewAI requires mcp<2 and openai<3, so it cannot share the suite's environment. The
virtualenv is what a user gets from `pip install cobalt-agents crewai` (here the tested set
of `pip install -c constraints-crewai.txt '.[crewai]' crewai`, which scripts/lock writes),
built once into a cache folder named after that file and pyproject.toml: the first run of
this module builds it (a minute or two), later ones reuse it. Commands run with this
checkout first on PYTHONPATH, so a cached environment still tests the code in front of it.

Set SKIP_CREWAI_ENV=1 to skip the module on a machine that cannot build it (no package
index); CI refuses that.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from cobalt_app.pricing import estimate_cost
from tests.conftest import REPO, Project, cli_env
from tests.fake_provider import FakeProvider
from tests.helpers import run_id_of
from tests.trace_agents import CITIES, CREW_EXPERIMENT, tree

# The first test that needs the virtualenv builds it (a minute or two; pip alone: 13+ minutes).
pytestmark = pytest.mark.timeout(1800)

CONSTRAINTS = REPO / "constraints-crewai.txt"
SKIP = "SKIP_CREWAI_ENV"
CREWAI_QUIET = {"CREWAI_DISABLE_TELEMETRY": "true", "CREWAI_TRACING_ENABLED": "false"}
TREE = [
    ("other", "Crew.kickoff", None),
    ("agent", "Forecaster.forecast._execute_core", "other"),
    ("llm", "ChatCompletion", "agent"),
    ("tool", "get_weather", "agent"),
    ("llm", "ChatCompletion", "agent"),
]


def pinned(name: str) -> str:
    found = re.search(rf"^{re.escape(name)}==(\S+)", CONSTRAINTS.read_text(), re.MULTILINE)
    assert found, f"{name} is not pinned in {CONSTRAINTS.name}"
    return found.group(1)


# How the virtualenv is installed (part of its cache folder's name). --compile-bytecode as pip
# does: where PYTHONDONTWRITEBYTECODE is set (this machine and its CI set it), each `cobalt` of
# the environment compiled CrewAI, Django and the rest anew (`import crewai`: 6.0 s of CPU, 3.4
# s compiled).
UV_INSTALL = ("pip", "install", "-q", "--compile-bytecode")


def build(folder: Path) -> float:
    """A new virtualenv in `folder` with Cobalt, its crewai extra and CrewAI; the seconds taken.

    The set is the pinned one either way; uv (a dependency of CrewAI's, pinned there too)
    installs it with parallel downloads: 70 s where pip took 16 minutes on this project's
    loaded 2-core machine (docs/guide/install.md)."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, timeout=300)
    python = str(folder / "bin" / "python")
    for command in (
        [python, "-m", "pip", "install", "-q", f"uv=={pinned('uv')}"],
        [str(folder / "bin" / "uv"), *UV_INSTALL, "--python", python]
        + ["-c", str(CONSTRAINTS), f"{REPO}[crewai]", "crewai"],
    ):
        done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=1500)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return time.monotonic() - started


@pytest.fixture(scope="module")
def crewai_env() -> Path:
    """The CrewAI project's virtualenv (its bin folder), built once per constraints."""
    if os.environ.get(SKIP):
        if os.environ.get("CI"):
            pytest.fail(f"{SKIP} is set in CI, where the CrewAI tests must run")
        pytest.skip(f"{SKIP} is set: no CrewAI virtualenv (constraints-crewai.txt) built")
    recipe = " ".join(UV_INSTALL) + sys.version
    digest = hashlib.sha256(
        CONSTRAINTS.read_bytes() + (REPO / "pyproject.toml").read_bytes() + recipe.encode()
    ).hexdigest()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cobalt-tests"
    cache.mkdir(parents=True, exist_ok=True)
    folder = cache / f"crewai-{digest[:16]}"
    with (cache / f"{folder.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another suite on this machine may be building it
        if not (folder / "built").is_file():
            shutil.rmtree(folder, ignore_errors=True)  # a build that did not finish
            took = build(folder)
            (folder / "built").write_text(f"{took:.0f} s\n")
            print(f"built the CrewAI virtualenv in {took:.0f} s: {folder}")
    versions = subprocess.run(
        [
            str(folder / "bin" / "python"),
            "-c",
            "import importlib.metadata as m;"
            "print(m.version('crewai'), m.version('mcp'), m.version('openinference-instrumentation-crewai'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert versions == [
        pinned("crewai"),
        pinned("mcp"),
        pinned("openinference-instrumentation-crewai"),
    ]
    assert versions[1].startswith("1.")  # CrewAI's mcp<2: `cobalt mcp` runs on the 1.x SDK
    return folder / "bin"


def env_for(fake: FakeProvider) -> dict[str, str]:
    return cli_env(
        {
            "OPENAI_BASE_URL": fake.openai_base_url,
            "OPENAI_API_KEY": "sk-test-openai-SECRET-0001",
            **CREWAI_QUIET,
        }
    )


def cobalt(bin_dir: Path, project: Project, fake: FakeProvider, *args: str) -> str:
    done = subprocess.run(
        [str(bin_dir / "cobalt"), *args],
        cwd=project.path,
        env=env_for(fake),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def crew_runs(crewai_env, fake_provider_server, tmp_path_factory) -> dict:
    """The crew's three items run with `--record`, then `--replay`."""
    project = Project(tmp_path_factory.mktemp("crewai") / "proj")
    project.write("cobalt.toml", 'test_dir = "experiments"\n')
    project.write("experiments/crew.cobalt.py", CREW_EXPERIMENT)
    fake_provider_server.reset()
    recorded = cobalt(crewai_env, project, fake_provider_server, "run", "--record")
    requests = fake_provider_server.requests
    replayed = cobalt(crewai_env, project, fake_provider_server, "run", "--replay")
    assert len(fake_provider_server.requests) == len(requests)  # answered from the recording
    results = [json.loads(f.read_text()) for f in project.results_files()]
    by_id = {r["id"]: r for r in results}
    return {
        "project": project,
        "stdout": recorded,
        "recorded": by_id[run_id_of(recorded)],
        "replayed": by_id[run_id_of(replayed)],
        "requests": requests,
    }


@pytest.mark.slow
def test_a_crew_shows_its_own_tree_and_counts_each_model_call_once(crew_runs):
    run = crew_runs["recorded"]
    assert "not traced" not in crew_runs["stdout"]  # the crewai extra is there: no hint
    assert run["status"] == "completed" and run["summary"]["costComplete"] is True
    items = {i["key"]: i for i in run["items"]}
    assert sorted(items) == sorted(c.lower() for c in CITIES)
    for city in CITIES:
        item = items[city.lower()]
        assert item["output"]["output"] == f"tool said: sunny in {city}"
        steps = item["trace"]
        assert tree(steps) == TREE
        assert [s["parent"] for s in steps] == [None, 0, 1, 1, 1]
        for step in steps:  # 3 items at once: every step is about its own city
            assert set(re.findall(r"Paris|Lima|Oslo", step["input"] or "")) <= {city}, step
        tool = steps[3]
        assert json.loads(tool["input"]) == {"city": city}
        assert (tool["output"], tool["status"]) == (f"sunny in {city}", "ok")
        assert tool["durationMs"] is not None
        calls = [s for s in steps if s["kind"] == "llm"]
        # Each model call once: as many llm steps as requests the provider got for the city.
        asked = [r for r in crew_runs["requests"] if f"Weather in {city}?" in json.dumps(r["json"])]
        assert len(calls) == len(asked) == 2
        for call in calls:
            assert call["model"] == "gpt-4o-mini" and call["inputTokens"] > 0
            assert call["outputTokens"] > 0 and "tokensEstimated" not in call
            cost = estimate_cost("gpt-4o-mini", call["inputTokens"], call["outputTokens"])
            assert call["cost"] == pytest.approx(cost) and cost > 0
        assert item["tokens"] == sum(c["inputTokens"] + c["outputTokens"] for c in calls)
        assert item["cost"] == pytest.approx(sum(c["cost"] for c in calls))
        assert item["evaluations"]["tools"]["score"] == 1.0  # strict: the one real tool call
    summary = run["summary"]
    assert summary["totalTokens"] == sum(i["tokens"] for i in items.values())


@pytest.mark.slow
def test_a_replayed_crew_has_the_same_tree_tokens_and_outputs(crew_runs):
    recorded = {i["key"]: i for i in crew_runs["recorded"]["items"]}
    for item in crew_runs["replayed"]["items"]:
        before = recorded[item["key"]]
        assert (item["status"], item["output"]) == ("ok", before["output"])
        assert tree(item["trace"]) == TREE
        assert all(s.get("replayed") for s in item["trace"] if s["kind"] == "llm")
        assert item["tokens"] == before["tokens"]


@contextlib.contextmanager
def serving(bin_dir: Path, project: Project, fake: FakeProvider) -> Iterator[str]:
    """`cobalt serve --port 0` of the CrewAI environment; yields its URL."""
    server = subprocess.Popen(
        [str(bin_dir / "cobalt"), "serve", "--port", "0"],
        cwd=project.path,
        env=env_for(fake),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for line in server.stdout:
            if match := re.search(r"Cobalt dashboard: (http://\S+?)/ ", line):
                yield match.group(1)
                return
        raise AssertionError(f"cobalt serve exited with {server.wait(timeout=30)}")
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow
def test_the_item_page_shows_the_crew_as_a_tree(crew_runs, crewai_env, fake_provider_server):
    run_id = crew_runs["recorded"]["id"]
    with serving(crewai_env, crew_runs["project"], fake_provider_server) as url:
        run_page = httpx.get(f"{url}/runs/{run_id}/?view=all", timeout=60).text
        item_ids = sorted(set(re.findall(rf"/runs/{run_id}/items/(\d+)/", run_page)))
        assert len(item_ids) == len(CITIES)
        page = html.unescape(
            httpx.get(f"{url}/runs/{run_id}/items/{item_ids[0]}/", timeout=60).text
        )
    names = re.findall(r'<span class="step-name">([^<]*)', page)
    assert [n.replace("\u00a0", " ").rstrip() for n in names] == [
        "Crew.kickoff",
        "↳ Forecaster.forecast._execute_core",
        "  ↳ ChatCompletion",
        "  ↳ get_weather",
        "  ↳ ChatCompletion",
    ]
    assert "5 steps: 2 model calls, 1 tool call" in page


@pytest.mark.slow
def test_cobalt_mcp_serves_its_tools_beside_crewai(crew_runs, crewai_env, fake_provider_server):
    """`cobalt mcp` of the CrewAI environment (mcp 1.x), driven by the suite's 2.x client."""
    params = StdioServerParameters(
        command=str(crewai_env / "cobalt"),
        args=["mcp"],
        cwd=str(crew_runs["project"].path),
        env=env_for(fake_provider_server),
    )
    seen: dict[str, object] = {}

    async def session() -> None:
        with anyio.fail_after(120), (crew_runs["project"].path.parent / "mcp.log").open("a") as log:
            async with (
                stdio_client(params, errlog=log) as (read, write),
                ClientSession(read, write) as client,
            ):
                await client.initialize()
                seen["tools"] = {t.name for t in (await client.list_tools()).tools}
                resource = await client.read_resource("cobalt://experiments")
                seen["experiments"] = json.loads(resource.contents[0].text)["experiments"]

    anyio.run(session)
    assert {"cobalt_run", "cobalt_results", "cobalt_compare"} <= seen["tools"]
    assert seen["experiments"] == [{"path": "experiments/crew.cobalt.py", "name": "crew"}]


def test_a_crew_without_a_name_of_its_own_is_named_crew_kickoff():
    """CrewAI's instrumentation names such a crew after its random id: every item's and run's
    crew step would be named differently. A named crew, and other libraries' spans, keep theirs."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from cobalt_app import trace_spans

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    origin = time.time_ns()
    unnamed = "Crew_0920a733-a7b4-491e-a1d9-88ddb7d5185b.kickoff"
    for scope, name in [
        ("openinference.instrumentation.crewai", unnamed),
        ("openinference.instrumentation.crewai", "weather.kickoff"),
        ("my-app", unnamed),
    ]:
        with provider.get_tracer(scope).start_as_current_span(name):
            pass
    steps = trace_spans.steps_of(exporter.get_finished_spans(), origin)
    assert [s["name"] for s in steps] == ["Crew.kickoff", "weather.kickoff", unnamed]
