"""Team mode runs HTTP targets: a real `cobalt worker` process executes an experiment whose
runner is a FastAPI agent service's URL; the service exports its spans, with an API token, to
the team's `cobalt serve` (PostgreSQL), and they join the items the worker ran, their model
calls' tokens counted in the items'."""

from __future__ import annotations

import json

import pytest

from tests.team_harness import Team, wait_for
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
    team.create_user("ops", "team-pass-123")
    token = team.cli("token", "create", "ops").stdout.strip()
    port = int(team.serve().rsplit(":", 1)[1])
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
