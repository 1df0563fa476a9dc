"""Agents that run as services: HTTP targets, trace context, the OTLP receiver.

The door test runs the real `cobalt run` against a FastAPI agent service in its own process,
which exports its spans to the receiver `cobalt run` opens; the receiver's answers (protobuf,
JSON, gzip, 400, 413, 429, 401) are checked in-process through Django's test client.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest
from django.test import Client
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider

from cobalt.targets import TargetError, http_target, openai_target
from cobalt_app import otlp, received
from cobalt_app.models import ReceivedTrace
from tests.conftest import cli_env, free_port, served
from tests.helpers import run_id_of

SERVICE = Path(__file__).parent / "fixtures" / "services" / "fastapi_agent.py"
EXPERIMENT = """
import cobalt

dataset = cobalt.Dataset(items=[
    {"id": "paris", "input": {"question": "weather in Paris?"}},
    {"id": "oslo", "input": {"question": "weather in Oslo?"}},
])
cobalt.experiment(
    "weather-service",
    dataset,
    cobalt.http_target(
        url="http://127.0.0.1:PORT/ask",
        headers={"Authorization": "Bearer ${AGENT_TOKEN}"},
        body={"question": "{{input.question}}"},
        output="$.answer",
    ),
    evaluators=[cobalt.Evaluator(name="sunny", type="function",
        fn=lambda ctx: {"score": float("sunny" in ctx.output)})],
)
"""
TOKEN = "agent-token-SECRET-77"


def wait_until_up(port: int, process: subprocess.Popen) -> None:
    """Until the service accepts connections (no request: its spans would go nowhere yet)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("the service did not start")


def start_agent_service(
    fake_provider, exporter_port: int, api_token: str = "", export_delay_ms: int = 50
) -> tuple[subprocess.Popen, int]:
    """The FastAPI agent service in its own process, exporting to 127.0.0.1:`exporter_port`
    (with `api_token`, as team mode's receiver needs) every `export_delay_ms`; returns it
    (started: it accepts connections) and its port."""
    port = free_port()
    env = cli_env(
        {
            "OPENAI_BASE_URL": fake_provider.openai_base_url,
            "OPENAI_API_KEY": "sk-test-openai-SECRET-0001",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{exporter_port}",
            "AGENT_EXPORT_DELAY_MS": str(export_delay_ms),
        }
    )
    if api_token:
        env["OTEL_EXPORTER_OTLP_HEADERS"] = f"Authorization=Bearer%20{api_token}"
    service = subprocess.Popen(
        [sys.executable, str(SERVICE), str(port)], env=env, stderr=subprocess.PIPE
    )
    try:
        wait_until_up(port, service)
    except BaseException:
        service.kill()
        raise
    return service, port


def run_against_service(
    project, cobalt_cli, fake_provider, *, grace: int = 10, export_delay_ms: int = 50
) -> tuple[subprocess.CompletedProcess, dict]:
    """`cobalt run` of EXPERIMENT against the FastAPI agent service (exporting to the run's
    receiver every `export_delay_ms`), then its run exported: what it printed, the export."""
    receiver_port = free_port()
    service, service_port = start_agent_service(
        fake_provider, receiver_port, export_delay_ms=export_delay_ms
    )
    try:
        project.write(
            "cobalt.toml",
            f'test_dir = "experiments"\n[receiver]\nport = {receiver_port}\ngrace = {grace}\n',
        )
        project.write("experiments/svc.cobalt.py", EXPERIMENT.replace("PORT", str(service_port)))
        done = cobalt_cli(project, "run", "experiments/svc.cobalt.py", env={"AGENT_TOKEN": TOKEN})
        exported = cobalt_cli(project, "export", run_id_of(done), "--format", "json")
    finally:
        service.terminate()
        service.wait(timeout=10)
    return done, json.loads(exported.stdout)


