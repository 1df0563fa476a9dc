"""Webhooks: signed JSON POSTs after runs and CI verdicts, retried, never changing the outcome."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cobalt.config import load_config
from cobalt.redaction import redact
from cobalt_app.webhooks import sign, verify
from tests.conftest import free_port as closed_port

SECRET = "whsec-test-7f3a"

EXPERIMENT = """
from cobalt import Dataset, Evaluator, experiment

experiment(
    "hooked",
    Dataset([{"id": "a", "input": "x"}, {"id": "b", "input": "y"}]),
    lambda ctx: ctx.item["input"],
    evaluators=[Evaluator(name="half", type="function", fn=lambda ctx: 0.5)],
)
"""


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> dict:
        return json.loads(self.body)


@dataclass
class Receiver:
    """A real HTTP server that records POSTs; `/flaky/...` answers 503 once, `/reject` 400."""

    port: int = 0
    requests: list[Received] = field(default_factory=list)
    failed_once: set[str] = field(default_factory=set)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state.requests.append(Received(self.path, dict(self.headers.items()), body))
            status = 200
            if self.path.startswith("/flaky") and self.path not in state.failed_once:
                state.failed_once.add(self.path)
                status = 503
            elif self.path.startswith("/reject"):
                status = 400
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


def configure(project, hooks: str, ci: str = "") -> None:
    project.write("experiments/hooked.cobalt.py", EXPERIMENT)
    project.write("cobalt.toml", f'test_dir = "experiments"\n{ci}\n{hooks}')


def test_run_and_ci_events_arrive_signed(project, cobalt_cli, receiver):
    configure(
        project,
        f"""
[[webhooks]]
url = "{receiver.url("/hooks/T0KEN")}"
events = ["run.completed", "ci.failed", "ci.passed"]
secret_env = "HOOK_SECRET"
""",
        ci="[ci.thresholds.half]\navg = 0.6\n",
    )
    env = {"HOOK_SECRET": SECRET, "GITHUB_ACTIONS": "false"}
    result = cobalt_cli(project, "run", "--ci", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert [r.headers["X-Cobalt-Event"] for r in receiver.requests] == [
        "run.completed",
        "ci.failed",
    ]
    for request in receiver.requests:
        assert request.path == "/hooks/T0KEN"
        assert request.headers["Content-Type"] == "application/json"
        signature = request.headers["X-Cobalt-Signature"]
        assert signature.startswith("sha256=") and verify(SECRET, request.body, signature)
        assert not verify("another-secret", request.body, signature)
    completed, failed = (r.json for r in receiver.requests)
    run_id = result.stdout.split("· run ")[1].split()[0]
    assert completed["event"] == "run.completed"
    assert completed["run"]["id"] == run_id and completed["run"]["status"] == "completed"
    assert completed["run"]["summary"]["scores"]["half"]["avg"] == 0.5
    assert failed["exitCode"] == 1 and failed["passed"] is False
    assert failed["violations"] == ["half avg 0.5 < 0.6"]
    assert failed["runs"][0]["id"] == run_id
    assert SECRET not in result.stdout + result.stderr


def test_a_failed_delivery_is_retried_and_a_refused_one_is_not(project, cobalt_cli, receiver):
    configure(
        project,
        f"""
[[webhooks]]
url = "{receiver.url("/flaky")}"
secret = "{SECRET}"

[[webhooks]]
url = "{receiver.url("/reject")}"
events = ["run.completed"]
""",
    )
    result = cobalt_cli(project, "run", env={"GITHUB_ACTIONS": "false"})
    assert result.returncode == 0, result.stdout + result.stderr
    flaky = [r for r in receiver.requests if r.path == "/flaky"]
    rejected = [r for r in receiver.requests if r.path == "/reject"]
    assert len(flaky) == 2  # 503, then delivered
    assert flaky[0].body == flaky[1].body
    assert flaky[0].headers["X-Cobalt-Delivery"] == flaky[1].headers["X-Cobalt-Delivery"]
    assert verify(SECRET, flaky[1].body, flaky[1].headers["X-Cobalt-Signature"])
    assert len(rejected) == 1 and "X-Cobalt-Signature" not in rejected[0].headers
    assert (
        f"webhook http://127.0.0.1:{receiver.port}/… (run.completed) failed after 1 attempt: "
        "HTTP 400" in result.stderr
    )


def test_a_receiver_that_is_down_never_changes_the_outcome(project, cobalt_cli):
    port = closed_port()
    configure(
        project,
        f"""
