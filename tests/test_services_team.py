"""Team mode runs HTTP targets: a real `cobalt worker` process executes an experiment whose
runner is a FastAPI agent service's URL; the service exports its spans, with an API token, to
the team's `cobalt serve` (PostgreSQL), and they join the items the worker ran, their model
calls' tokens counted in the items'."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from tests.team_harness import Team, free_port, wait_for
from tests.test_services import start_agent_service

EXPERIMENT = """
import cobalt

cobalt.experiment(
    "weather-service-team",
    cobalt.Dataset(items=[
        {"id": "paris", "input": {"question": "weather in Paris?"}},
        {"id": "oslo", "input": {"question": "weather in Oslo?"}},
        {"id": "lima", "input": {"question": "weather in Lima?"}},
    ]),
    cobalt.http_target(
        url="http://127.0.0.1:PORT/ask",
        body={"question": "{{input.question}}"},
        output="$.answer",
    ),
)
"""


@pytest.mark.timeout(300)
def test_a_team_worker_runs_an_http_target_and_the_services_spans_join_its_items(
    team: Team, fake_provider_server
):
    created = subprocess.run(
        [sys.executable, "-m", "cobalt_cli", "createuser", "ops", "--password-stdin"],
        cwd=team.folder,
        env=team.env,
        input="team-pass-123\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert created.returncode == 0, created.stderr
    token = team.cli("token", "create", "ops").stdout.strip()
    port = free_port()
    server = team.cli_background("serve", "--host", "127.0.0.1", "--port", str(port))

    def answering() -> bool:
        assert server.popen.poll() is None, server.err()
        try:
            return httpx.get(f"http://127.0.0.1:{port}/login/", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(answering, timeout=60, what="cobalt serve", every=0.1)
    service, service_port = start_agent_service(fake_provider_server, port, api_token=token)
    try:
        (team.folder / "experiments" / "svc.cobalt.py").write_text(
            EXPERIMENT.replace("PORT", str(service_port))
        )
        team.start_worker("--concurrency", "3")
        done = team.cli("run", timeout=180)
        assert done.returncode == 0 and "3 ok" in done.stdout, done.stdout + done.stderr
        run_id = team.latest_run()
        assert team.run_row(run_id)["mode"] == "team"
        items: dict = {}

        def joined() -> bool:
            exported = team.cli("export", run_id, "--format", "json")
            items.update({i["key"]: i for i in json.loads(exported.stdout)["items"]})
            return all(
                any(s.get("service") == "weather-agent" and s["kind"] == "llm" for s in i["trace"])
                and i["tokens"] > 0
                for i in items.values()
            )

        wait_for(joined, timeout=60, what="the service's spans in every item", every=0.5)
    finally:
        service.terminate()
        service.wait(timeout=10)
    for key, item in items.items():
        steps = item["trace"]
        client = steps[0]
        assert client["name"] == f"POST http://127.0.0.1:{service_port}/ask", key
        theirs = {s["name"]: s for s in steps if s.get("service") == "weather-agent"}
        assert {"agent", "get_weather", "chat gpt-4o-mini"} <= set(theirs), key
        assert theirs["get_weather"]["output"] == f"sunny in {key.title()}"
        call = theirs["chat gpt-4o-mini"]
        assert item["tokens"] == call["inputTokens"] + call["outputTokens"]
        assert item["output"]["output"] == f"sunny in {key.title()}"
