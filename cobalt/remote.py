"""Remote datasets: any URL, Langfuse, LangSmith, Braintrust and Basalt (standard library only).

Each loader fetches every page, maps the platform's fields onto plain items and keeps the
platform's id as the item's `id` (so it is the item key that runs are compared by):

* Langfuse — `GET /api/public/dataset-items?datasetName=&page=&limit=` with Basic auth
  (public key : secret key), pages until `meta.totalPages`. Items: `id`, `input`,
  `expected_output` (from `expectedOutput`), `metadata`; archived items are skipped.
  `LANGFUSE_PUBLIC_KEY`, `LANGFUSE_SECRET_KEY`, `LANGFUSE_HOST` (default cloud.langfuse.com).
* LangSmith — `GET /api/v1/datasets?name=` for the dataset id, then
  `GET /api/v1/examples?dataset=&offset=&limit=` until a short page, header `X-API-Key`.
  Items: `id`, `input` and `expected_output` (the single value of `inputs`/`outputs` when
  they hold one key, else the whole dict), the raw `inputs`/`outputs`, `metadata`.
  `LANGSMITH_API_KEY`, `LANGSMITH_ENDPOINT` (default api.smith.langchain.com).
* Braintrust — `GET /v1/dataset?project_name=&dataset_name=` for the id, then
  `POST /v1/dataset/{id}/fetch` with `{"limit", "cursor"}` until no cursor, Bearer key.
  Items: `id`, `input`, `expected_output` (from `expected`), `metadata`, `tags`.
  `BRAINTRUST_API_KEY`, `BRAINTRUST_API_URL` (default api.braintrust.dev).
* Basalt — `GET /v1/datasets/{id}/items` with a Bearer key, following a `next` link or a
  cursor (`nextCursor`, `next_cursor`, `cursor`; sent back as `?cursor=`). Items: `id`,
  `input`, `expected_output` (from `output`, or `expected_output`), `metadata`, and every
  other field as it is. The answer's `items` (or `data`, or a bare list).
  `BASALT_API_KEY`, `BASALT_API_URL` (default api.basalt.ai).

Credentials and hosts come from the arguments, else the environment, else the project
configuration (`[langfuse]` public_key/secret_key/host, `[langsmith]` api_key/endpoint,
`[braintrust]` api_key/api_url, `[basalt]` api_key/api_url). Failures raise `DatasetError`
naming the platform, the HTTP status and the answer's message; a missing credential names the
variable to set.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from cobalt.dataset import Dataset, DatasetError

PAGE_SIZE = 100
MAX_PAGES = 10_000  # a runaway pagination guard: 1M items at the default page size
USER_AGENT = "cobalt-datasets/1"
FORMATS = ("json", "jsonl", "csv")

LANGFUSE_HOST = "https://cloud.langfuse.com"
LANGSMITH_ENDPOINT = "https://api.smith.langchain.com"
BRAINTRUST_API_URL = "https://api.braintrust.dev"
BASALT_API_URL = "https://api.basalt.ai"


# ---------------------------------------------------------------------- HTTP


def _request(
    platform: str,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    body: Any = None,
    timeout: float = 30,
) -> tuple[bytes, str]:
    """(body, content type) of a successful request; DatasetError naming the platform otherwise."""
    data = None
    all_headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})}
    if body is not None:
        data = json.dumps(body).encode()
        all_headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=all_headers)
    shown = _without_query_secrets(url)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        detail = _error_detail(exc)
        hint = " Check the credentials." if exc.code in (401, 403) else ""
        raise DatasetError(
            f"{platform}: HTTP {exc.code} {exc.reason} from {shown}{detail}.{hint}"
        ) from None
    except urllib.error.URLError as exc:
        raise DatasetError(f"{platform}: cannot reach {shown} ({exc.reason}).") from None
    except TimeoutError:
        raise DatasetError(f"{platform}: {shown} did not answer within {timeout:g}s.") from None


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        text = exc.read(2000).decode("utf-8", "replace").strip()
    except Exception:
        return ""
    try:
        data = json.loads(text)
        if isinstance(data, dict):
            text = str(data.get("message") or data.get("error") or data.get("detail") or text)
    except ValueError:
        pass
    text = " ".join(text.split())
    return f": {text[:200]}" if text else ""


def _without_query_secrets(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def _json(platform: str, raw: bytes, url: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        raise DatasetError(
            f"{platform}: {_without_query_secrets(url)} did not answer JSON (got {raw[:80]!r})."
        ) from None


def _setting(
    given: str | None, variables: tuple[str, ...], config_key: str, default: str | None = None
) -> str | None:
    if given:
        return given
    for variable in variables:
        if os.environ.get(variable):
            return os.environ[variable]
    try:
        from cobalt.config import active_config

        value = active_config().get(config_key)
    except Exception:  # a broken config is reported by the run itself
        value = None
    return str(value) if value else default


def _required(platform: str, value: str | None, variable: str, config_key: str) -> str:
    if not value:
        raise DatasetError(
            f"{platform}: {variable} is not set. Set it in the environment, or `{config_key}` "
            "in cobalt.toml, or pass it to the loader."
        )
    return value


def _base(url: str) -> str:
    return url.rstrip("/")


# ---------------------------------------------------------------------- any URL


def from_url(
    url: str,
    *,
    format: str | None = None,
    headers: dict[str, str] | None = None,
    name: str | None = None,
    timeout: float = 30,
) -> Dataset:
    """Load JSON, JSON Lines or CSV over HTTP(S); the format comes from the content type or
    the URL's suffix (or `format=`)."""
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https"):
        raise DatasetError(f"from_url needs an http:// or https:// URL (got {url!r}).")
    if format is not None and format not in FORMATS:
        raise DatasetError(f"format must be one of {', '.join(FORMATS)} (got {format!r}).")
    raw, content_type = _request("HTTP", url, headers=headers, timeout=timeout)
    chosen = format or _format_of(content_type, url)
    if chosen is None:
        raise DatasetError(
            f"cannot tell the format of {_without_query_secrets(url)} (content type "
            f"{content_type or 'none'!r}); pass format='json', 'jsonl' or 'csv'."
        )
    path = urllib.parse.urlsplit(url).path
    default_name = Path(path).stem or urllib.parse.urlsplit(url).netloc
    return _parse(raw, chosen, source=_without_query_secrets(url), name=name or default_name)


