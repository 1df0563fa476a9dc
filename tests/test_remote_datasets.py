"""Remote datasets against a local HTTP server that replays each platform's documented API,
two pages each."""

from __future__ import annotations

import ast
import base64
import json
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import cobalt.remote
from cobalt import Dataset
from cobalt.dataset import DatasetError, item_key

LANGFUSE_AUTH = "Basic " + base64.b64encode(b"pk-lf-public:sk-lf-SECRET").decode()
LANGSMITH_KEY = "lsv2-SECRET"
BRAINTRUST_KEY = "bt-SECRET"
BASALT_KEY = "bs-SECRET"

LANGFUSE_PAGES = {
    1: [
        {
            "id": "lf-1",
            "status": "ACTIVE",
            "input": {"question": "2+2?"},
            "expectedOutput": "4",
            "metadata": {"topic": "math"},
            "datasetName": "qa",
        },
        {
            "id": "lf-2",
            "status": "ARCHIVED",
            "input": "old",
            "expectedOutput": "x",
            "metadata": None,
        },
    ],
    2: [
        {"id": "lf-3", "status": "ACTIVE", "input": "Capital of France?", "expectedOutput": "Paris"}
    ],
}
LANGSMITH_EXAMPLES = [
    {
        "id": "ls-1",
        "inputs": {"question": "2+2?"},
        "outputs": {"answer": "4"},
        "metadata": {"split": "test"},
    },
    {"id": "ls-2", "inputs": {"q": "a", "ctx": "b"}, "outputs": {"answer": "c"}, "metadata": None},
    {"id": "ls-3", "inputs": {"question": "Capital?"}, "outputs": None},
]
BRAINTRUST_EVENTS = [
    {"id": "bt-1", "input": "2+2?", "expected": "4", "metadata": {"k": 1}, "tags": ["math"]},
    {"id": "bt-2", "input": {"q": "x"}, "expected": {"a": "y"}, "metadata": None},
    {"id": "bt-3", "input": "Capital?", "expected": "Paris"},
]
BASALT_ITEMS = [
    {
        "id": "bs-1",
        "input": "2+2?",
        "output": "4",
        "metadata": {"topic": "math"},
        "name": "sum",
        "tags": ["math"],
    },
    {"id": "bs-2", "input": {"q": "x"}, "output": {"a": "y"}, "metadata": None},
    {"id": "bs-3", "input": "Capital?", "output": "Paris"},
]