[[webhooks]]
url = "http://127.0.0.1:{port}/services/SECRET-PATH"
events = ["run.completed", "ci.passed"]
retries = 1
""",
        ci="[ci.thresholds.half]\navg = 0.5\n",
    )
    result = cobalt_cli(project, "run", "--ci", env={"GITHUB_ACTIONS": "false"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "CI passed" in result.stdout
    for event in ("run.completed", "ci.passed"):
        assert (
            f"webhook http://127.0.0.1:{port}/… ({event}) failed after 2 attempts: ConnectError"
        ) in result.stderr
    assert "SECRET-PATH" not in result.stderr
    assert len(project.results_files()) == 1


def test_a_missing_secret_variable_is_logged_and_nothing_is_sent(project, cobalt_cli, receiver):
    configure(
        project,
        f'[[webhooks]]\nurl = "{receiver.url("/x")}"\nsecret_env = "NOT_SET_ANYWHERE"\n',
    )
    result = cobalt_cli(project, "run", env={"GITHUB_ACTIONS": "false"})
    assert result.returncode == 0
    assert receiver.requests == []
    assert "not sent: the variable NOT_SET_ANYWHERE (secret_env) is not set" in result.stderr


def test_signature_is_hmac_sha256_of_the_body_and_urls_are_shown_without_paths():
    body = b'{"event": "run.completed"}'
    digest = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert sign(SECRET, body) == f"sha256={digest}"
    assert verify(SECRET, body, f"sha256={digest}")
    assert not verify(SECRET, body + b" ", f"sha256={digest}")
    assert (
        redact("https://hooks.slack.com/services/T0/B0/XYZ?x=1", "url")
        == "https://hooks.slack.com/…"
    )
    assert redact("http://127.0.0.1:8080/a", "url") == "http://127.0.0.1:8080/…"


def test_webhook_urls_and_secrets_are_redacted_wherever_the_config_is_shown(tmp_path):
    (tmp_path / "cobalt.toml").write_text(
        '[[webhooks]]\nurl = "https://user:pw@hooks.slack.com/services/T0/B0/XYZ"\n'
        f'secret = "{SECRET}"\n'
    )
    (hook,) = redact(load_config(tmp_path).data)["webhooks"]
    assert hook == {"url": "https://hooks.slack.com/…", "secret": "***"}


@pytest.mark.django_db(transaction=True)
def test_a_run_the_sweeper_finalises_sends_its_webhook_too(project, receiver):
    # A team run whose last worker died after recording the last item, before finalising:
    # the sweeper finalises it, and its webhook goes out as for any other run.
    from cobalt_app import launcher, team
    from cobalt_app.models import Run

    configure(project, "")
    config = load_config(project.path)
    experiments, _, _ = launcher.load_experiments(config)
    (run,) = launcher.execute(experiments, config)
    Run.objects.filter(id=run.id).update(status="running", mode="team", summary={})
    configure(
        project, f'[[webhooks]]\nurl = "{receiver.url("/swept")}"\nevents = ["run.completed"]\n'
    )

    report = team.sweep(load_config(project.path))

    assert report.finalised == [run.id]
    assert Run.objects.get(id=run.id).status == "completed"
    deadline = time.monotonic() + 10
    while not receiver.requests:
        assert time.monotonic() < deadline, "the swept run sent no webhook"
        time.sleep(0.05)
    [request] = receiver.requests
    assert request.path == "/swept" and request.json["event"] == "run.completed"
    assert request.json["run"]["id"] == run.id
    assert request.json["run"]["summary"]["scores"]["half"]["avg"] == 0.5
