"""What an HTTP target declares, checked, and the pure rules a call follows: the body template
filled from the item (`fill`), `${NAME}` headers read from the environment (`expand_headers`),
JSON paths (`parse_path`, `lookup`). Standard library only; `cobalt.targets` is the user's door
and `cobalt.http_call` makes the request.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import weakref
from dataclasses import dataclass, field
from typing import Any

from cobalt.errors import CobaltError
from cobalt.redaction import redact_text

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
RETRIED_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
MAX_RETRY_AFTER = 30.0  # seconds: a longer Retry-After is the item's timeout's business
EXCERPT = 300  # characters of a bad response's body shown in its error
PLACEHOLDER = re.compile(r"\{\{\s*([\w.\-\[\]]+)\s*\}\}")
ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
PATH_PART = re.compile(r"\.([A-Za-z_][\w\-]*)|\[(\d+)\]|\[['\"]([^'\"]+)['\"]\]")


class TargetError(CobaltError):
    """A bad declaration (naming the field) or a bad response (status, body, path)."""


def parse_path(path: str, *, where: str = "output") -> list[str | int]:
    """`$.a.b[0]` as its parts ["a", "b", 0]; a malformed path is a `TargetError`."""
    if not isinstance(path, str) or not path.startswith("$"):
        raise TargetError(f"http_target `{where}`: a JSON path starts with `$` ({path!r}).")
    parts: list[str | int] = []
    position = 1
    while position < len(path):
        match = PATH_PART.match(path, position)
        if match is None:
            raise TargetError(
                f"http_target `{where}`: cannot read the JSON path {path!r} at character "
                f"{position + 1}; write it as `$.field`, `$.list[0]` or `$['odd key']`."
            )
        name, index, quoted = match.groups()
        parts.append(int(index) if index is not None else (name or quoted))
        position = match.end()
    return parts


_MISSING = object()


def lookup(value: Any, parts: list[str | int]) -> Any:
    """The value at `parts` inside `value`, or `_MISSING`."""
    for part in parts:
        in_list = isinstance(part, int) and isinstance(value, list) and part < len(value)
        if in_list or (isinstance(part, str) and isinstance(value, dict) and part in value):
            value = value[part]
        else:
            return _MISSING
    return value


def fill(template: Any, item: dict[str, Any], *, where: str = "body") -> Any:
    """The template with its `{{path}}` placeholders filled from the item."""
    if isinstance(template, dict):
        return {key: fill(value, item, where=f"{where}.{key}") for key, value in template.items()}
    if isinstance(template, list):
        return [fill(value, item, where=f"{where}[{i}]") for i, value in enumerate(template)]
    if not isinstance(template, str):
        return template
    whole = PLACEHOLDER.fullmatch(template.strip())
    if whole:
        return _field(whole.group(1), item, where)

    def text(match: re.Match[str]) -> str:
        value = _field(match.group(1), item, where)
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    return PLACEHOLDER.sub(text, template)


def _field(path: str, item: dict[str, Any], where: str) -> Any:
    if path == "item":
        return item
    dotted = path[5:] if path.startswith("item.") else path
    parts = parse_path("$." + dotted, where=where)
    value = lookup(item, parts)
    if value is _MISSING:
        raise TargetError(
            f"http_target `{where}`: the item has no `{dotted}` for `{{{{{path}}}}}` "
            f"(its fields: {', '.join(sorted(map(str, item))) or 'none'})."
        )
    return value


def expand_headers(headers: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """Headers with `${NAME}` read from the environment, and the values read (to redact)."""
    secrets: list[str] = []

    def value_of(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise TargetError(
                f"http_target `headers`: the environment variable {name} is not set; "
                f"export {name}=... before the run (it is read at each request, never stored)."
            )
        secrets.append(os.environ[name])
        return os.environ[name]

    expanded = {key: ENV_REFERENCE.sub(value_of, value) for key, value in headers.items()}
    return expanded, secrets


@dataclass(frozen=True, eq=False)
class TargetSpec:
    """What an HTTP target declares (checked when made); `cobalt.targets.HttpTarget` calls it."""

    url: str
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    output: str | None = None
    stream: bool = False
    timeout: float = 60.0
    retries: int = 2
    name: str = ""
    usage: bool = False  # read OpenAI-style `usage` into the metadata (openai_target)
    shown_url: str = field(init=False, repr=False, compare=False, default="")  # redacted

    def __post_init__(self) -> None:
        _check(self)
        object.__setattr__(self, "shown_url", redact_text(self.url))

    @property
    def label(self) -> str:
        return self.name or f"{self.method} {self.shown_url}"

    def clients(self) -> weakref.WeakKeyDictionary:
        """This target's `httpx.AsyncClient` per event loop (connections are reused)."""
        found = self.__dict__.get("_clients")
        if found is None:
            found = weakref.WeakKeyDictionary()
            object.__setattr__(self, "_clients", found)
        return found

    def client_for(self, factory: Any) -> Any:
        loop = asyncio.get_running_loop()
        clients = self.clients()
        if loop not in clients:
            clients[loop] = factory()
        return clients[loop]


def _check(target: TargetSpec) -> None:
    def bad(name: str, message: str) -> TargetError:
        error = TargetError(f"http_target `{name}`: {message}")
        error.field = name
        return error

    if not isinstance(target.url, str) or not re.match(r"https?://[^/\s]+", target.url):
        raise bad("url", f"must be an http:// or https:// address, not {target.url!r}.")
    if target.method not in METHODS:
        raise bad("method", f"must be one of {', '.join(METHODS)}, not {target.method!r}.")
    if not isinstance(target.headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in target.headers.items()
    ):
        raise bad(
            "headers", 'must be a table of strings, e.g. {"Authorization": "Bearer ${TOKEN}"}.'
        )
    if not isinstance(target.params, dict):
        raise bad("params", "must be a table of query parameters.")
    if target.output is not None and target.output != "body":
        parse_path(target.output)
    if not isinstance(target.stream, bool):
        raise bad("stream", "must be true or false.")
    timeout = target.timeout
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise bad("timeout", f"must be a number of seconds above 0, not {timeout!r}.")
    retries = target.retries
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 10:
        raise bad("retries", f"must be a whole number from 0 to 10, not {retries!r}.")
    for key, value in target.headers.items():
        if not ENV_REFERENCE.search(value) and _looks_secret(key, value):
            raise bad(
                "headers",
                f"{key!r} holds a credential written into the file; put it in an environment "
                f'variable and write "${{NAME}}" (e.g. "Bearer ${{AGENT_TOKEN}}").',
            )


def _looks_secret(key: str, value: str) -> bool:
    return redact_text(f"{key}: {value}") != f"{key}: {value}"
