"""Record and replay the agent's model calls (`cobalt run --record / --replay / --record-new`).

The agents are real OpenAI and Anthropic SDK clients (sync and async, streaming too) pointed
at a fake provider of the test's own, which is stopped before replaying: a request that
reached for it would fail its item.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Iterator

import pytest

from tests import cli_zygote
from tests.conftest import Project, cli_env
from tests.fake_provider import FakeProvider
from tests.test_blob_store import stored_value

SECRET_OPENAI = "sk-test-openai-SECRET-0001"
SECRET_ANTHROPIC = "sk-ant-test-SECRET-0002"

CAPITALS = [
    {"id": "france", "input": "What is the capital of France?", "expected_output": "Paris"},
    {"id": "japan", "input": "What is the capital of Japan?", "expected_output": "Tokyo"},
    {"id": "italy", "input": "What is the capital of Italy?", "expected_output": "Rome"},
    {"id": "peru", "input": "What is the capital of Peru?", "expected_output": "Lima"},
    {"id": "kenya", "input": "What is the capital of Kenya?", "expected_output": "Nairobi"},
]

# A sync runner on the OpenAI SDK; the fake provider answers what [[reply:...]] says.
CAPITALS_AGENT = """
from openai import OpenAI

from cobalt import Dataset, Evaluator, experiment

client = OpenAI()
dataset = Dataset.from_file("datasets/capitals.jsonl")


@experiment(
    "capitals",
    dataset,
    concurrency=5,
    evaluators=[
        Evaluator(name="exact", type="exact-match", field="expected_output"),
        Evaluator(name="judge", prompt="Q: {{input}} A: {{output}} [[score:0.7]]"),
    ],
)
def run(ctx):
    reply = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[
            {"role": "system", "content": "Answer with the city only."},
            {"role": "user", "content": ctx.item["input"] + " [[reply:" + ctx.item["expected_output"] + "]]"},
        ],
    )
    return reply.choices[0].message.content
"""

# Both SDKs, sync and async, streaming and not; the output joins every reply.
SDKS_AGENT = """
import anthropic
import openai

from cobalt import Dataset, experiment

dataset = Dataset(items=[{"id": f"q{i}", "word": f"word{i}"} for i in range(4)])
sync_openai, async_openai = openai.OpenAI(), openai.AsyncOpenAI()
sync_anthropic, async_anthropic = anthropic.Anthropic(), anthropic.AsyncAnthropic()


def ask(word, how):
    return [{"role": "user", "content": f"ECHO: {how} says {word} and a few more words here"}]


@experiment("sdks-async", dataset, concurrency=4)
async def run_async(ctx):
    word = ctx.item["word"]
    parts = []
    stream = await async_openai.chat.completions.create(
        model="gpt-4o-mini", messages=ask(word, "async openai stream"), stream=True,
        stream_options={"include_usage": True},
    )
    streamed = []
    async for chunk in stream:
        if chunk.choices:
            streamed.append(chunk.choices[0].delta.content or "")
    parts.append("".join(streamed))
    message = await async_anthropic.messages.create(
        model="claude-haiku-4-5", max_tokens=50, messages=ask(word, "async anthropic"))
    parts.append(message.content[0].text)
    return " | ".join(parts) + f" | {message.id}"


@experiment("sdks-sync", dataset, concurrency=4)
def run_sync(ctx):
    word = ctx.item["word"]
    reply = sync_openai.chat.completions.create(
        model="gpt-4o-mini", messages=ask(word, "sync openai"))
    with sync_anthropic.messages.stream(
        model="claude-haiku-4-5", max_tokens=50, messages=ask(word, "sync anthropic stream")
    ) as stream:
        streamed = stream.get_final_text()
        final = stream.get_final_message()
    return f"{reply.choices[0].message.content} | {streamed} | {reply.id} | {final.id}"
"""

# Every item sends the *same* request; only the reply's id (unique per provider reply) tells
# them apart, so an item answered from another item's recording shows another id.
ISOLATION_AGENT = """
import asyncio
import random

import openai

from cobalt import Dataset, experiment

dataset = Dataset(items=[{"id": f"item-{i}"} for i in range(60)])
async_client, sync_client = openai.AsyncOpenAI(), openai.OpenAI()
SAME = [{"role": "user", "content": "ECHO: the same question for everyone"}]