def _format_of(content_type: str, url: str) -> str | None:
    kind = content_type.split(";")[0].strip().lower()
    if kind in ("application/x-ndjson", "application/jsonl", "application/x-jsonlines"):
        return "jsonl"
    if kind in ("text/csv", "application/csv"):
        return "csv"
    suffix = Path(urllib.parse.urlsplit(url).path).suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix == ".csv":
        return "csv"
    if suffix == ".json" or kind == "application/json" or kind.endswith("+json"):
        return "json"
    return None


def _parse(raw: bytes, format: str, *, source: str, name: str) -> Dataset:
    """Parse downloaded bytes with the file loaders, so errors read the same (line, column)."""
    loader = {"json": Dataset.from_json, "jsonl": Dataset.from_jsonl, "csv": Dataset.from_csv}
    with tempfile.TemporaryDirectory(prefix="cobalt-remote-") as folder:
        path = Path(folder) / f"download.{format}"
        path.write_bytes(raw)
        try:
            # Read into memory while the download exists: JSON Lines and CSV are streamed
            # from their file, which goes with the temporary folder.
            items = list(loader[format](path))
        except DatasetError as exc:
            raise DatasetError(exc.reason, path=source, line=exc.line, column=exc.column) from None
    return Dataset(items, name=name, source=source)


# ---------------------------------------------------------------------- Langfuse