def test_cobalt_run_tests_a_fastapi_service_and_shows_its_spans(
    project, cobalt_cli, fake_provider_server
):
    _, exported = run_against_service(project, cobalt_cli, fake_provider_server)
    items, summary = {i["key"]: i for i in exported["items"]}, exported["summary"]
    paris = items["paris"]
    assert (
        paris["output"]["output"] == "sunny in Paris"
        and paris["evaluations"]["sunny"]["score"] == 1.0
    )
    steps = paris["trace"]
    client = steps[0]
    assert client["kind"] == "agent"
    assert re.fullmatch(r"POST http://127\.0\.0\.1:\d+/ask", client["name"]), client["name"]
    assert len(client["traceId"]) == 32
    theirs = {s["name"]: (n, s) for n, s in enumerate(steps) if s.get("service")}
    assert {s["service"] for _, s in theirs.values()} == {"weather-agent"}
    agent_at, agent = theirs["agent"]
    chain, parent = [], agent["parent"]
    while parent is not None:
        chain.append(steps[parent]["name"])
        parent = steps[parent]["parent"]
    # Under FastAPI's own spans, under the client's request.
    assert chain[-2:] == ["POST /ask", client["name"]], chain
    tool, call = theirs["get_weather"][1], theirs["chat gpt-4o-mini"][1]
    assert tool["kind"] == "tool" and tool["parent"] == agent_at
    assert call["kind"] == "llm" and call["parent"] == agent_at
    assert call["inputTokens"] > 0 and tool["input"] == '{"city": "Paris"}'
    # The service's model call counts in the item's tokens and cost, and in the run's.
    assert paris["tokens"] == call["inputTokens"] + call["outputTokens"]
    assert paris["cost"] == pytest.approx(call["cost"]) and paris["cost"] > 0
    assert summary["totalTokens"] == sum(i["tokens"] for i in items.values())
    assert agent["startMs"] >= client["startMs"]
    database = project.db_path.read_bytes() + project.db_path.with_suffix(".db-wal").read_bytes()
    assert TOKEN.encode() not in database and b"sk-test-openai-SECRET" not in database


def test_the_summary_of_cobalt_run_waits_for_the_services_spans(
    project, cobalt_cli, fake_provider_server
):
    # The service exports 3 s after its requests (an SDK's default: 5 s), after the last item:
    # the terminal's summary comes once its spans are in, with their model calls' tokens (it
    # was printed as the items ended, with none of them).
    done, exported = run_against_service(
        project, cobalt_cli, fake_provider_server, grace=30, export_delay_ms=3000
    )
    tokens = exported["summary"]["totalTokens"]
    assert tokens > 0
    assert f"Total tokens:   {tokens:,} (" in done.stdout, done.stdout


