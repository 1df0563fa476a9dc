"""The run's OTLP receiver waits until every item's trace is complete: its service's span
under the run's request (the service's root, which ends last) has arrived, even when it comes
in an export of its own after the rest (`otlp_server.wait_for_spans`, `received.awaiting`).

A real service (stdlib HTTP, the OTel SDK's OTLP/HTTP exporter, its own process) exports each
item's tool span at once and its `agent` span later; the real `cobalt run` runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_env, free_port
from tests.helpers import run_id_of
from tests.test_services import wait_until_up

SERVICE = Path(__file__).parent / "fixtures" / "services" / "split_export_agent.py"
EXPERIMENT = """
import cobalt

cobalt.experiment(
    "split-service",
    cobalt.Dataset(items=[{"id": "paris", "input": "weather in Paris"},
                          {"id": "oslo", "input": "weather in Oslo"}]),
    cobalt.http_target(url="URL/ask", body={"question": "{{input}}"}, output="$.answer"),
    evaluators=[cobalt.Evaluator(name="any", type="function", fn=lambda ctx: 1.0)],
)
"""


def run_split_service(project, cobalt_cli, *, root_delay: float, grace: int):
    """`cobalt run` against the split-export service; what it printed and its export."""
    receiver = free_port()
    port = free_port()
    env = cli_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver}",
            "ROOT_DELAY_S": str(root_delay),
        }
    )
    service = subprocess.Popen(
        [sys.executable, str(SERVICE), str(port)], env=env, stderr=subprocess.PIPE
    )
    try:
        wait_until_up(port, service)
        project.write(
            "cobalt.toml",
            f'test_dir = "experiments"\n[receiver]\nport = {receiver}\ngrace = {grace}\n',
        )
        project.write(
            "experiments/split.cobalt.py", EXPERIMENT.replace("URL", f"http://127.0.0.1:{port}")
        )
        done = cobalt_cli(project, "run", "experiments/split.cobalt.py")
        assert done.returncode == 0, done.stdout + done.stderr
        exported = cobalt_cli(project, "export", run_id_of(done), "--format", "json")
    finally:
        service.terminate()
        service.wait(timeout=10)
    return done, json.loads(exported.stdout), receiver


def test_the_run_waits_for_a_root_span_that_comes_an_export_after_the_rest(project, cobalt_cli):
    # The agent span comes 1.5 s after its tool span: three times the quiet spell after which
    # the receiver used to close (0.5 s), within the grace (20 s).
    done, exported, _ = run_split_service(project, cobalt_cli, root_delay=1.5, grace=20)
    for item in exported["items"]:
        steps = item["trace"]
        client = steps[0]
        theirs = {s["name"]: s for s in steps if s.get("service") == "split-agent"}
        assert set(theirs) == {"agent", "get_weather"}, [s["name"] for s in steps]
        assert steps[theirs["agent"]["parent"]] is client
        assert steps[theirs["get_weather"]["parent"]]["name"] == "agent"
    facts = exported["summary"]["serviceSpans"]
    assert (facts["linked"], facts["noSpans"], facts["incomplete"], facts["note"]) == (
        2,
        0,
        0,
        None,
    )
    assert exported["serviceSpans"] == facts  # the results file's header too
    assert "⚠" not in done.stdout, done.stdout


def test_a_service_that_never_sends_its_root_span_ends_at_the_grace_with_a_warning(
    project, cobalt_cli
):
    done, exported, receiver = run_split_service(project, cobalt_cli, root_delay=-1, grace=2)
    note = (
        "2 items had not their service's span under the run's request (its root, which ends "
        "last) 2 s after the last item ([receiver] grace): their timelines, tokens and cost "
        "leave out the service's spans that did not come. Spans sent later to "
        f"http://127.0.0.1:{receiver}/v1/traces join the items only if a `cobalt serve` of "
        "this project listens there"
    )
    said = " ".join(done.stdout.split())
    assert f"⚠ {note}" in said, said
    facts = exported["summary"]["serviceSpans"]
    assert (facts["linked"], facts["noSpans"], facts["incomplete"]) == (2, 0, 2)
    assert facts["note"] == note and facts["waitedS"] == 2
    assert exported["serviceSpans"] == facts
    for item in exported["items"]:  # the tool spans that came are there
        assert [s["name"] for s in item["trace"] if s.get("service")] == ["get_weather"]


@pytest.mark.django_db
def test_a_trace_is_complete_once_each_request_has_its_services_root_in_either_order():
    from cobalt_app import otlp, received
    from cobalt_app.models import ItemResult, ReceivedTrace
    from tests.test_pages import keys, make_run
    from tests.test_services import _export

    early, late = ItemResult.objects.filter(
        run=make_run("svc", keys=keys(2), evaluators=())
    ).order_by("item_index")
    first, second = "e1" * 16, "e2" * 16

    def incomplete() -> list[str]:
        since = ReceivedTrace.objects.order_by("received_at")[0].received_at
        return sorted(received.incomplete_items(since).values_list("trace_id", flat=True))

    # Its root (under the first request) came before the item's result linked the trace, two
    # requests (turns) of one item: the second still awaits its root.
    otlp.receive(_export(first, [("a0" * 8, "c1" * 8)]), "application/x-protobuf", "")
    received.link_items([(early.id, first, "c1" * 8), (early.id, first, "c2" * 8)])
    assert ReceivedTrace.objects.get(trace_id=first).awaiting == "c2" * 8
    # Linked first, then a child span (not under the request), then the roots.
    received.link_items([(late.id, second, "c3" * 8)])
    otlp.receive(_export(second, [("b1" * 8, "b0" * 8)]), "application/x-protobuf", "")
    assert incomplete() == [first, second]
    otlp.receive(_export(second, [("b0" * 8, "c3" * 8)]), "application/x-protobuf", "")
    otlp.receive(_export(first, [("a9" * 8, "c2" * 8)]), "application/x-protobuf", "")
    assert incomplete() == []
