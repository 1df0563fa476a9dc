"""An agent that is not Python: a Node.js service (plain `http`, the OpenTelemetry JS SDK and
its OTLP/HTTP exporter, installed from npm by the lock file under tests/fixtures/node_agent into
a cache folder) tested by the real `cobalt run`, its own spans in each item's timeline."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import cli_env, free_port
from tests.helpers import run_id_of
from tests.test_services import wait_until_up

FIXTURE = Path(__file__).parent / "fixtures" / "node_agent"
FILES = ("package.json", "package-lock.json", "agent.js")
EXPERIMENT = """
import cobalt

cobalt.experiment(
    "node-agent",
    cobalt.Dataset(items=[{"id": c, "input": {"question": f"tell me about {c}?"}}
                          for c in ("Paris", "Oslo", "Lima")]),
    cobalt.http_target(url="http://127.0.0.1:PORT/ask",
                       body={"question": "{{input.question}}"}, output="$.answer"),
    evaluators=[cobalt.Evaluator(name="lovely", type="function",
                                 fn=lambda ctx: {"score": float("lovely" in ctx.output)})],
)
"""


def installed_agent() -> Path:
    """The Node.js agent with its packages installed (`npm ci`), cached by the lock file."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js and npm are not installed")
    digest = hashlib.sha256(b"".join((FIXTURE / f).read_bytes() for f in FILES)).hexdigest()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    folder = cache / "cobalt-tests" / f"node-agent-{digest[:16]}"
    if not (folder / "node_modules" / "@opentelemetry" / "sdk-trace-node").is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            shutil.copy(FIXTURE / name, folder / name)
        done = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    return folder


def test_cobalt_run_tests_a_nodejs_agent_and_shows_its_spans(
    project, cobalt_cli, fake_provider_server
):
    folder = installed_agent()
    service_port, receiver_port = free_port(), free_port()
    env = cli_env(
        {
            "OPENAI_BASE_URL": fake_provider_server.openai_base_url,
            "OPENAI_API_KEY": "sk-test-openai-SECRET-0001",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver_port}",
        }
    )
    service = subprocess.Popen(
        ["node", "agent.js", str(service_port)], cwd=folder, env=env, stderr=subprocess.PIPE
    )
    try:
        wait_until_up(service_port, service)
        project.write(
            "cobalt.toml", f'test_dir = "experiments"\n[receiver]\nport = {receiver_port}\n'
        )
        project.write("experiments/node.cobalt.py", EXPERIMENT.replace("PORT", str(service_port)))
        run_id = run_id_of(cobalt_cli(project, "run", "experiments/node.cobalt.py"))
        exported = cobalt_cli(project, "export", run_id, "--format", "json")
    finally:
        service.terminate()
        service.wait(timeout=10)
    items = json.loads(exported.stdout)["items"]
    assert len(items) == 3
    for item in items:
        city = item["key"]
        assert item["output"]["output"] == f"{city} is lovely"
        assert item["evaluations"]["lovely"]["score"] == 1.0
        steps = item["trace"]
        shown = [(s["kind"], s["name"], s["parent"], s.get("service")) for s in steps]
        assert shown == [
            ("agent", f"POST http://127.0.0.1:{service_port}/ask", None, None),
            ("agent", "agent", 0, "node-agent"),
            ("tool", "lookup_city", 1, "node-agent"),
            ("llm", "chat gpt-4o-mini", 1, "node-agent"),
        ], shown
        assert json.loads(steps[2]["input"]) == {"city": city}
        assert steps[3]["inputTokens"] > 0 and steps[3]["model"] == "gpt-4o-mini"