@pytest.mark.django_db(transaction=True)
class TestReceiver:
    def request(self, trace_id: str = "ab" * 16, spans: int = 3) -> ExportTraceServiceRequest:
        export = ExportTraceServiceRequest()
        resource_spans = export.resource_spans.add()
        attribute = resource_spans.resource.attributes.add()
        attribute.key, attribute.value.string_value = "service.name", "shop-agent"
        scope = resource_spans.scope_spans.add()
        for n in range(spans):
            span = scope.spans.add()
            span.trace_id = bytes.fromhex(trace_id)
            span.span_id = bytes.fromhex(f"{n + 1:016x}")
            if n:
                span.parent_span_id = bytes.fromhex(f"{1:016x}")
            span.name = "agent" if n == 0 else f"step {n}"
            span.start_time_unix_nano = 1_700_000_000_000_000_000 + n * 1_000_000
            span.end_time_unix_nano = span.start_time_unix_nano + 5_000_000
            for key, value in (("input.value", "where is my order"), ("api_key", "sk-live-XYZ")):
                kv = span.attributes.add()
                kv.key, kv.value.string_value = key, value
        return export

    def post(self, body: bytes, kind: str = "application/x-protobuf", **headers: str):
        return Client().post("/v1/traces", body, content_type=kind, **headers)

    def test_protobuf_and_gzip_are_stored_as_a_production_trace(self):
        body = gzip.compress(self.request().SerializeToString())
        answer = self.post(body, HTTP_CONTENT_ENCODING="gzip")
        assert answer.status_code == 200 and answer["Content-Type"] == "application/x-protobuf"
        (trace,) = received.production_traces()
        assert (trace.service, trace.name, trace.span_count) == ("shop-agent", "agent", 3)
        assert trace.input == "where is my order"
        assert "sk-live-XYZ" not in json.dumps(trace.attributes)
        steps = received.steps_of_trace(trace)
        assert [s["parent"] for s in steps] == [None, 0, 0]
        again = self.post(self.request().SerializeToString())  # a retried export: kept once
        assert again.status_code == 200
        assert ReceivedTrace.objects.get().spans.count() == 3

    def test_production_traces_filter_and_expire(self):
        from datetime import timedelta

        from cobalt_app import production_traces
        from cobalt_app.models import ReceivedSpan

        self.post(self.request("01" * 16).SerializeToString())
        failed = self.request("02" * 16)
        failed.resource_spans[0].scope_spans[0].spans[1].status.code = 2  # ERROR
        user = failed.resource_spans[0].scope_spans[0].spans[0].attributes.add()
        user.key, user.value.int_value = "user.id", 42
        self.post(failed.SerializeToString())
        assert [t.trace_id for t in production_traces.traces(status="error")] == ["02" * 16]
        assert production_traces.traces(attributes=["user.id=42"]).count() == 1
        assert production_traces.traces(service="shop-agent").count() == 2
        assert production_traces.traces(service="other").count() == 0
        with pytest.raises(production_traces.TraceFilterError, match="key=value"):
            production_traces.traces(attributes=["user.id"])
        assert production_traces.clean(timedelta(days=1)) == 0
        assert production_traces.clean(timedelta(0)) == 2
        assert not ReceivedSpan.objects.exists()

    def test_json_with_hex_ids_is_read(self):
        from google.protobuf import json_format

        data = json_format.MessageToDict(self.request("cd" * 16, spans=2))
        for span in data["resourceSpans"][0]["scopeSpans"][0]["spans"]:
            for key in ("traceId", "spanId", "parentSpanId"):
                if key in span:
                    import base64

                    span[key] = base64.b64decode(span[key]).hex()
        answer = self.post(json.dumps(data).encode(), "application/json")
        assert answer.status_code == 200, answer.content
        assert ReceivedTrace.objects.get().trace_id == "cd" * 16

    def test_bad_payloads_are_refused_with_a_reason(self):
        bad = self.post(b"\xff\x00garbage")
        assert bad.status_code == 400 and b"not an OTLP protobuf" in bad.content
        kind = self.post(b"{}", "text/plain")
        assert kind.status_code == 400 and b"application/x-protobuf" in kind.content
        zipped = self.post(b"not gzip", HTTP_CONTENT_ENCODING="gzip")
        assert zipped.status_code == 400 and b"gzip" in zipped.content
        bomb = gzip.compress(b"\x00" * (otlp.MAX_BYTES + 10))
        assert self.post(bomb, HTTP_CONTENT_ENCODING="gzip").status_code == 413
        assert not ReceivedTrace.objects.exists()

    def test_a_busy_receiver_sheds_with_retry_after(self):
        gate = otlp.Gate(limit=10)
        gate.enter(8)  # another request in flight
        answer = otlp.answer(self.request().SerializeToString(), "application/x-protobuf", "", gate)
        assert answer.status == 429 and answer.headers == {"Retry-After": "1"}
        gate.leave(8)
        assert (
            otlp.answer(
                self.request().SerializeToString(), "application/x-protobuf", "", gate
            ).status
            == 200
        )

    def test_requests_stored_together_do_not_fail_for_a_bad_one(self):
        from concurrent.futures import Future, ThreadPoolExecutor

        bodies = [self.request(f"{n + 1:02x}" * 16).SerializeToString() for n in range(8)]
        with ThreadPoolExecutor(8) as pool:  # through the one writer, from 8 threads at once
            codes = list(pool.map(lambda body: self.post(body).status_code, bodies))
        assert codes == [200] * 8 and ReceivedTrace.objects.count() == 8
        good, bad = (otlp.spans_of(self.request(t))[0] for t in ("aa" * 16, "bb" * 16))
        bad = [bad[0]._replace(start_ns=2**64 - 1)]  # a time the database cannot hold
        done: list[Future] = [Future(), Future()]
        otlp.Writer()._write([(bad, done[0]), (good, done[1])])  # one group, as under load
        assert done[1].result() is None and isinstance(done[0].exception(), Exception)
        assert ReceivedTrace.objects.filter(trace_id="aa" * 16).exists()
        assert not ReceivedTrace.objects.filter(trace_id="bb" * 16).exists()

    def test_team_mode_needs_a_token(self, monkeypatch):
        from django.contrib.auth.models import User
        from rest_framework.authtoken.models import Token

        monkeypatch.setenv("COBALT_SERVE_HOST", "0.0.0.0")
        body = self.request().SerializeToString()
        assert self.post(body).status_code == 401
        key = Token.objects.create(user=User.objects.create(username="otel")).key
        assert self.post(body, HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200


def test_bad_declarations_name_the_field(monkeypatch):
    with pytest.raises(TargetError, match="`url`"):
        http_target("localhost:8000")
    with pytest.raises(TargetError, match="`method`"):
        http_target("http://x", method="FETCH")
    with pytest.raises(TargetError, match="`output`"):
        http_target("http://x", output="answer")
    with pytest.raises(TargetError, match="environment variable"):
        http_target("http://x", headers={"Authorization": "Bearer sk-abcdefghijklmnop1234"})
    target = openai_target("http://svc/v1", "my-agent")
    assert target.url == "http://svc/v1/chat/completions" and target.usage


class _Service(BaseHTTPRequestHandler):
    """/echo answers the request (body, headers); /sse streams; /flaky fails once; /broken
    fails with a body holding the token it was sent."""

    calls: ClassVar[dict[str, int]] = {}

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.calls[self.path] = self.calls.get(self.path, 0) + 1
        if self.path == "/sse":
            events = [{"delta": "Hel"}, {"delta": "lo"}, {"other": 1}]
            text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            return self.answer(200, text, "text/event-stream")
        if self.path == "/flaky" and self.calls[self.path] == 1:
            return self.answer(503, "busy", headers={"Retry-After": "0"})
        if self.path == "/broken":
            return self.answer(500, f"crashed with {self.headers['Authorization']}")
        echo = {"body": json.loads(body or "null"), "headers": dict(self.headers)}
        return self.answer(200, json.dumps({"answer": echo}), "application/json")

    def answer(self, status: int, text: str, kind: str = "text/plain", headers=None) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def service_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


SILENT = """
import cobalt

cobalt.experiment(
    "silent-service",
    cobalt.Dataset(items=[{"input": "a"}, {"input": "b"}]),
    cobalt.http_target(url="URL/echo", output="$.answer.body"),
    evaluators=[cobalt.Evaluator(name="any", type="function", fn=lambda ctx: 1.0)],
)
"""


def test_a_service_that_exports_no_spans_is_a_warning_naming_where_to_export(
    project, cobalt_cli, service_url
):
    # The service answers and exports nothing: after [receiver] grace, the run's summary
    # warns, naming the run's receiver and the project's running `cobalt serve`.
    receiver = free_port()
    project.write(
        "cobalt.toml", f'test_dir = "experiments"\n[receiver]\nport = {receiver}\ngrace = 1\n'
    )
    project.write("experiments/silent.cobalt.py", SILENT.replace("URL", service_url))
    with served(project) as dashboard:
        done = cobalt_cli(project, "run", "experiments/silent.cobalt.py")
    assert done.returncode == 0, done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    summary = said[said.index("Results: silent-service") : said.index("Run ID:")]
    assert (
        "⚠ no service exported spans within 1 s of the last item to this run's receiver "
        f"(http://127.0.0.1:{receiver}/v1/traces) or this project's `cobalt serve` "
        f"({dashboard}/v1/traces)"
    ) in summary, said
    assert f"OTEL_EXPORTER_OTLP_ENDPOINT at http://127.0.0.1:{receiver} (or {dashboard})" in summary
    assert "no service exported" not in done.stderr  # said once, in the summary


@pytest.mark.django_db
def test_each_run_is_told_how_many_of_its_items_had_no_spans_when_some_did(tmp_path):
    from cobalt.config import load_config
    from cobalt_app import otlp_server
    from cobalt_app.models import ItemResult, Run
    from tests.test_pages import keys, make_run

    receiver = otlp_server.RunReceiver(otlp_server.start(0), grace=0.2)
    run, other = make_run("one", keys=keys(3), evaluators=()), make_run("two", keys=keys(1))
    items = ItemResult.objects.filter(run__in=[run, other]).order_by("run__name", "item_index")
    received.link_items([(item.id, f"{n + 1:032x}", "c" * 16) for n, item in enumerate(items)])
    # The first item's service exported all its spans (to a `cobalt serve`: this receiver got
    # nothing), and the other run's.
    ReceivedTrace.objects.filter(item__in=[items[0], items[3]]).update(span_count=2, awaiting="")
    host, port = receiver.server.server_address[:2]
    notices = receiver.finish(load_config(tmp_path))
    note = (
        "2 items had no span from their service 0.2 s after the last item "
        "([receiver] grace): tokens and cost count none of their service's model calls. Spans "
        f"sent later to http://{host}:{port}/v1/traces join the items only if a `cobalt serve` "
        "of this project listens there"
    )
    assert notices == {run.id: note}
    # Stored in the run's summary, for every door: the other run's items all had theirs.
    stored = Run.objects.get(id=run.id).summary["serviceSpans"]
    assert (stored["linked"], stored["noSpans"], stored["incomplete"]) == (3, 2, 0)
    assert stored["note"] == note and stored["receiver"] == f"http://{host}:{port}"
    assert Run.objects.get(id=other.id).summary["serviceSpans"]["note"] is None
    shown_everywhere(run.id, tmp_path, note)
    # The third item's service exports later, to a `cobalt serve` (its tool span, then its root
    # under the run's request): the stored warning counts one item less, then none.
    third = f"{3:032x}"
    otlp.receive(_export(third, [("d1" * 8, "d0" * 8)]), "application/x-protobuf", "")
    stored = Run.objects.get(id=run.id).summary["serviceSpans"]
    assert (stored["noSpans"], stored["incomplete"]) == (1, 1)
    otlp.receive(_export(third, [("d0" * 8, "c" * 16)]), "application/x-protobuf", "")
    stored = Run.objects.get(id=run.id).summary["serviceSpans"]
    assert (stored["noSpans"], stored["incomplete"]) == (1, 0)
    assert stored["note"].startswith("1 item had no span from their service 0.2 s after")


def _export(trace_id: str, spans: list[tuple[str, str]]) -> bytes:
    """An OTLP export of (span id, parent span id) spans of one trace."""
    export = ExportTraceServiceRequest()
    scope = export.resource_spans.add().scope_spans.add()
    for n, (span_id, parent) in enumerate(spans):
        span = scope.spans.add()
        span.trace_id, span.span_id = bytes.fromhex(trace_id), bytes.fromhex(span_id)
        span.parent_span_id = bytes.fromhex(parent)
        span.name = f"span {n}"
        span.start_time_unix_nano = 1_700_000_000_000_000_000 + n
        span.end_time_unix_nano = span.start_time_unix_nano + 1000
    return export.SerializeToString()


def shown_everywhere(run_id: str, project_dir, note: str) -> None:
    """The run's stored warning in its API detail (and the schema's field), its MCP header and
    summary, its page and the terminal's summary."""
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    from cobalt.config import load_config
    from cobalt_app.models import Run
    from cobalt_cli.mcp.project import Project as McpProject
    from cobalt_cli.mcp.reports import describe_run, header_of
    from cobalt_cli.reporter import warnings

    run = Run.objects.get(id=run_id)
    api = APIClient(HTTP_HOST="127.0.0.1")
    api.force_authenticate(user=get_user_model().objects.create_user("reader"))
    detail = api.get(f"/api/runs/{run_id}/").json()
    assert detail["serviceSpans"]["note"] == note and detail["serviceSpans"]["noSpans"] == 2
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    fields = schema["components"]["schemas"]["ServiceSpans"]["properties"]
    assert {"linked", "noSpans", "incomplete", "note"} <= set(fields)
    header = header_of(run, McpProject(load_config(project_dir)), 1000)
    assert header["serviceSpans"]["note"] == note
    assert f"Warning: {note}." in describe_run(header, [], 3, {})
    page = Client(HTTP_HOST="127.0.0.1").get(f"/runs/{run_id}/").content.decode()
    assert note[:60] in page and "service-spans" in page
    assert note in warnings(run)


def call(target, item):
    return asyncio.run(target(SimpleNamespace(item=item)))


def test_a_target_fills_its_body_reads_a_path_and_sends_the_items_traceparent(
    service_url, monkeypatch
):
    monkeypatch.setenv("AGENT_TOKEN", TOKEN)
    target = http_target(
        f"{service_url}/echo",
        headers={"Authorization": "Bearer ${AGENT_TOKEN}"},
        body={"q": "{{input.question}}", "all": "{{tags}}", "text": "tags: {{tags}}"},
        output="$.answer",
    )
    provider = TracerProvider()
    with trace.get_tracer("test", tracer_provider=provider).start_as_current_span("item"):
        parent = trace.get_current_span().get_span_context().trace_id
        answer = call(target, {"input": {"question": "why?"}, "tags": ["a", 1]})
    echo = answer["output"]
    assert echo["body"] == {"q": "why?", "all": ["a", 1], "text": 'tags: ["a", 1]'}
    assert echo["headers"]["Authorization"] == f"Bearer {TOKEN}"
    version, trace_id, _span, _flags = echo["headers"]["traceparent"].split("-")
    assert version == "00" and trace_id == format(parent, "032x")
    assert answer["metadata"] == {"status": 200}


def test_streams_retries_and_bad_answers(service_url, monkeypatch):
    streamed = http_target(f"{service_url}/sse", stream=True, output="$.delta")
    assert call(streamed, {"input": "x"})["output"] == "Hello"
    flaky = http_target(f"{service_url}/flaky", output="$.answer.body.input")
    assert call(flaky, {"input": "again"})["output"] == "again"
    assert _Service.calls["/flaky"] == 2
    monkeypatch.setenv("AGENT_TOKEN", TOKEN)
    broken = http_target(
        f"{service_url}/broken", headers={"Authorization": "Bearer ${AGENT_TOKEN}"}, retries=0
    )
    with pytest.raises(TargetError) as failed:
        call(broken, {"input": "x"})
    assert "HTTP 500: crashed with" in str(failed.value) and TOKEN not in str(failed.value)
    missed = http_target(f"{service_url}/echo", output="$.answer.nothing")
    with pytest.raises(TargetError, match=r"JSON path '\$.answer.nothing' matched nothing"):
        call(missed, {"input": "x"})
    with pytest.raises(TargetError, match="has no `question`"):
        call(http_target(f"{service_url}/echo", body={"q": "{{question}}"}), {"input": "x"})
    monkeypatch.delenv("AGENT_TOKEN")
    with pytest.raises(TargetError, match="AGENT_TOKEN is not set"):
        call(broken, {"input": "x"})
    down = http_target("http://127.0.0.1:9/", retries=0, timeout=2)
    with pytest.raises(TargetError, match="cannot connect"):
        call(down, {"input": "x"})


def test_an_openai_compatible_endpoint_answers_plain_and_streamed(fake_provider):
    for stream in (False, True):
        chat = openai_target(
            fake_provider.openai_base_url,
            "gpt-4o-mini",
            message="ECHO: {{input}}",
            api_key_env="OPENAI_API_KEY",
            stream=stream,
        )
        answer = call(chat, {"input": "forty-two"})
        assert answer["output"] == "forty-two"
        if not stream:
            assert answer["metadata"]["usage"]["prompt_tokens"] > 0


def test_a_target_declared_in_the_configuration(project, monkeypatch, service_url):
    import cobalt

    project.write(
        "cobalt.toml",
        f"""
        test_dir = "experiments"
        [targets.echo]
        url = "{service_url}/echo"
        body = {{ q = "{{{{input}}}}" }}
        output = "$.answer.body.q"
        [targets.broken]
        url = "{service_url}/echo"
        outptu = "$.answer"
        """,
    )
    monkeypatch.setenv("COBALT_PROJECT_DIR", str(project.path))
    assert call(cobalt.target("echo"), {"input": "hello"})["output"] == "hello"
    with pytest.raises(TargetError, match=r"\[targets.broken\]: unknown key 'outptu'"):
        cobalt.target("broken")
    with pytest.raises(TargetError, match=r"no target 'nope'.*\[targets.nope\]"):
        cobalt.target("nope")