@experiment("isolation-async", dataset, concurrency=20)
async def run_async(ctx):
    await asyncio.sleep(random.random() / 50)
    first = await async_client.chat.completions.create(model="gpt-4o-mini", messages=SAME)
    second = await async_client.chat.completions.create(model="gpt-4o-mini", messages=SAME)
    return f"{ctx.item['id']}: {first.id} {second.id}"


@experiment("isolation-sync", dataset, concurrency=20)
def run_sync(ctx):
    reply = sync_client.chat.completions.create(model="gpt-4o-mini", messages=SAME)
    return f"{ctx.item['id']}: {reply.id}"
"""


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    """A fake provider of this test's own, so that the test can stop it."""
    fake = FakeProvider().start()
    try:
        yield fake
    finally:
        fake.stop()


def cobalt(
    project: Project, provider_urls: dict[str, str], *args: str, keys: bool = True
) -> subprocess.CompletedProcess[str]:
    env = dict(provider_urls)
    if keys:
        env.update({"OPENAI_API_KEY": SECRET_OPENAI, "ANTHROPIC_API_KEY": SECRET_ANTHROPIC})
    return cli_zygote.run(list(args), project.path, cli_env(env), timeout=180)


def urls(fake: FakeProvider) -> dict[str, str]:
    return {"OPENAI_BASE_URL": fake.openai_base_url, "ANTHROPIC_BASE_URL": fake.anthropic_base_url}


def latest_results(project: Project, name: str) -> dict:
    files = [p for p in project.results_files() if f"_{name}_" in p.name]
    return json.loads(max(files, key=lambda p: p.stat().st_mtime_ns).read_text())


def by_key(results: dict) -> dict[str, dict]:
    return {(item["key"], item["runIndex"]): item for item in results["items"]}


def output(item: dict) -> object:
    return item["output"]["output"]


def scores(item: dict) -> dict[str, float | None]:
    return {name: e.get("score") for name, e in item["evaluations"].items()}


def recording_rows(project: Project, experiment: str) -> dict[str, list]:
    with sqlite3.connect(project.db_path) as db:
        rows = db.execute(
            "SELECT item_key, data, blobs FROM cobalt_app_recording WHERE experiment = ?",
            [experiment],
        ).fetchall()
        blobs = dict(db.execute("SELECT sha256, data FROM cobalt_app_blob").fetchall())
    return {key: stored_value(data, refs, blobs) for key, data, refs in rows}


@pytest.fixture
def capitals(project: Project) -> Project:
    project.write_jsonl("datasets/capitals.jsonl", CAPITALS)
    project.write("experiments/capitals.cobalt.py", CAPITALS_AGENT)
    project.write("cobalt.toml", 'test_dir = "experiments"\n\n[ci]\nreplay = true\n')
    return project


def test_a_replayed_run_with_the_provider_stopped_has_the_recorded_outputs_and_scores(
    capitals: Project, provider: FakeProvider
):
    live = urls(provider)
    recorded = cobalt(capitals, live, "run", "--record")
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    assert "Model calls: recording the agent's model calls" in recorded.stdout
    first = latest_results(capitals, "capitals")
    assert first["replay"] == "recorded"
    assert provider.request_count("/v1/chat/completions") == 10  # 5 agent + 5 judge calls
    rows = recording_rows(capitals, "capitals")
    assert set(rows) == {item["id"] for item in CAPITALS}
    assert [e["request"]["body"]["messages"][1]["content"] for e in rows["peru"]] == [
        "What is the capital of Peru? [[reply:Lima]]"
    ]  # the agent's call only: the judge's is not recorded

    provider.stop()
    # `--ci` replays by default here (`[ci] replay = true`); no API key is needed.
    replayed = cobalt(capitals, live, "run", "--ci", keys=False)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "model calls replayed" in replayed.stdout
    second = latest_results(capitals, "capitals")
    assert second["replay"] == "replayed" and second["id"] != first["id"]
    before, after = by_key(first), by_key(second)
    assert set(before) == set(after)
    for key, item in before.items():
        assert after[key]["status"] == "ok"
        assert output(after[key]) == output(item)
        assert scores(after[key]) == scores(item) == {"exact": 1.0, "judge": 0.7}
        steps = after[key]["trace"]
        assert [s["kind"] for s in steps] == ["llm"] and steps[0]["replayed"] is True
        assert "replayed" not in item["trace"][0]


