"""Compact storage of traces and recordings (`blob_store`, `trace_store`, `recording_store`):
exact round trips, parts shared by items stored once, orphans pruned, old rows migrated (on
SQLite and PostgreSQL), and every reader showing the same trace as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.test import Client
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cobalt import Dataset, Evaluator, experiment
from cobalt.experiments import collecting
from cobalt_app import (
    blob_store,
    page_compare_side,
    recording_store,
    results,
    services,
    trace_spans,
    trace_store,
)
from cobalt_app.engine import ItemOutcome
from cobalt_app.models import Blob, ItemResult, ItemTrace, Recording, Run
from cobalt_app.selectors import item_trace
from tests.conftest import REPO, cli_env

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

pytestmark = pytest.mark.django_db


def stored_value(data: bytes, refs: bytes, blobs: dict[str, bytes]) -> Any:
    """A stored document read with a plain database connection: its data and blob list, and
    the database's blobs (hash → data)."""
    texts = {
        digest: blob_store.decompress([blobs[digest]])[0] for digest in blob_store.digests(refs)
    }
    return blob_store.unpack(blob_store.decompress([data])[0], refs, texts)


def round_trip(documents: list[tuple[Any, str | None]]) -> list[Any]:
    """Documents packed in one batch, then read back from what was packed."""
    blobs: dict[str, bytes] = {}
    stored = blob_store.pack(documents, blobs)
    texts = {
        digest: text
        for digest, text in zip(blobs, blob_store.decompress(list(blobs.values())), strict=True)
    }
    plain = blob_store.decompress([data for data, _ in stored])
    return [
        blob_store.unpack(text, refs, texts) for text, (_, refs) in zip(plain, stored, strict=True)
    ]


def prompt(size: int = 2100) -> str:
    """A system prompt of its own for each test (the process remembers what it has seen)."""
    rules = " ".join(
        f"Rule {n}: answer politely about order {n} ({uuid.uuid4().hex})." for n in range(60)
    )
    return f"You are a support agent.\n{rules}"[:size]


def steps(system: str, question: str, n: int = 0) -> list[dict[str, Any]]:
    """A trace as `trace_spans` stores it: an agent turn, a model call whose input begins
    with the system prompt, a tool call."""

    def step(name: str, kind: str, text_in: str, text_out: str, parent: int | None = 0) -> dict:
        return {
            "name": name,
            "kind": kind,
            "parent": parent,
            "startMs": 1.5 * n,
            "durationMs": 12.25,
            "model": "gpt-4o-mini" if kind == "llm" else None,
            "inputTokens": 1200 + n if kind == "llm" else None,
            "outputTokens": 40 if kind == "llm" else None,
            "cost": 0.00021 if kind == "llm" else None,
            "status": "ok",
            "error": None,
            "input": text_in,
            "output": text_out,
        }

    messages = json.dumps(
        [{"role": "system", "content": system}, {"role": "user", "content": question}]
    )
    return [
        step("agent", "agent", question, f"answer {n}", parent=None),
        step("ChatCompletion", "llm", messages[:2000], '{"tool_calls": [{"name": "lookup"}]}'),
        step("lookup", "tool", json.dumps({"order": n}), f"order {n} shipped ✓ 🚚"),
    ]


def exchanges(system: str, question: str) -> list[dict[str, Any]]:
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": "Looks up an order by its number. " * 3,
                "parameters": {"type": "object", "properties": {"order": {"type": "string"}}},
            },
        }
        for i in range(6)
    ]
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "tools": tools,
    }
    response = {
        "status": 200,
        "headers": {"content-type": "application/json"},
        "body": json.dumps({"id": uuid.uuid4().hex, "choices": [{"message": {"content": "ok"}}]}),
    }
    return [
        {
            "request": {
                "method": "POST",
                "url": "https://api.openai.com/v1/chat/completions",
                "body": body,
            },
            "response": response,
        }
    ]


# ------------------------------------------------------------------ the codec, no database