class Replay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.route("GET", None)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.route("POST", json.loads(self.rfile.read(length) or b"null"))

    def route(self, method: str, body: Any) -> None:
        parts = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(parts.query))
        self.server.log.append(
            {
                "method": method,
                "path": parts.path,
                "query": query,
                "body": body,
                "headers": {k.lower(): v for k, v in self.headers.items()},
            }
        )
        path = parts.path
        if path.startswith("/api/public/"):
            return self.langfuse(path, query)
        if path.startswith("/api/v1/"):
            return self.langsmith(path, query)
        if path.startswith("/v1/datasets/"):
            return self.basalt(path, query)
        if path.startswith("/v1/"):
            return self.braintrust(path, query, body)
        return self.files(path)

    def langfuse(self, path: str, query: dict[str, str]) -> None:
        if self.headers.get("Authorization") != LANGFUSE_AUTH:
            return self.send(401, {"message": "Invalid authorization header"})
        if path != "/api/public/dataset-items" or query.get("datasetName") != "qa":
            return self.send(404, {"message": "Dataset not found"})
        page = int(query["page"])
        rows = LANGFUSE_PAGES.get(page, [])
        meta = {"page": page, "limit": int(query["limit"]), "totalItems": 3, "totalPages": 2}
        self.send(200, {"data": rows, "meta": meta})

    def langsmith(self, path: str, query: dict[str, str]) -> None:
        if self.headers.get("X-API-Key") != LANGSMITH_KEY:
            return self.send(403, {"detail": "Forbidden"})
        if path == "/api/v1/datasets":
            found = [{"id": "ds-uuid-1", "name": "qa"}] if query.get("name") == "qa" else []
            return self.send(200, found)
        if path == "/api/v1/examples" and query.get("dataset") == "ds-uuid-1":
            offset, limit = int(query["offset"]), int(query["limit"])
            return self.send(200, LANGSMITH_EXAMPLES[offset : offset + limit])
        self.send(404, {"detail": "Not found"})

    def braintrust(self, path: str, query: dict[str, str], body: Any) -> None:
        if self.headers.get("Authorization") != f"Bearer {BRAINTRUST_KEY}":
            return self.send(401, {"error": "Invalid API key"})
        if path == "/v1/dataset":
            wanted = (query.get("project_name"), query.get("dataset_name"))
            objects = [{"id": "bt-ds-9", "name": "golden"}] if wanted == ("proj", "golden") else []
            return self.send(200, {"objects": objects})
        if path == "/v1/dataset/bt-ds-9/fetch" and self.command == "POST":
            limit = body["limit"]
            start = int(body.get("cursor", "0"))
            events = BRAINTRUST_EVENTS[start : start + limit]
            following = start + limit
            cursor = str(following) if following < len(BRAINTRUST_EVENTS) else None
            return self.send(200, {"events": events, "cursor": cursor})
        self.send(404, {"error": "not found"})

    def basalt(self, path: str, query: dict[str, str]) -> None:
        """Three shapes: `items` with a cursor (`qa`), `data` with a relative next link
        (`linked`), a bare list (`bare`); `odd` answers something else."""
        if self.headers.get("Authorization") != f"Bearer {BASALT_KEY}":
            return self.send(401, {"message": "Invalid API key"})
        if path == "/v1/datasets/qa/items":
            start = int(query.get("cursor", "0"))
            following = start + 2 if start + 2 < len(BASALT_ITEMS) else None
            return self.send(
                200, {"items": BASALT_ITEMS[start : start + 2], "nextCursor": following}
            )
        if path == "/v1/datasets/linked/items":
            if query.get("page") == "2":
                return self.send(200, {"data": BASALT_ITEMS[2:], "next": None})
            return self.send(200, {"data": BASALT_ITEMS[:2], "next": "items?page=2"})
        if path == "/v1/datasets/bare/items":
            return self.send(200, BASALT_ITEMS[:1])
        if path == "/v1/datasets/odd/items":
            return self.send(200, {"results": []})
        self.send(404, {"message": "Dataset missing not found"})

    def files(self, path: str) -> None:
        files = {
            "/qa.jsonl": (
                "application/x-ndjson",
                '{"id": "u1", "input": "a"}\n{"id": "u2", "input": "b"}\n',
            ),
            "/qa.csv": ("text/csv; charset=utf-8", "id,input\nc1,hello\nc2,world\n"),
            "/api/items": ("application/json", json.dumps({"items": [{"id": "j1", "input": "x"}]})),
            "/broken.jsonl": ("application/x-ndjson", '{"id": "ok"}\n{"id": \n'),
            "/mystery": ("application/octet-stream", "???"),
            "/export": ("application/octet-stream", '{"id": "e1"}\n'),
        }
        if path not in files:
            return self.send(404, {"error": "no such file"})
        content_type, text = files[path]
        self.send(200, text, content_type)

    def send(self, status: int, payload: Any, content_type: str = "application/json") -> None:
        raw = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@pytest.fixture
def replay(monkeypatch) -> Iterator[Any]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Replay)
    server.log = []
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    server.base = base
    for name in ("LANGFUSE_HOST", "LANGSMITH_ENDPOINT", "BRAINTRUST_API_URL", "BASALT_API_URL"):
        monkeypatch.setenv(name, base)
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", "pk-lf-public")
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-lf-SECRET")
    monkeypatch.setenv("LANGSMITH_API_KEY", LANGSMITH_KEY)
    monkeypatch.setenv("BRAINTRUST_API_KEY", BRAINTRUST_KEY)
    monkeypatch.setenv("BASALT_API_KEY", BASALT_KEY)
    for name in ("LANGFUSE_BASE_URL", "LANGCHAIN_API_KEY", "LANGCHAIN_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# ---------------------------------------------------------------------- Langfuse


def test_langfuse_reads_both_pages_with_basic_auth_and_skips_archived_items(replay):
    dataset = Dataset.from_langfuse("qa", page_size=2)
    assert dataset.items == [
        {
            "id": "lf-1",
            "input": {"question": "2+2?"},
            "expected_output": "4",
            "metadata": {"topic": "math"},
        },
        {"id": "lf-3", "input": "Capital of France?", "expected_output": "Paris", "metadata": {}},
    ]
    assert dataset.keys() == ["lf-1", "lf-3"]  # the platform id is the item key
    assert (dataset.name, dataset.source) == ("qa", "langfuse:qa")
    pages = [(r["path"], r["query"]) for r in replay.log]
    assert pages == [
        ("/api/public/dataset-items", {"datasetName": "qa", "page": "1", "limit": "2"}),
        ("/api/public/dataset-items", {"datasetName": "qa", "page": "2", "limit": "2"}),
    ]


def test_langfuse_can_keep_archived_items(replay):
    dataset = Dataset.from_langfuse("qa", page_size=2, include_archived=True)
    assert [item_key(i) for i in dataset] == ["lf-1", "lf-2", "lf-3"]


def test_langfuse_errors_name_the_platform_and_status(replay, monkeypatch):
    with pytest.raises(DatasetError, match=r"Langfuse: HTTP 404 Not Found .*Dataset not found"):
        Dataset.from_langfuse("nope")
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "wrong")
    with pytest.raises(DatasetError, match=r"Langfuse: HTTP 401 .*Check the credentials"):
        Dataset.from_langfuse("qa")