def from_langfuse(
    name: str,
    *,
    public_key: str | None = None,
    secret_key: str | None = None,
    host: str | None = None,
    page_size: int = PAGE_SIZE,
    include_archived: bool = False,
) -> Dataset:
    """Every item of a Langfuse dataset."""
    platform = "Langfuse"
    public = _required(
        platform,
        _setting(public_key, ("LANGFUSE_PUBLIC_KEY",), "langfuse.public_key"),
        "LANGFUSE_PUBLIC_KEY",
        "langfuse.public_key",
    )
    secret = _required(
        platform,
        _setting(secret_key, ("LANGFUSE_SECRET_KEY",), "langfuse.secret_key"),
        "LANGFUSE_SECRET_KEY",
        "langfuse.secret_key",
    )
    base = _base(
        _setting(host, ("LANGFUSE_HOST", "LANGFUSE_BASE_URL"), "langfuse.host", LANGFUSE_HOST)
        or LANGFUSE_HOST
    )
    token = base64.b64encode(f"{public}:{secret}".encode()).decode()
    headers = {"Authorization": f"Basic {token}"}
    items: list[dict[str, Any]] = []
    page = 1
    while page <= MAX_PAGES:
        query = urllib.parse.urlencode({"datasetName": name, "page": page, "limit": page_size})
        url = f"{base}/api/public/dataset-items?{query}"
        data = _json(platform, _request(platform, url, headers=headers)[0], url)
        rows = data.get("data") if isinstance(data, dict) else None
        if not isinstance(rows, list):
            raise DatasetError(f"{platform}: unexpected answer from {url} (no `data` list).")
        for row in rows:
            if not include_archived and row.get("status") == "ARCHIVED":
                continue
            items.append(
                {
                    "id": row.get("id"),
                    "input": row.get("input"),
                    "expected_output": row.get("expectedOutput"),
                    "metadata": row.get("metadata") or {},
                }
            )
        total_pages = (data.get("meta") or {}).get("totalPages")
        if not rows or not isinstance(total_pages, int) or page >= total_pages:
            break
        page += 1
    return Dataset(items, name=name, source=f"langfuse:{name}")


# ---------------------------------------------------------------------- LangSmith


def _single(value: Any) -> Any:
    if isinstance(value, dict) and len(value) == 1:
        return next(iter(value.values()))
    return value


def from_langsmith(
    name: str,
    *,
    api_key: str | None = None,
    endpoint: str | None = None,
    page_size: int = PAGE_SIZE,
) -> Dataset:
    """Every example of a LangSmith dataset."""
    platform = "LangSmith"
    key = _required(
        platform,
        _setting(api_key, ("LANGSMITH_API_KEY", "LANGCHAIN_API_KEY"), "langsmith.api_key"),
        "LANGSMITH_API_KEY",
        "langsmith.api_key",
    )
    base = _base(
        _setting(
            endpoint,
            ("LANGSMITH_ENDPOINT", "LANGCHAIN_ENDPOINT"),
            "langsmith.endpoint",
            LANGSMITH_ENDPOINT,
        )
        or LANGSMITH_ENDPOINT
    )
    headers = {"X-API-Key": key}
    url = f"{base}/api/v1/datasets?{urllib.parse.urlencode({'name': name})}"
    datasets = _json(platform, _request(platform, url, headers=headers)[0], url)
    matches = (
        [d for d in datasets if isinstance(d, dict) and d.get("name") == name]
        if isinstance(datasets, list)
        else []
    )
    if not matches:
        raise DatasetError(f"{platform}: no dataset named {name!r}. Check the name.")
    dataset_id = matches[0]["id"]
    items: list[dict[str, Any]] = []
    offset = 0
    for _ in range(MAX_PAGES):
        query = urllib.parse.urlencode(
            {"dataset": dataset_id, "offset": offset, "limit": page_size}
        )
        url = f"{base}/api/v1/examples?{query}"
        rows = _json(platform, _request(platform, url, headers=headers)[0], url)
        if not isinstance(rows, list):
            raise DatasetError(f"{platform}: unexpected answer from {url} (not a list).")
        for row in rows:
            inputs, outputs = row.get("inputs"), row.get("outputs")
            items.append(
                {
                    "id": row.get("id"),
                    "input": _single(inputs),
                    "expected_output": _single(outputs),
                    "inputs": inputs,
                    "outputs": outputs,
                    "metadata": row.get("metadata") or {},
                }
            )
        if len(rows) < page_size:
            break
        offset += len(rows)
    return Dataset(items, name=name, source=f"langsmith:{name}")


# ---------------------------------------------------------------------- Braintrust