def test_a_changed_input_fails_only_its_own_item_with_the_request_named(
    capitals: Project, provider: FakeProvider
):
    live = urls(provider)
    assert cobalt(capitals, live, "run", "--record").returncode == 0
    provider.stop()
    changed = [dict(item) for item in CAPITALS]
    changed[2]["input"] = "Which city is the capital of Italy, please?"
    capitals.write_jsonl("datasets/capitals.jsonl", changed)

    replayed = cobalt(capitals, live, "run", "--replay", keys=False)
    assert replayed.returncode == 0, replayed.stderr
    items = by_key(latest_results(capitals, "capitals"))
    assert [key for key, item in items.items() if item["status"] != "ok"] == [("italy", 0)]
    error = items[("italy", 0)]["error"]
    assert error.startswith(
        f"no recorded response for POST {live['OPENAI_BASE_URL']}/chat/completions "
        '(model gpt-4o-mini, last message "Which city is the capital of Italy, please?…")'
    ), error
    assert "the closest of the item's 1 recorded request(s) (#1) differs in messages." in error
    assert "capital of [-Italy?-] {+Italy, please?+}" in error  # only what changed, quoted
    assert error.endswith(
        "record it again with `cobalt run --record` (or `--record-new`), "
        "or let its host through with `[replay] allow_hosts`"
    )
    assert "no recorded response for POST" in replayed.stdout
    refused = items[("italy", 0)]
    assert refused["tokens"] == 0 and refused["cost"] in (0, None)  # never sent: nothing spent
    assert [s.get("inputTokens") for s in refused["trace"] if s["kind"] == "llm"] == [None]
    others = [i for i in changed if i is not changed[2]]
    assert [output(items[(i["id"], 0)]) for i in others] == [i["expected_output"] for i in others]


def test_record_new_replays_what_exists_and_records_only_what_is_new(
    capitals: Project, provider: FakeProvider
):
    live = urls(provider)
    assert cobalt(capitals, live, "run", "--record", "--no-cache").returncode == 0
    provider.reset()
    changed = [dict(item) for item in CAPITALS]
    changed[0]["input"] = "And the capital of France?"
    capitals.write_jsonl("datasets/capitals.jsonl", changed)

    mixed = cobalt(capitals, live, "run", "--record-new")
    assert mixed.returncode == 0, mixed.stderr
    assert "replaying the agent's recorded model calls, recording new ones" in mixed.stdout
    agent_calls = [
        r["json"]["messages"][1]["content"]
        for r in provider.requests
        if r["json"]["messages"][0]["content"] == "Answer with the city only."
    ]
    assert agent_calls == ["And the capital of France? [[reply:Paris]]"]
    assert len(recording_rows(capitals, "capitals")["france"]) == 2  # the old one and the new

    provider.stop()
    replayed = cobalt(capitals, live, "run", "--replay", keys=False)
    assert replayed.returncode == 0, replayed.stderr
    assert {i["status"] for i in latest_results(capitals, "capitals")["items"]} == {"ok"}


def test_streaming_and_plain_calls_of_both_sdks_sync_and_async_replay_identically(
    project: Project, provider: FakeProvider
):
    project.write("experiments/sdks.cobalt.py", SDKS_AGENT)
    live = urls(provider)
    recorded = cobalt(project, live, "run", "--record")
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    originals = {
        name: by_key(latest_results(project, name)) for name in ("sdks-async", "sdks-sync")
    }
    assert provider.request_count() == 16
    streams = [r for r in provider.requests if r["json"].get("stream")]
    assert len(streams) == 8
    some = output(originals["sdks-async"][("q1", 0)])
    assert some.startswith("async openai stream says word1 and a few more words here | ")
    rows = recording_rows(project, "sdks-sync")["q2"]
    streamed = [e for e in rows if e["request"]["body"].get("stream")]
    assert streamed[0]["response"]["headers"]["content-type"].startswith("text/event-stream")
    assert "event: content_block_delta" in streamed[0]["response"]["body"]

    provider.stop()
    replayed = cobalt(project, live, "run", "--replay", keys=False)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    for name, before in originals.items():
        after = by_key(latest_results(project, name))
        assert {k: output(v) for k, v in after.items()} == {k: output(v) for k, v in before.items()}
        assert {v["status"] for v in after.values()} == {"ok"}


