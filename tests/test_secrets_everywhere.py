"""No secret a run is handed reaches anything Cobalt writes or shows (issue 33).

A property test: hypothesis draws secrets of every kind — values under secret names (tool
arguments `api_token`, `openai_api_key`, `password`, headers `X-Goog-Api-Key`, a request body's
`api_key`, metadata's `client_secret`, an output's `api_key`), shapes (`sk-…`, `sk-ant-…`,
`AIza…`, a JWT, `Bearer …`, `key=…` after "failed:"), URL credentials and secret query
parameters, and the value of a secret environment variable — and plants them in one real run:
a runner on the OpenAI SDK against the fake provider with `--record`, tool and retrieval steps
through `cobalt.tool` / `cobalt.span`, an item that raises an error quoting them, a judge
whose reason quotes them, a webhook receiving the run. Then everything written is searched for every planted
value: the SQLite database files (with the `-wal`), the results file, the recordings (their
compressed blobs decompressed), the log, the run and item pages, the API, every export and
the MCP tools' and resources' output.

One real run per example, with every kind planted in it: each example is then a whole user
session (its own environment, project and recording), and a kind that leaks shows in the
shrunk example. Fifteen examples keep the test near half a minute.

A dataset item is the user's data and is stored as given; a secret it holds is hidden in
what the run makes of it (the trace, the recording, an error), which the test checks too.
"""

from __future__ import annotations

import http.server
import io
import itertools
import json
import logging
import os
import string
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from django.db import connection
from django.test import Client
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from cobalt.config import active_config, load_config, set_active_config
from cobalt_app import exports, launcher, recording_store, trace_store
from cobalt_app.models import Evaluation, ItemResult, Run
from tests.conftest import Project
from tests.test_api import api, token, user  # noqa: F401 (fixtures)

ENV_NAME = "ACME_SERVICE_TOKEN"
KINDS = (
    "named",  # under secret names only: tool arguments, headers, body, metadata, output
    "query",  # a secret query parameter's value (`?key=`, `signature=`, `x-goog-api-key`)
    "password",  # a URL's password
    "env",  # the value of a secret-looking environment variable, in free text
    "sk",  # an OpenAI-shaped key in a request body and a tool's output
    "sk_ant",  # an Anthropic-shaped key in the provider's reply
    "aiza",  # a Google key in a retrieval step's output and an error
    "jwt",  # a JSON Web Token in a step's output
    "bearer",  # an `Authorization: Bearer` credential
    "failed",  # `key=…` after "failed:" in an error message
    "hook",  # a webhook address' path
    "dataset",  # an `sk-…` key a dataset item holds
)
LEAKS = [k for k in KINDS if k != "dataset"]

RUNNER = """
import json
import logging
import os
from pathlib import Path

from openai import OpenAI

import cobalt
from cobalt import Dataset, Evaluator, experiment

P = json.loads((Path(__file__).parent / "plants.json").read_text())
SK, SK_ANT = "sk-" + P["sk"], "sk-ant-" + P["sk_ant"]
AIZA = "AIza" + (P["aiza"] * 3)[:35]  # a Google key: AIza and 35 characters
JWT = "eyJ" + P["jwt"] + ".eyJ" + P["jwt"] + "." + P["jwt"]
URL = (
    f"https://svc:{P['password']}@api.example.com/v1?key={P['query']}&signature={P['query']}"
    f"&x-goog-api-key={P['query']}&auth={P['query']}&client_secret={P['query']}&page=2"
)
client = OpenAI()


@cobalt.tool
def call_service(url, api_token, openai_api_key, password, headers, note):
    return {"status": "ok", "echo": SK, "note": "env " + P["env"]}


def run(ctx):
    call_service(
        url=URL,
        api_token=P["named"],
        openai_api_key=P["named"],
        password=P["named"],
        headers={"X-Goog-Api-Key": P["named"], "Authorization": "Bearer " + P["bearer"]},
        note="uses " + P["env"],
    )
    with cobalt.span(f"GET {URL}", kind="retrieval", input={"client_secret": P["named"]}) as step:
        step.output = f"found {AIZA} and {JWT} for {P['env']}"
    if ctx.item["id"] == "boom":
        raise RuntimeError(
            f"upstream failed: key={P['failed']} with {AIZA}, {P['env']} at {URL}, "
            f"Authorization: Bearer {P['bearer']}"
        )
    reply = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[
            {
                "role": "user",
                "content": f"{ctx.item['input']} using {SK} and {P['env']} "
                f"[[reply:the answer is {SK_ANT} {P['env']}]]",
            }
        ],
        extra_body={"api_key": P["named"]},
        extra_query={"x-goog-api-key": P["query"], "signature": P["query"]},
    )
    answer = reply.choices[0].message.content
    metadata = {"client_secret": P["named"], "note": "token=" + P["named"], "tokens": 5}
    return {"output": {"answer": answer, "api_key": P["named"]}, "metadata": metadata}


experiment(
    "planted",
    Dataset(
        items=[
            {"id": "ok", "input": "Capital of France? " + "sk-" + P["dataset"]},
            {"id": "boom", "input": "Capital of Peru?"},
        ]
    ),
    run,
    # The judge's reason quotes secrets: stored in the evaluation and the judge cache.
    evaluators=[
        Evaluator(
            name="judge",
            prompt="Rate {{output}} [[reply:"
            + json.dumps({"score": 0.8, "reason": f"it quotes {P['env']} and {SK}"})
            + "]]",
        )
    ],
)
"""


