"""Production traces become tests: requests no test made, exported by a FastAPI agent service
(its own process) to the real `cobalt serve`, appear on the traces page, and `cobalt traces
list|show|to-dataset` turn them into dataset items with their trace."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time

import httpx

from tests.conftest import cli_env, free_port
from tests.test_services import start_agent_service


def serve(project, port: int) -> subprocess.Popen:
    server = subprocess.Popen(
        [sys.executable, "-m", "cobalt_cli", "serve", "--port", str(port)],
        cwd=project.path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in server.stdout:
        if "Cobalt dashboard:" in line:
            return server
    raise AssertionError(f"cobalt serve exited with {server.wait(timeout=10)}")


def production_traces_become_tests(project, cobalt_cli, service_port: int, port: int) -> None:
    """Requests no test made, exported to `cobalt serve`, are listed, shown and added to a
    dataset."""
    server = serve(project, port)
    try:
        for city in ("Rome", "Lima", "Kyiv"):
            answer = httpx.post(
                f"http://127.0.0.1:{service_port}/ask", json={"question": f"weather in {city}?"}
            )
            assert answer.json() == {"answer": f"sunny in {city}"}
        deadline = time.monotonic() + 30
        page = ""
        while time.monotonic() < deadline:
            url = f"http://127.0.0.1:{port}/traces/?service=weather-agent"
            with contextlib.suppress(httpx.TransportError):
                page = httpx.get(url, timeout=30).text
            if all(f"weather in {city}?" in page for city in ("Rome", "Lima", "Kyiv")):
                break
            time.sleep(0.1)
        else:
            raise AssertionError(page)
        first = re.search(r'href="/traces/([0-9a-f]{32})/"', page).group(1)
        detail = httpx.get(f"http://127.0.0.1:{port}/traces/{first}/", timeout=30).text
        assert "get_weather" in detail and "chat gpt-4o-mini" in detail
        assert "Add to dataset" in detail
    finally:
        server.terminate()
        server.wait(timeout=10)
    listed = cobalt_cli(project, "traces", "list", "--service", "weather-agent")
    ids = [line.split()[0] for line in listed.stdout.splitlines() if "weather-agent" in line]
    assert len(ids) == 3, listed.stdout + listed.stderr
    shown = cobalt_cli(project, "traces", "show", ids[0])
    assert "Input:  weather in Kyiv?" in shown.stdout and "get_weather" in shown.stdout
    added = cobalt_cli(project, "traces", "to-dataset", *ids[:2], "--file", "datasets/prod.jsonl")
    assert "Added 2 items to datasets/prod.jsonl." in added.stdout, added.stdout + added.stderr
    lines = [json.loads(line) for line in (project.path / "datasets/prod.jsonl").open()]
    assert [line["input"] for line in lines] == ["weather in Kyiv?", "weather in Lima?"]
    assert lines[0]["expected_output"] == "sunny in Kyiv"
    assert lines[0]["metadata"]["service"] == "weather-agent"
    assert {s["name"] for s in lines[0]["trace"]} >= {"agent", "get_weather", "chat gpt-4o-mini"}


def test_production_traces_are_listed_shown_and_added_to_a_dataset(
    project, cobalt_cli, fake_provider_server
):
    port = free_port()
    service, service_port = start_agent_service(fake_provider_server, port)
    try:
        production_traces_become_tests(project, cobalt_cli, service_port, port)
    finally:
        service.terminate()
        service.wait(timeout=10)