LONG = st.text(min_size=1, max_size=40).map(lambda s: (s * (600 // len(s) + 1))[: 520 + len(s)])
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
    | LONG,
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(), children, max_size=6)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents=st.lists(JSON, min_size=1, max_size=4), shared=LONG)
def test_any_json_reads_back_exactly_however_it_was_cut(documents, shared):
    # Each document three times, and a long string every document holds: parts seen before.
    values = [[document, shared, {"again": shared}] for document in documents] * 3
    assert round_trip([(value, None) for value in values]) == values
    given_text = [(value, json.dumps(value, ensure_ascii=False)) for value in values]
    assert round_trip(given_text) == values


@pytest.mark.parametrize(
    "value",
    [
        ["\x00blob\x00", "\x000\x00" * 300, "x" * 600],  # NUL characters in the data
        ["\ud800 lone surrogate " * 40, {"\udfff": "é" * 700}],
        {"key": "a\\u0000b" * 100, "k2": "\\" * 1000, "quote": '"' * 700},
        "just one long string " * 40,
        [{"tools": [{"name": f"t{i}", "description": "d" * 150} for i in range(8)]}] * 2,
        [1e-320, -0.0, 10**30, 1.5e300, [], {}, ""],
    ],
)
def test_awkward_values_read_back_exactly(value):
    assert round_trip([(value, None)] * 3) == [value] * 3


def test_a_text_that_is_not_the_values_own_is_still_stored_exactly():
    # storable salvages a trace before writing its text; the steps given beside may differ
    value = ["x" * 700, "y" * 700]
    text = json.dumps(["x" * 700, "z" * 700], ensure_ascii=False)
    for _ in range(3):
        ((data, refs),) = blob_store.pack([(value, text)], {})
    assert blob_store.decompress([data])[0].count("z") == 700
    assert len(refs) == blob_store.DIGEST  # the x's, found in the text; the y's are not there


def test_a_long_beginning_shared_by_inputs_is_cut_into_pieces_stored_once():
    system = prompt(1800)
    documents = [(steps(system, f"where is order {n}?", n), None) for n in range(10)]
    inputs = [json.dumps(value[1]["input"], ensure_ascii=False) for value, _ in documents[:2]]
    common = len(os.path.commonprefix(inputs)) - 1  # the quote is not part of the text
    blobs: dict[str, bytes] = {}
    stored = blob_store.pack(documents, blobs)
    assert len(blobs) == common // blob_store.PIECE_CHARS == 3
    assert stored[0][1] == b""  # seen once: stays in place
    assert all(len(refs) == 3 * blob_store.DIGEST for _, refs in stored[1:])
    assert round_trip(documents) == [value for value, _ in documents]


# ------------------------------------------------------------------ the database


def make_run(traced: dict[str, list[dict[str, Any]]], name: str = "support") -> Run:
    """A finished run whose items have these traces, written as the engine writes them."""
    with collecting() as found:
        experiment(
            name,
            Dataset(items=[{"id": key, "input": key} for key in traced]),
            lambda ctx: None,
            evaluators=[Evaluator(name="one", type="function", fn=lambda ctx: 1.0)],
        )
    run = services.run_create(
        experiment=found[0], settings={"runs": 1, "concurrency": 1, "timeout": 30}
    )
    services.run_start(run.id)
    outcomes = [
        ItemOutcome(
            id=snapshot.id,
            item_index=snapshot.item_index,
            run_index=snapshot.run_index,
            item_key=snapshot.item_key,
            status="error" if snapshot.item_key.startswith("bad") else "ok",
            output=f"answer {snapshot.item_key}",
            error="boom" if snapshot.item_key.startswith("bad") else "",
            finished_at=timezone.now(),
            trace=traced[snapshot.item_key],
        )
        for snapshot in services.item_snapshots(run.id)
    ]
    services.record_item_outcomes(run.id, outcomes)
    results.run_finalise(run.id)
    return Run.objects.get(id=run.id)


def stored_bytes(rows) -> int:
    return sum(len(data) + len(refs) for data, refs in rows)


def test_ten_items_sharing_a_system_prompt_store_it_once():
    system = prompt()
    traced = {f"k{n}": prompted(system, n) for n in range(10)}
    run = make_run(traced)
    assert Blob.objects.count() == 1
    rows = list(
        ItemTrace.objects.filter(item__run=run)
        .order_by("item__item_index")
        .values_list("data", "blobs")
    )
    assert [len(refs) for _, refs in rows] == [0] + [blob_store.DIGEST] * 9
    assert max(stored_bytes([row]) for row in rows[1:]) < 250 < len(system)
    items = ItemResult.objects.filter(run=run).order_by("item_index")
    assert trace_store.read(i.id for i in items) == {i.id: traced[i.item_key] for i in items}


def test_traces_read_as_text_are_their_stored_json_and_a_linked_one_is_read_as_steps():
    system = prompt()
    traced = {f"k{n}": steps(system, f"question {n}", n) for n in range(3)}
    linked = {**traced["k2"][1], "traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7"}
    traced["k2"] = [traced["k2"][0], {**linked, "startUnixMs": 1_700_000_000_000.0}]
    run = make_run(traced)
    items = {i.id: i.item_key for i in ItemResult.objects.filter(run=run)}
    as_text = trace_store.read_traces(items, as_text=True)
    for item_id, key in items.items():
        text = as_text[item_id].steps
        if key == "k2":  # a service's spans may join it: read, to be merged
            assert text == traced[key]
        else:
            assert text == json.dumps(traced[key], ensure_ascii=False)
            assert "\n" not in text
    assert trace_store.read(items) == {item_id: traced[key] for item_id, key in items.items()}


def test_recordings_store_the_prompt_and_tools_once_and_read_back_exactly():
    system = prompt()
    recorded = {f"item-{n}": exchanges(system, f"question {n}") for n in range(10)}
    for key, exchange in recorded.items():
        recording_store.save(
            experiment="e", item_key=key, run_index=0, exchanges=exchange, run_id="r"
        )
    assert Blob.objects.count() == 2  # the system prompt and the tools array
    assert recording_store.load_experiment("e") == {(k, 0): v for k, v in recorded.items()}
    rows = list(Recording.objects.order_by("id").values_list("data", "blobs"))
    size = len(json.dumps(recorded["item-1"]))
    assert max(stored_bytes([row]) for row in rows[1:]) < size / 10 < stored_bytes(rows[:1])


def prompted(system: str, n: int) -> list[dict[str, Any]]:
    """A one-step trace whose input is the system prompt."""
    return [{**steps(system, "q", n)[0], "input": system, "output": f"reply {n}"}]


def test_orphans_are_pruned_and_a_blob_pruned_under_a_writer_comes_back():
    first, second, system = prompt(), prompt(), prompt()
    doomed = make_run({f"k{n}": prompted(first, n) for n in range(3)})
    kept = make_run({f"k{n}": prompted(second, n) for n in range(3)})
    for n in range(3):
        recording_store.save(
            experiment="e", item_key=f"i{n}", run_index=0, exchanges=exchanges(system, "q")
        )
    stored = Blob.objects.count()
    assert stored == 4 and blob_store.prune_orphans() == 0
    Run.objects.filter(id=doomed.id).delete()
    assert blob_store.prune_orphans() == 1 and Blob.objects.count() == stored - 1
    assert [s["input"] for t in item_trace_of(kept).values() for s in t] == [second] * 3

    # This process remembers the first prompt as a blob: its rows refer to it, and store it.
    again = make_run({f"k{n}": prompted(first, n) for n in range(2)})
    assert not ItemTrace.objects.filter(item__run=again, blobs=b"").exists()
    assert [s["input"] for t in item_trace_of(again).values() for s in t] == [first] * 2
    assert Blob.objects.count() == stored

    Recording.objects.all().delete()
    Run.objects.all().delete()
    assert blob_store.prune_orphans() == stored and not Blob.objects.exists()


def item_trace_of(run: Run) -> dict[int, list[dict[str, Any]]]:
    return trace_store.read(ItemResult.objects.filter(run=run).values_list("id", flat=True))


def test_a_missing_blob_is_an_error_that_names_it():
    system = prompt()
    run = make_run({f"k{n}": prompted(system, n) for n in range(2)})
    digest = Blob.objects.get().sha256
    Blob.objects.all().delete()
    blob_store._read.entries.pop(digest, None)
    with pytest.raises(blob_store.MissingBlob, match=digest):
        item_trace_of(run)


def test_the_pages_results_file_and_failed_items_show_the_same_trace(tmp_path):
    system = prompt(1900)
    traced = {key: steps(system, f"question {key}", n) for n, key in enumerate(["a", "b", "bad-c"])}
    before = make_run(traced, name="shop")
    after = make_run(traced, name="shop")
    assert ItemTrace.objects.exclude(blobs=b"").exists()

    entries = results.run_results(after)["items"]
    assert {e["key"]: e["trace"] for e in entries} == traced
    written = json.loads(results.write_results_file(after, tmp_path).read_text())
    assert {e["key"]: e["trace"] for e in written["items"]} == traced

    items = {i.item_key: i for i in ItemResult.objects.filter(run=after)}
    assert item_trace(items["a"].id) == traced["a"]
    failed = results.item_outcomes([i.id for i in items.values()])
    assert {o.item_key: o.trace for o in failed} == {"a": [], "b": [], "bad-c": traced["bad-c"]}

    panel = Client(HTTP_HOST="127.0.0.1").get(f"/runs/{after.id}/items/{items['b'].number}/")
    assert panel.status_code == 200
    assert trace_spans.summary(traced["b"]) in panel.content.decode()

    (side,) = page_compare_side.side_by_side(before, after, "a")
    expected = trace_spans.render(traced["a"], max_chars=page_compare_side.TRACE_STEP_CHARS)
    assert side["traceA"].text == side["traceB"].text == expected


# ------------------------------------------------------------------ migration, both databases

MIGRATE = """
import json, sys
import django
django.setup()
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

OLD = ("cobalt_app", "0008_verdict_pass_marks")
executor = MigrationExecutor(connection)
executor.migrate([OLD])
old = executor.loader.project_state(OLD).apps
run = old.get_model("cobalt_app", "Run").objects.create(id="r1", name="e", file="f")
Item = old.get_model("cobalt_app", "ItemResult")
items = [Item.objects.create(run=run, item_index=n, item_key=f"k{n}", input={}) for n in range(12)]
traces, recorded = json.loads(sys.stdin.read())
for item, steps in zip(items, traces):
    old.get_model("cobalt_app", "ItemTrace").objects.create(item=item, steps=steps)
for n, exchanges in enumerate(recorded):
    old.get_model("cobalt_app", "Recording").objects.create(
        experiment="e", item_key=f"k{n}", exchanges=exchanges, request_count=len(exchanges))

executor = MigrationExecutor(connection)
executor.migrate(executor.loader.graph.leaf_nodes())
from cobalt_app import blob_store, recording_store, trace_store
from cobalt_app.models import Blob
ids = [item.id for item in items]
read = trace_store.read(ids)
out = {
    "traces": [read[i] for i in ids],
    "recordings": [recording_store.load_experiment("e")[(f"k{n}", 0)] for n in range(len(recorded))],
    "blobs": Blob.objects.count(),
    "pruned": blob_store.prune_orphans(),
}
trace_store.write([(ids[0], json.dumps(traces[1], ensure_ascii=False), traces[1], "")])
out["rewritten"] = trace_store.read([ids[0]])[ids[0]]

executor = MigrationExecutor(connection)
executor.migrate([OLD])
old = executor.loader.project_state(OLD).apps
out["reversed"] = [old.get_model("cobalt_app", "ItemTrace").objects.get(item_id=i).steps for i in ids]
print(json.dumps(out))
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path) -> Iterator[dict[str, str]]:
    if request.param == "sqlite":
        yield {"COBALT_SQLITE_PATH": str(tmp_path / "old.db")}
        return
    name = f"cobalt_test_blobs_{os.getpid()}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield {"COBALT_DATABASE_URL": f"postgresql://postgres@127.0.0.1:5432/{name}"}
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_existing_traces_and_recordings_are_migrated_and_back(database, tmp_path: Path):
    system = prompt()
    traces = [steps(system, f"question {n}", n) for n in range(12)]
    recorded = [exchanges(system, f"question {n}") for n in range(12)]
    (tmp_path / "cobalt.toml").write_text("")
    env = cli_env({"DJANGO_SETTINGS_MODULE": "cobalt_project.settings", **database})
    done = subprocess.run(
        [sys.executable, "-c", MIGRATE],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(REPO)},
        input=json.dumps([traces, recorded]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["traces"] == traces and out["recordings"] == recorded
    assert out["blobs"] == 3  # the prompt, the tools; the model call's input (the prompt's start)
    assert out["pruned"] == 0
    assert out["rewritten"] == traces[1]
    assert out["reversed"] == [traces[1], *traces[1:]]