def random_value() -> st.SearchStrategy[str]:
    """A random value that appears nowhere else (`zq` and 14 to 22 letters or digits)."""
    alphabet = string.ascii_letters + string.digits
    return st.text(alphabet, min_size=14, max_size=22).map(lambda s: "zq" + s)


EXAMPLES = itertools.count()


def plants() -> st.SearchStrategy[dict[str, str]]:
    return st.lists(random_value(), min_size=len(KINDS), max_size=len(KINDS), unique=True).map(
        lambda values: dict(zip(KINDS, values, strict=True))
    )


def planted_values(plant: dict[str, str]) -> dict[str, str]:
    """Every value that must not be found, named by kind (the shaped ones whole)."""
    shaped = {"sk": "sk-", "sk_ant": "sk-ant-"}
    values = {kind: shaped.get(kind, "") + plant[kind] for kind in LEAKS}
    return {**values, "aiza": "AIza" + (plant["aiza"] * 3)[:35]}


class HookReceiver(http.server.BaseHTTPRequestHandler):
    """A webhook endpoint that keeps what it was sent."""

    received: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - the standard library's name
        self.received.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hook_port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HookReceiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    thread.join()


@pytest.fixture
def planted_project(tmp_path, settings, fake_provider):
    settings.TEAM_MODE = False
    previous = active_config()
    yield tmp_path
    set_active_config(previous)
    os.environ.pop(ENV_NAME, None)


# No shrinking: the failure names the kinds and places that leaked, and a run per step of
# shrinking would take minutes.
@settings(
    max_examples=15,
    deadline=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plant=plants())
@pytest.mark.django_db(transaction=True)
def test_no_planted_secret_is_written_or_shown_anywhere(
    plant,
    planted_project,
    hook_port,
    api,  # noqa: F811
    cobalt_log,
):
    cobalt_log.seek(0)
    cobalt_log.truncate()
    HookReceiver.received.clear()
    # Hypothesis also draws the project's own string constants (`zqCrewAIInstrumentor`), so a
    # value can come back in another example, and the database files keep earlier examples'
    # rows in the WAL (the dataset item, stored as given): each example's values begin with
    # its own number, so none is an earlier example's.
    number = next(EXAMPLES)
    plant = {kind: f"zq{number:03d}{value[2:]}" for kind, value in plant.items()}
    project = new_project(planted_project, plant, hook_port)
    os.environ[ENV_NAME] = plant["env"]
    run = planted_run(project)
    assert run.status == "completed", run.failure
    items = {i.item_key: i for i in ItemResult.objects.filter(run=run)}
    assert items["ok"].status == "ok" and items["boom"].status == "error"
    assert "upstream failed: key=***" in items["boom"].error
    (judged,) = Evaluation.objects.filter(item=items["ok"])
    assert (judged.score, judged.reason) == (0.8, "it quotes *** and ***")

    written = everything_written(run, project, api)
    written["log"] = cobalt_log.getvalue()
    assert "webhook" not in written["log"]  # delivered: nothing to say
    written["webhook"] = b"".join(HookReceiver.received).decode()
    assert json.loads(HookReceiver.received[0])["run"]["id"] == run.id
    leaks = {
        (kind, where)
        for kind, value in planted_values(plant).items()
        for where, text in written.items()
        if value in text
    }
    assert not leaks, f"planted secrets found: {sorted(leaks)}"

    # The dataset item is stored as given; what the run made of it hides its key.
    dataset_key = "sk-" + plant["dataset"]
    assert dataset_key in json.dumps(items["ok"].input)
    for where in ("trace", "recordings", "errors"):
        assert dataset_key not in written[where], where