def test_langfuse_without_keys_names_the_variable(replay, monkeypatch):
    monkeypatch.delenv("LANGFUSE_SECRET_KEY")
    with pytest.raises(DatasetError, match="Langfuse: LANGFUSE_SECRET_KEY is not set"):
        Dataset.from_langfuse("qa")
    assert replay.log == []


def test_langfuse_credentials_can_come_from_arguments_and_config(replay, monkeypatch, project):
    monkeypatch.delenv("LANGFUSE_PUBLIC_KEY")
    monkeypatch.delenv("LANGFUSE_SECRET_KEY")
    assert (
        len(Dataset.from_langfuse("qa", public_key="pk-lf-public", secret_key="sk-lf-SECRET")) == 2
    )
    from cobalt.config import load_config, set_active_config

    project.write(
        "cobalt.toml",
        '[langfuse]\npublic_key = "pk-lf-public"\nsecret_key = "sk-lf-SECRET"\n',
    )
    set_active_config(load_config(project.path))
    try:
        assert len(Dataset.from_langfuse("qa")) == 2
    finally:
        set_active_config(None)


# ---------------------------------------------------------------------- LangSmith


def test_langsmith_resolves_the_dataset_and_pages_through_examples(replay):
    dataset = Dataset.from_langsmith("qa", page_size=2)
    first, second, third = dataset.items
    assert first == {
        "id": "ls-1",
        "input": "2+2?",
        "expected_output": "4",
        "inputs": {"question": "2+2?"},
        "outputs": {"answer": "4"},
        "metadata": {"split": "test"},
    }
    assert second["input"] == {"q": "a", "ctx": "b"}  # several inputs stay a dict
    assert third["expected_output"] is None
    assert dataset.keys() == ["ls-1", "ls-2", "ls-3"]
    calls = [(r["path"], r["query"]) for r in replay.log]
    assert calls == [
        ("/api/v1/datasets", {"name": "qa"}),
        ("/api/v1/examples", {"dataset": "ds-uuid-1", "offset": "0", "limit": "2"}),
        ("/api/v1/examples", {"dataset": "ds-uuid-1", "offset": "2", "limit": "2"}),
    ]
    assert all(r["headers"]["x-api-key"] == LANGSMITH_KEY for r in replay.log)


def test_langsmith_errors(replay, monkeypatch):
    with pytest.raises(DatasetError, match="LangSmith: no dataset named 'other'"):
        Dataset.from_langsmith("other")
    monkeypatch.setenv("LANGSMITH_API_KEY", "wrong")
    with pytest.raises(DatasetError, match=r"LangSmith: HTTP 403 Forbidden .*: Forbidden"):
        Dataset.from_langsmith("qa")
    monkeypatch.delenv("LANGSMITH_API_KEY")
    with pytest.raises(DatasetError, match="LangSmith: LANGSMITH_API_KEY is not set"):
        Dataset.from_langsmith("qa")


# ---------------------------------------------------------------------- Braintrust


def test_braintrust_resolves_project_and_dataset_and_follows_the_cursor(replay):
    dataset = Dataset.from_braintrust("proj", "golden", page_size=2)
    assert dataset.items[0] == {
        "id": "bt-1",
        "input": "2+2?",
        "expected_output": "4",
        "metadata": {"k": 1},
        "tags": ["math"],
    }
    assert dataset.keys() == ["bt-1", "bt-2", "bt-3"]
    assert dataset.source == "braintrust:proj/golden"
    lookup, first, second = replay.log
    assert (lookup["path"], lookup["query"]) == (
        "/v1/dataset",
        {"project_name": "proj", "dataset_name": "golden"},
    )
    assert (first["method"], first["path"], first["body"]) == (
        "POST",
        "/v1/dataset/bt-ds-9/fetch",
        {"limit": 2},
    )
    assert second["body"] == {"limit": 2, "cursor": "2"}
    assert all(r["headers"]["authorization"] == f"Bearer {BRAINTRUST_KEY}" for r in replay.log)


def test_braintrust_errors(replay, monkeypatch):
    with pytest.raises(DatasetError, match="Braintrust: no dataset 'x' in project 'proj'"):
        Dataset.from_braintrust("proj", "x")
    monkeypatch.setenv("BRAINTRUST_API_KEY", "wrong")
    with pytest.raises(DatasetError, match=r"Braintrust: HTTP 401 .*Invalid API key"):
        Dataset.from_braintrust("proj", "golden")
    monkeypatch.delenv("BRAINTRUST_API_KEY")
    with pytest.raises(DatasetError, match="Braintrust: BRAINTRUST_API_KEY is not set"):
        Dataset.from_braintrust("proj", "golden")