def test_twenty_items_in_flight_are_each_answered_from_their_own_recording(
    project: Project, provider: FakeProvider
):
    project.write("experiments/isolation.cobalt.py", ISOLATION_AGENT)
    provider.latency = 0.02  # keeps twenty requests in flight at once
    live = urls(provider)
    recorded = cobalt(project, live, "run", "--record")
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    names = ("isolation-async", "isolation-sync")
    originals = {name: by_key(latest_results(project, name)) for name in names}
    ids = [output(item).split(": ")[1] for item in originals["isolation-async"].values()]
    assert len(set(" ".join(ids).split())) == 120  # every reply is another one

    provider.stop()
    replayed = cobalt(project, live, "run", "--replay", "--concurrency", "20", keys=False)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    for name in names:
        after = by_key(latest_results(project, name))
        assert len(after) == 60
        mixed = [k for k, v in after.items() if output(v) != output(originals[name][k])]
        assert mixed == []


def test_nothing_written_holds_an_api_key_or_an_authorization_header(
    capitals: Project, provider: FakeProvider
):
    live = urls(provider)
    assert cobalt(capitals, live, "run", "--record").returncode == 0
    assert cobalt(capitals, live, "run", "--replay").returncode == 0
    sent = provider.requests[0]["headers"]
    assert sent["authorization"] == f"Bearer {SECRET_OPENAI}"  # what the provider did get
    written = [p for p in capitals.path.rglob("*") if p.is_file()]
    assert any(p.name.startswith("history.db") for p in written)
    for path in written:
        data = path.read_bytes()
        for needle in (SECRET_OPENAI, SECRET_ANTHROPIC, "SECRET", "Bearer"):
            assert needle.encode() not in data, f"{needle} in {path}"
    for exchanges in recording_rows(capitals, "capitals").values():
        text = json.dumps(exchanges)  # stored compressed: the file's bytes do not show it
        for needle in (SECRET_OPENAI, SECRET_ANTHROPIC, "SECRET", "Bearer"):
            assert needle not in text
        text = text.lower()
        assert "authorization" not in text and "x-api-key" not in text and "api_key" not in text


def test_recordings_are_listed_and_cleaned_by_age(capitals: Project, provider: FakeProvider):
    live = urls(provider)
    assert cobalt(capitals, live, "run", "--record").returncode == 0
    listed = cobalt(capitals, live, "recordings", "list")
    assert listed.returncode == 0, listed.stderr
    line = next(line for line in listed.stdout.splitlines() if "capitals" in line)
    assert line.split()[:3] == ["capitals", "5", "5"]
    items = cobalt(capitals, live, "recordings", "list", "--experiment", "capitals")
    assert sorted(line.split()[0] for line in items.stdout.splitlines()[1:]) == sorted(
        i["id"] for i in CAPITALS
    )
    with sqlite3.connect(capitals.db_path) as db:
        db.execute(
            "UPDATE cobalt_app_recording SET recorded_at = '2020-01-01 00:00:00' "
            "WHERE item_key IN ('peru', 'kenya')"
        )
    kept = cobalt(capitals, live, "recordings", "clean", "--older-than", "30d")
    assert kept.returncode == 0 and "Deleted 2 recordings." in kept.stdout, kept.stderr
    assert set(recording_rows(capitals, "capitals")) == {"france", "japan", "italy"}
    wrong = cobalt(capitals, live, "recordings", "clean", "--older-than", "soon")
    assert wrong.returncode == 2 and "--older-than: 'soon' is not an age" in wrong.stderr
    everything = cobalt(capitals, live, "recordings", "clean")
    assert "Deleted 3 recordings." in everything.stdout
    empty = cobalt(capitals, live, "recordings", "list")
    assert "No recordings yet" in empty.stdout