def from_braintrust(
    project: str,
    dataset: str,
    *,
    api_key: str | None = None,
    api_url: str | None = None,
    page_size: int = PAGE_SIZE,
) -> Dataset:
    """Every record of a Braintrust dataset, found by project and dataset name."""
    platform = "Braintrust"
    key = _required(
        platform,
        _setting(api_key, ("BRAINTRUST_API_KEY",), "braintrust.api_key"),
        "BRAINTRUST_API_KEY",
        "braintrust.api_key",
    )
    base = _base(
        _setting(api_url, ("BRAINTRUST_API_URL",), "braintrust.api_url", BRAINTRUST_API_URL)
        or BRAINTRUST_API_URL
    )
    headers = {"Authorization": f"Bearer {key}"}
    query = urllib.parse.urlencode({"project_name": project, "dataset_name": dataset})
    url = f"{base}/v1/dataset?{query}"
    found = _json(platform, _request(platform, url, headers=headers)[0], url)
    objects = found.get("objects") if isinstance(found, dict) else None
    if not objects:
        raise DatasetError(
            f"{platform}: no dataset {dataset!r} in project {project!r}. Check both names."
        )
    dataset_id = objects[0]["id"]
    url = f"{base}/v1/dataset/{urllib.parse.quote(str(dataset_id), safe='')}/fetch"
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        body: dict[str, Any] = {"limit": page_size}
        if cursor:
            body["cursor"] = cursor
        page = _json(platform, _request(platform, url, headers=headers, body=body)[0], url)
        events = page.get("events") if isinstance(page, dict) else None
        if not isinstance(events, list):
            raise DatasetError(f"{platform}: unexpected answer from {url} (no `events` list).")
        for event in events:
            items.append(
                {
                    "id": event.get("id"),
                    "input": event.get("input"),
                    "expected_output": event.get("expected"),
                    "metadata": event.get("metadata") or {},
                    "tags": event.get("tags") or [],
                }
            )
        cursor = page.get("cursor")
        if not cursor or not events:
            break
    return Dataset(items, name=dataset, source=f"braintrust:{project}/{dataset}")


# ---------------------------------------------------------------------- Basalt


def from_basalt(
    dataset_id: str,
    *,
    api_key: str | None = None,
    base_url: str | None = None,
) -> Dataset:
    """Every item of a Basalt dataset, by its id."""
    platform = "Basalt"
    if not isinstance(dataset_id, str) or not dataset_id.strip():
        raise DatasetError(f"{platform}: from_basalt needs the dataset's id (got {dataset_id!r}).")
    key = _required(
        platform,
        _setting(api_key, ("BASALT_API_KEY",), "basalt.api_key"),
        "BASALT_API_KEY",
        "basalt.api_key",
    )
    base = _base(
        _setting(base_url, ("BASALT_API_URL",), "basalt.api_url", BASALT_API_URL) or BASALT_API_URL
    )
    headers = {"Authorization": f"Bearer {key}"}
    first = f"{base}/v1/datasets/{urllib.parse.quote(dataset_id, safe='')}/items"
    url: str | None = first
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    for _ in range(MAX_PAGES):
        if url is None or url in seen:
            break
        seen.add(url)
        page = _json(platform, _request(platform, url, headers=headers)[0], url)
        rows = _basalt_rows(page, url)
        items.extend(_basalt_item(row, url) for row in rows)
        url = _basalt_next(page, first, url) if rows else None
    return Dataset(items, name=dataset_id, source=f"basalt:{dataset_id}")


def _basalt_rows(page: Any, url: str) -> list[Any]:
    if isinstance(page, list):
        return page
    if isinstance(page, dict):
        for field in ("items", "data"):
            if isinstance(page.get(field), list):
                return page[field]
    shown = list(page)[:5] if isinstance(page, dict) else type(page).__name__
    raise DatasetError(
        f"Basalt: unexpected answer from {_without_query_secrets(url)}: expected an `items` "
        f"or `data` list, or a list of items (got {shown})."
    )


def _basalt_item(row: Any, url: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise DatasetError(
            f"Basalt: an item from {_without_query_secrets(url)} is not an object: {row!r:.80}"
        )
    item = {k: v for k, v in row.items() if k not in ("output", "expected_output")}
    item["id"] = row.get("id")
    item["input"] = row.get("input")
    item["expected_output"] = row.get("output", row.get("expected_output"))
    item["metadata"] = row.get("metadata") or {}
    return item


def _basalt_next(page: Any, first: str, current: str) -> str | None:
    """The next page: a `next` link (absolute or relative), else a cursor sent as `?cursor=`."""
    if not isinstance(page, dict):
        return None
    sources = [page, page.get("pagination"), page.get("meta")]
    for source in (s for s in sources if isinstance(s, dict)):
        link = source.get("next") or source.get("nextUrl") or source.get("next_url")
        if isinstance(link, str) and link:
            return urllib.parse.urljoin(current, link)
        cursor = source.get("nextCursor") or source.get("next_cursor") or source.get("cursor")
        if isinstance(cursor, str | int) and not isinstance(cursor, bool) and cursor != "":
            return f"{first}?{urllib.parse.urlencode({'cursor': cursor})}"
    return None
