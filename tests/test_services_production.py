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
from tests.helpers import run_id_of
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
        deadline = (
            time.monotonic() + 120
        )  # the exporter's and the server's turn, on a loaded machine
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
        assert "Log in to add to dataset" in detail  # it writes a file: anonymous, a login
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


REPLAYED = """
from openai import OpenAI

from cobalt import Dataset, Evaluator, experiment


@experiment(
    "weather-from-production",
    Dataset.from_file("datasets/production.jsonl"),
    evaluators=[Evaluator(name="same", type="exact-match", field="expected_output")],
)
def run(ctx):
    # The service's agent, in-process: the model call its production traces hold.
    city = ctx.item["input"].split()[-1].strip("?")
    reply = OpenAI().chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": f"ECHO: sunny in {city}"}],
        temperature=0,
    )
    return reply.choices[0].message.content
"""
CITIES = ("Rome", "Lima", "Kyiv", "Oslo", "Pune")


def test_production_traces_become_items_that_replay_offline(
    project, cobalt_cli, fake_provider_server
):
    """Five requests exported by the service's OpenTelemetry SDK become dataset items with a
    recording of their model calls; the experiment replays them with the network refused."""
    port = free_port()
    service, service_port = start_agent_service(fake_provider_server, port)
    server = serve(project, port)
    try:
        for city in CITIES:
            url = f"http://127.0.0.1:{service_port}/ask"
            assert httpx.post(url, json={"question": f"weather in {city}?"}).status_code == 200
        deadline, ids = time.monotonic() + 120, []
        while time.monotonic() < deadline and len(ids) < len(CITIES):
            listed = cobalt_cli(project, "traces", "list", "--service", "weather-agent")
            ids = re.findall(r"^\s*([0-9a-f]{16})\s", listed.stdout, re.MULTILINE)
    finally:
        server.terminate()
        server.wait(timeout=10)
        service.terminate()
        service.wait(timeout=10)
    assert len(ids) == len(CITIES), listed.stdout
    added = cobalt_cli(project, "traces", "to-dataset", *ids)
    assert "Added 5 items to datasets/production.jsonl." in added.stdout, added.stderr
    assert "5 of them hold their model calls: they replay offline" in added.stdout
    project.write("experiments/prod.cobalt.py", REPLAYED)
    refused = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens: no provider to reach
    replayed = cobalt_cli(
        project,
        "run",
        "experiments/prod.cobalt.py",
        "--replay",
        env={"OPENAI_BASE_URL": refused, "OPENAI_API_KEY": ""},
    )
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    exported = cobalt_cli(project, "export", run_id_of(replayed), "--format", "json")
    items = json.loads(exported.stdout)["items"]
    assert sorted(i["output"]["output"] for i in items) == sorted(f"sunny in {c}" for c in CITIES)
    assert all(i["status"] == "ok" and i["evaluations"]["same"]["score"] == 1.0 for i in items)
    assert all(i["trace"][0]["replayed"] is True for i in items)
    listed = cobalt_cli(project, "recordings", "list")
    assert "(production traces: any experiment)" in listed.stdout