# ---------------------------------------------------------------------- Basalt


def test_basalt_reads_every_page_with_a_bearer_key_and_keeps_every_field(replay):
    dataset = Dataset.from_basalt("qa")
    assert dataset.items[0] == {
        "id": "bs-1",
        "input": "2+2?",
        "expected_output": "4",
        "metadata": {"topic": "math"},
        "name": "sum",
        "tags": ["math"],
    }
    assert dataset.items[1]["expected_output"] == {"a": "y"}
    assert dataset.items[1]["metadata"] == {}
    assert dataset.keys() == ["bs-1", "bs-2", "bs-3"]  # the Basalt id is the item key
    assert (dataset.name, dataset.source) == ("qa", "basalt:qa")
    calls = [(r["method"], r["path"], r["query"]) for r in replay.log]
    assert calls == [
        ("GET", "/v1/datasets/qa/items", {}),
        ("GET", "/v1/datasets/qa/items", {"cursor": "2"}),
    ]
    assert all(r["headers"]["authorization"] == f"Bearer {BASALT_KEY}" for r in replay.log)


def test_basalt_follows_next_links_and_reads_data_or_a_bare_list(replay):
    assert Dataset.from_basalt("linked").keys() == ["bs-1", "bs-2", "bs-3"]
    assert replay.log[-1]["query"] == {"page": "2"}
    assert Dataset.from_basalt("bare").keys() == ["bs-1"]


def test_basalt_errors_name_the_platform_status_message_and_variable(replay, monkeypatch):
    with pytest.raises(DatasetError, match=r"Basalt: HTTP 404 .*Dataset missing not found"):
        Dataset.from_basalt("missing")
    with pytest.raises(DatasetError, match=r"Basalt: unexpected answer .*`items` or `data`"):
        Dataset.from_basalt("odd")
    with pytest.raises(DatasetError, match=r"Basalt: HTTP 401 .*Invalid API key"):
        Dataset.from_basalt("qa", api_key="wrong")
    monkeypatch.delenv("BASALT_API_KEY")
    calls = len(replay.log)
    with pytest.raises(DatasetError, match="Basalt: BASALT_API_KEY is not set"):
        Dataset.from_basalt("qa")
    assert len(replay.log) == calls


def test_basalt_key_and_url_can_come_from_the_config(replay, monkeypatch, project):
    monkeypatch.delenv("BASALT_API_KEY")
    monkeypatch.delenv("BASALT_API_URL")
    from cobalt.config import load_config, set_active_config

    project.write("cobalt.toml", f'[basalt]\napi_key = "{BASALT_KEY}"\napi_url = "{replay.base}"\n')
    set_active_config(load_config(project.path))
    try:
        assert len(Dataset.from_basalt("qa")) == 3
    finally:
        set_active_config(None)


# ---------------------------------------------------------------------- any URL


def test_from_url_picks_the_format_from_the_content_type_or_suffix(replay):
    jsonl = Dataset.from_url(f"{replay.base}/qa.jsonl")
    assert jsonl.keys() == ["u1", "u2"] and jsonl.name == "qa"
    assert jsonl.source == f"{replay.base}/qa.jsonl"
    csv = Dataset.from_url(f"{replay.base}/qa.csv?token=abc")
    assert csv.items == [{"id": "c1", "input": "hello"}, {"id": "c2", "input": "world"}]
    assert "token" not in csv.source  # query strings may hold secrets
    assert Dataset.from_url(f"{replay.base}/api/items").items == [{"id": "j1", "input": "x"}]
    forced = Dataset.from_url(f"{replay.base}/export", format="jsonl", name="m")
    assert (forced.name, forced.keys()) == ("m", ["e1"])


def test_from_url_errors_name_the_url_line_and_status(replay):
    with pytest.raises(DatasetError) as info:
        Dataset.from_url(f"{replay.base}/broken.jsonl")
    assert info.value.path == f"{replay.base}/broken.jsonl" and info.value.line == 2
    with pytest.raises(DatasetError, match=r"HTTP: HTTP 404 Not Found from .*/missing.json"):
        Dataset.from_url(f"{replay.base}/missing.json")
    with pytest.raises(DatasetError, match="cannot tell the format"):
        Dataset.from_url(f"{replay.base}/mystery")
    with pytest.raises(DatasetError, match="needs an http:// or https:// URL"):
        Dataset.from_url("file:///etc/passwd")
    with pytest.raises(DatasetError, match="cannot reach"):
        Dataset.from_url("http://127.0.0.1:9/qa.json", timeout=2)


def test_the_remote_module_uses_only_the_standard_library_and_cobalt():
    tree = ast.parse(Path(cobalt.remote.__file__).read_text(encoding="utf-8"))
    modules = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert modules <= set(sys.stdlib_module_names) | {"__future__", "cobalt"}