def test_contradicting_flags_and_bad_settings_are_refused_with_their_names(
    capitals: Project, provider: FakeProvider
):
    live = urls(provider)
    both = cobalt(capitals, live, "run", "--record", "--replay")
    assert both.returncode == 2
    assert "--record, --replay and --record-new exclude each other" in both.stderr
    capitals.write("cobalt.toml", '[ci]\nreplay = "yes"\n')
    bad = cobalt(capitals, live, "run", "--ci")
    assert bad.returncode == 2 and "`ci.replay` must be true or false" in bad.stderr
    capitals.write("cobalt.toml", '[replay]\nignore = "seed"\n')
    bad = cobalt(capitals, live, "run")
    assert bad.returncode == 2 and "`replay.ignore` must be a list of strings" in bad.stderr
    assert provider.request_count() == 0


def test_ignored_body_fields_do_not_break_the_match(capitals: Project, provider: FakeProvider):
    """`[replay] ignore` leaves a field that varies from run to run out of the match."""
    agent = CAPITALS_AGENT.replace(
        'model="gpt-4o-mini",', 'model="gpt-4o-mini", metadata={"trace_id": str(uuid.uuid4())},'
    ).replace("from openai import OpenAI", "import uuid\n\nfrom openai import OpenAI")
    capitals.write("experiments/capitals.cobalt.py", agent)
    live = urls(provider)
    assert cobalt(capitals, live, "run", "--record").returncode == 0
    provider.stop()
    strict = cobalt(capitals, live, "run", "--replay", keys=False)
    assert {i["status"] for i in latest_results(capitals, "capitals")["items"]} == {"error"}
    assert strict.returncode == 1  # no item produced an output: not a passing run
    assert "no item of 'capitals' produced an output (5 errors of 5)" in strict.stderr
    capitals.write("cobalt.toml", '[replay]\nignore = ["metadata.trace_id"]\n')
    relaxed = cobalt(capitals, live, "run", "--replay", keys=False)
    assert relaxed.returncode == 0, relaxed.stderr
    assert {i["status"] for i in latest_results(capitals, "capitals")["items"]} == {"ok"}


def test_the_run_page_says_the_model_calls_were_replayed(capitals: Project, provider: FakeProvider):
    from tests.conftest import start_server

    live = urls(provider)
    assert cobalt(capitals, live, "run", "--record").returncode == 0
    provider.stop()
    assert cobalt(capitals, live, "run", "--replay", keys=False).returncode == 0
    replayed = latest_results(capitals, "capitals")
    import httpx

    server, base = start_server(capitals)
    try:
        page = httpx.get(f"{base}/runs/{replayed['id']}/", timeout=30).text
        assert 'id="run-replay"' in page and "model calls replayed" in page
        with sqlite3.connect(capitals.db_path) as db:
            (number,) = db.execute(
                "SELECT item_index + 1 FROM cobalt_app_itemresult WHERE run_id = ? LIMIT 1",
                [replayed["id"]],
            ).fetchone()
        item_page = httpx.get(f"{base}/runs/{replayed['id']}/items/{number}/", timeout=30).text
        assert '<span class="tag replayed"' in item_page
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.timeout(240)
def test_a_team_run_records_and_replays_through_the_shared_database(team, fake_provider_server):
    team.folder.joinpath("datasets").mkdir()
    team.folder.joinpath("datasets", "capitals.jsonl").write_text(
        "".join(json.dumps(item) + "\n" for item in CAPITALS)
    )
    (team.folder / "experiments" / "capitals.cobalt.py").write_text(CAPITALS_AGENT)
    team.start_worker("--concurrency", "4")
    recorded = team.cli("run", "--record", timeout=180)
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    first = team.latest_run()
    rows = team.services.query(
        "SELECT item_key, request_count FROM cobalt_app_recording WHERE experiment = 'capitals'"
    )
    assert sorted(rows) == sorted((item["id"], 1) for item in CAPITALS)

    fake_provider_server.reset()
    replayed = team.cli("run", "--replay", timeout=180)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert fake_provider_server.request_count() == 0  # the judge cache and the recordings
    second = team.latest_run()
    assert second != first
    outputs = team.services.query(
        "SELECT run_id, item_key, status, output FROM cobalt_app_itemresult "
        "WHERE run_id IN (%s, %s)",
        [first, second],
    )
    per_run = {first: {}, second: {}}
    for run_id, key, status, output in outputs:
        per_run[run_id][key] = (status, output)
    assert per_run[second] == per_run[first]
    assert {status for status, _ in per_run[second].values()} == {"ok"}
    [(config,)] = team.services.query("SELECT config FROM cobalt_app_run WHERE id = %s", [second])
    config = config if isinstance(config, dict) else json.loads(config)
    assert config["replay"] == "replay"
    assert "model calls replayed" not in replayed.stdout  # the console header says it its way
    assert "Model calls: replaying the agent's model calls" in replayed.stdout