def new_project(root: Path, plant: dict[str, str], port: int) -> Project:
    folder = root / f"p{len(list(root.iterdir()))}"
    folder.mkdir()
    project = Project(folder)
    hook = f"http://127.0.0.1:{port}/hooks/{plant['hook']}?token={plant['hook']}"
    project.write(
        "cobalt.toml",
        f'test_dir = "experiments"\n\n[[webhooks]]\nurl = "{hook}"\nevents = ["run.completed"]\n',
    )
    project.write("experiments/plants.json", json.dumps(plant))
    project.write("experiments/planted.cobalt.py", RUNNER)
    set_active_config(load_config(project.path))
    return project


def planted_run(project: Project) -> Run:
    config = active_config()
    experiments, errors, _ = launcher.load_experiments(config, name_filter="planted")
    assert not errors, errors
    (run,) = launcher.execute(experiments, config, overrides={"replay": "record"})
    return Run.objects.get(id=run.id)


def everything_written(run: Run, project: Project, api_client: Any) -> dict[str, str]:
    """Where each written thing can be read, as text."""
    items = list(ItemResult.objects.filter(run=run).order_by("id"))
    written = {
        "database files": database_files(),
        "results file": results_file_text(run),
        "recordings": json.dumps(list(recording_store.load_experiment("planted").values())),
        "trace": json.dumps(trace_store.read([i.id for i in items])),
        "errors": json.dumps([[i.error, i.traceback] for i in items]),
        "exports": "".join("".join(exports.export(run, fmt)) for fmt in exports.FORMATS),
        "mcp": mcp_output(run, project),
    }
    pages = Client(HTTP_HOST="127.0.0.1")
    shown = [
        pages.get(f"/runs/{run.id}/"),
        *(pages.get(f"/runs/{run.id}/items/{i.number}/?repeat={i.run_index + 1}") for i in items),
    ]
    assert all(r.status_code == 200 for r in shown)
    written["pages"] = "".join(r.content.decode() for r in shown)
    answers = [api_client.get(f"/api/runs/{run.id}/"), api_client.get(f"/api/runs/{run.id}/items/")]
    assert all(r.status_code == 200 for r in answers)
    written["api"] = "".join(r.content.decode() for r in answers)
    return written


def database_files() -> str:
    """The SQLite database's bytes as stored on disk, its write-ahead log included."""
    name = Path(connection.settings_dict["NAME"])
    files = [name, name.with_name(name.name + "-wal")]
    assert files[0].is_file()
    return "".join(p.read_bytes().decode("latin-1") for p in files if p.is_file())


def results_file_text(run: Run) -> str:
    path = Path(run.results_path)
    assert path.is_file(), run.results_path
    return path.read_bytes().decode("utf-8")


def mcp_output(run: Run, project: Project) -> str:
    from cobalt_cli.mcp.project import Project as McpProject
    from cobalt_cli.mcp.reads import cobalt_results_tool
    from cobalt_cli.mcp.resources import config_resource, latest_results_resource

    target = McpProject(active_config())
    answers = [
        cobalt_results_tool(target, run_id=run.id, limit=None, experiment=None),
        cobalt_results_tool(target, run_id=None, limit=5, experiment="planted"),
    ]
    texts = [a.model_dump_json() for a in answers]
    texts += [json.dumps(config_resource(target)), json.dumps(latest_results_resource(target))]
    return "".join(texts)


@pytest.fixture
def cobalt_log() -> Iterator[io.StringIO]:
    """What Cobalt's loggers write, through the handlers the settings configure."""
    handlers = [h for h in logging.getLogger("cobalt").handlers if hasattr(h, "setStream")]
    assert handlers
    written = io.StringIO()
    # Swapped, not `setStream` (which flushes the old stream: pytest may have closed the
    # capture a handler was configured with by an earlier test of this process).
    streams = [h.stream for h in handlers]
    for handler in handlers:
        handler.stream = written
    yield written
    for handler, stream in zip(handlers, streams, strict=True):
        handler.stream = stream


def test_cobalt_logs_hide_secrets_in_messages_arguments_and_tracebacks(cobalt_log, monkeypatch):
    monkeypatch.setenv(ENV_NAME, "zqEnvironmentValue42")
    log = logging.getLogger("cobalt.worker")
    try:
        raise RuntimeError("connect failed: password=hunter22 via https://u:pw9999@db/x")
    except RuntimeError:
        log.exception("item %s failed with %s", "a", "Bearer abc123def456 and zqEnvironmentValue42")
    text = cobalt_log.getvalue()
    assert "item a failed with Bearer *** and ***" in text
    assert "connect failed: password=*** via https://u:***@db/x" in text
    for secret in ("abc123def456", "zqEnvironmentValue42", "hunter22", "pw9999"):
        assert secret not in text