def test_unknown_hosts_and_untraced_calls_pass_through(provider: FakeProvider):
    """Matching rules in isolation: what is a model call, what a URL keeps."""
    from cobalt_app import recordings

    assert recordings.is_model_call("http://127.0.0.1:9/v1/chat/completions")
    assert recordings.is_model_call("https://api.anthropic.com/v1/messages")
    assert recordings.is_model_call("https://x.openai.azure.com/openai/deployments/d/chat")
    assert not recordings.is_model_call("https://example.com/weather?city=Paris")
    assert recordings.is_model_call("https://gw.internal/x", ("gw.internal",))
    assert (
        recordings.clean_url("https://user:pw@h.example/v1/m?key=SECRET&b=2&a=1")
        == "https://h.example/v1/m?a=1&b=2"
    )


def test_the_mcp_cobalt_run_records_and_replays(capitals: Project, provider: FakeProvider):
    from types import SimpleNamespace

    from tests.test_mcp import run_session, text_of

    live = SimpleNamespace(openai_base_url=provider.openai_base_url)
    seen: dict[str, dict] = {}

    async def scenario(session) -> None:
        for mode in ("record", "replay"):
            result = await session.call_tool(
                "cobalt_run", {"file": "experiments/capitals.cobalt.py", "replay": mode}
            )
            assert not result.is_error, text_of(result)
            seen[mode] = result.structured_content["runs"][0]
            provider.stop()  # replaying needs no provider
        wrong = await session.call_tool("cobalt_run", {"replay": "sometimes"})
        assert wrong.is_error

    run_session(capitals, live, scenario)
    assert seen["record"]["replay"] == "recorded" and seen["replay"]["replay"] == "replayed"
    assert [i["status"] for i in seen["replay"]["items"]] == ["ok"] * len(CAPITALS)
    assert sorted(output(i) for i in seen["replay"]["items"]) == sorted(
        output(i) for i in seen["record"]["items"]
    )


SECRETIVE_AGENT = """
import os

from openai import OpenAI

from cobalt import Dataset, experiment

client = OpenAI()


@experiment("secretive", Dataset(items=[{"id": "a", "city": "Paris"}, {"id": "b", "city": "Rome"}]))
def run(ctx):
    reply = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{
            "role": "user",
            "content": f"use {os.environ['ACME_API_TOKEN']} and sk-body-0123456789 "
            f"[[reply:{ctx.item['city']} sk-ant-reply-0123456789]]",
        }],
        extra_body={"api_key": "zqBodyFieldValue1"},
        extra_query={"key": "zqQueryValue1"},
    )
    return reply.choices[0].message.content
"""


def test_secrets_in_bodies_are_recorded_redacted_and_the_run_still_replays(
    project: Project, provider: FakeProvider
):
    project.write("experiments/secretive.cobalt.py", SECRETIVE_AGENT)
    live = {**urls(provider), "ACME_API_TOKEN": "zqEnvironmentValue1"}
    recorded = cobalt(project, live, "run", "--record")
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    sent = provider.requests[0]["json"]["messages"][0]["content"]
    assert "zqEnvironmentValue1" in sent  # the provider got the real request
    first = latest_results(project, "secretive")
    stored = json.dumps(recording_rows(project, "secretive"))
    needles = ("zqEnvironmentValue1", "sk-body-", "sk-ant-reply-", "zqBodyFieldValue1", "zqQuery")
    assert [n for n in needles if n in stored] == []
    assert "use *** and *** [[reply:Paris ***]]" in stored and '"api_key": "***"' in stored

    provider.stop()
    replayed = cobalt(project, live, "run", "--replay", keys=False)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    second = latest_results(project, "secretive")
    assert second["replay"] == "replayed"
    shown = {k: (i["status"], output(i)) for k, i in by_key(second).items()}
    assert shown == {("a", 0): ("ok", "Paris ***"), ("b", 0): ("ok", "Rome ***")}
    assert shown == {k: (i["status"], output(i)) for k, i in by_key(first).items()}
