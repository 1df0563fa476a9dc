"""Declarations of what an agent's tools and HTTP routes answer in a run (`cy.intercept`).

    cobalt.stub("tool:search", returns=[{"title": "Refunds"}])
    cobalt.stub("tool:search", raises="search is down", times=1)       # a fault, once
    cobalt.stub("GET https://api.example.com/search*", status=500)       # an HTTP route
    cobalt.stub("POST https://api.example.com/orders", fixture="order.json", delay=0.2)

A `Stub` is either a tool stub (`tool:<name>`, `*` wildcards in the name) or a route stub
(`<METHOD> <url pattern>`, method `*` for any, `*` wildcards in the URL). They are declared
per experiment (`cobalt.experiment(..., intercept=[...])`), per dataset item (its `fixtures`
field, the dict form read by `parse_stub`) or in the configuration. The engine
(`cobalt_app.intercepts`) matches them per item: the item's own first, then the
experiment's; `times=n` answers only the first n matching calls of the item.

What a stub answers: `returns` (a tool's value, or a route's JSON body), `fixture` (a file
under the project's `fixtures/` folder: JSON parsed, any other file as text), `fn` (a
function of the tool's arguments, or of the request for a route), `status`/`body`/`headers`
(routes), and faults: `raises` (a tool raises an exception with that message), `timeout`
(after `delay`, a tool raises TimeoutError; a route's transport raises its client's timeout
error), `malformed` (the answer is JSON cut short). `delay` (seconds) comes first.

This module also holds the two seams the engine plugs into without this floor importing it:
`plan_tool` (what `@cobalt.tool` asks before running a tool) and `state()` (the item's state
object of a stateful fake environment). Pure: no Django, nothing of `cobalt_app`.
"""

from __future__ import annotations

import contextvars
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from cobalt.errors import ConfigError

FIXTURES_DIR = "fixtures"
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "*")
MALFORMED = '{"results": [{"title": "'  # JSON cut short: what `malformed=True` answers
STUBBED, INJECTED, REPLAYED = "stubbed", "injected", "replayed"  # marks on a trace step
MARK_ATTRIBUTE = "cobalt.intercepted"  # the span attribute carrying the mark


class ToolError(RuntimeError):
    """What a tool stub's `raises="message"` raises inside the agent."""


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING: Any = _Missing()


@dataclass(frozen=True)
class Stub:
    """One declaration: what a tool or an HTTP route answers (see the module)."""

    target: str
    kind: str  # "tool" or "route"
    pattern: str  # the tool's name, or the URL pattern
    method: str = "*"  # routes only
    returns: Any = MISSING
    fixture: str | None = None
    fn: Callable[..., Any] | None = None
    status: int | None = None
    body: Any = MISSING
    headers: Mapping[str, str] | None = None
    raises: str | None = None
    timeout: bool = False
    malformed: bool = False
    delay: float = 0.0
    times: int | None = None
    where: str = ""  # where it was declared, for messages
    _regex: re.Pattern[str] = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    @property
    def is_fault(self) -> bool:
        return bool(
            self.raises
            or self.timeout
            or self.malformed
            or (self.status is not None and self.status >= 400)
        )

    @property
    def mark(self) -> str:
        """How the trace marks a step it answered: `injected` (a fault) or `stubbed`."""
        return INJECTED if self.is_fault else STUBBED

    def matches_tool(self, name: str) -> bool:
        return self.kind == "tool" and bool(self._regex.fullmatch(name))

    def matches_route(self, method: str, url: str) -> bool:
        if self.kind != "route" or (self.method != "*" and self.method != method.upper()):
            return False
        return bool(self._regex.fullmatch(url))

    def describe(self) -> str:
        return f"stub {self.target!r}" + (f" ({self.where})" if self.where else "")


def _wildcards(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")), re.DOTALL)


def stub(
    target: str,
    *,
    returns: Any = MISSING,
    fixture: str | None = None,
    fn: Callable[..., Any] | None = None,
    status: int | None = None,
    body: Any = MISSING,
    headers: Mapping[str, str] | None = None,
    raises: str | None = None,
    timeout: bool = False,
    malformed: bool = False,
    delay: float = 0.0,
    times: int | None = None,
    where: str = "",
) -> Stub:
    """Declare what a tool (`"tool:search"`) or an HTTP route (`"GET https://host/path*"`)
    answers; raises `ConfigError` naming the field when the declaration cannot work."""
    at = f"{where}: " if where else ""
    kind, method, pattern = _target(target, at)
    values = {
        "returns": returns,
        "fixture": fixture,
        "fn": fn,
        "status": status,
        "body": body,
        "headers": headers,
        "raises": raises,
        "timeout": timeout,
        "malformed": malformed,
        "delay": delay,
        "times": times,
    }
    _check(kind, target, values, at)
    return Stub(
        target=target,
        kind=kind,
        pattern=pattern,
        method=method,
        where=where,
        _regex=_wildcards(pattern),
        **values,
    )


def _target(target: Any, at: str) -> tuple[str, str, str]:
    if not isinstance(target, str) or not target.strip():
        raise ConfigError(
            f"{at}a stub's target must be 'tool:<name>' or '<METHOD> <url pattern>', "
            f"not {target!r}."
        )
    text = target.strip()
    if text.startswith("tool:"):
        name = text[len("tool:") :].strip()
        if not name:
            raise ConfigError(f"{at}stub {target!r} names no tool: write 'tool:search'.")
        return "tool", "*", name
    method, _, url = text.partition(" ")
    if not url.strip() and method.lower().startswith(("http://", "https://", "*")):
        method, url = "*", text  # a bare URL pattern: any method
    method, url = method.upper(), url.strip()
    if method not in METHODS or not url:
        raise ConfigError(
            f"{at}stub target {target!r}: write 'tool:<name>' for a tool, or '<METHOD> <url "
            f"pattern>' for an HTTP route (METHOD one of {', '.join(METHODS)}; `*` wildcards "
            "in the URL), e.g. 'GET https://api.example.com/search*'."
        )
    return "route", method, url


ROUTE_ONLY = ("status", "body", "headers")
ANSWERS = ("returns", "fixture", "fn", "body", "malformed", "timeout", "raises")


def _check(kind: str, target: str, values: dict[str, Any], at: str) -> None:
    name = f"{at}stub {target!r}"
    if kind == "tool":
        for key in ROUTE_ONLY:
            if values[key] is not None and values[key] is not MISSING:
                raise ConfigError(
                    f"{name}: `{key}` is for HTTP route stubs; a tool stub answers with "
                    "`returns`, `fixture`, `fn`, `raises`, `timeout` or `malformed`."
                )
    elif values["raises"] is not None:
        raise ConfigError(
            f"{name}: `raises` is for tool stubs; make an HTTP route fail with `status=500` "
            "(or 429), `timeout=True` or `malformed=True`."
        )
    given = [
        key
        for key in ANSWERS
        if values[key] is not MISSING and values[key] is not None and values[key] is not False
    ]
    if len(given) > 1:
        raise ConfigError(
            f"{name}: give only one of {', '.join(f'`{k}`' for k in given)}: each says what "
            "the stub answers."
        )
    if values["fn"] is not None and not callable(values["fn"]):
        raise ConfigError(f"{name}: `fn` must be a function, not {type(values['fn']).__name__}.")
    if values["raises"] is not None and not isinstance(values["raises"], str):
        raise ConfigError(f"{name}: `raises` is the error's message (a string).")
    _check_numbers(name, values)
    if values["fixture"] is not None:
        fixture_path(values["fixture"], where=name)
    headers = values["headers"]
    if headers is not None and (
        not isinstance(headers, Mapping)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
    ):
        raise ConfigError(f"{name}: `headers` must map header names to strings.")


def _check_numbers(name: str, values: dict[str, Any]) -> None:
    status, delay, times = values["status"], values["delay"], values["times"]
    if status is not None and (
        isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599
    ):
        raise ConfigError(
            f"{name}: `status` must be an HTTP status code (100-599), not {status!r}."
        )
    if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
        raise ConfigError(f"{name}: `delay` must be seconds (0 or more), not {delay!r}.")
    if times is not None and (isinstance(times, bool) or not isinstance(times, int) or times < 1):
        raise ConfigError(
            f"{name}: `times` must be a whole number of calls (1 or more), not {times!r}."
        )
    for flag in ("timeout", "malformed"):
        if not isinstance(values[flag], bool):
            raise ConfigError(f"{name}: `{flag}` must be true or false.")


STUB_FIELDS = (
    "returns",
    "fixture",
    "status",
    "body",
    "headers",
    "raises",
    "timeout",
    "malformed",
    "delay",
    "times",
)


def parse_stub(mapping: Any, where: str) -> Stub:
    """The dict form (a dataset item's `fixtures`, the configuration):
    `{"tool": "search", "returns": [...]}` or
    `{"route": "GET https://api.example.com/search*", "status": 500, "times": 1}`."""
    if isinstance(mapping, Stub):
        return mapping
    if not isinstance(mapping, Mapping):
        raise ConfigError(
            f'{where}: a fixture is a table such as {{"tool": "search", "returns": [...]}} '
            f'or {{"route": "GET https://host/path*", "status": 500}}, not '
            f"{type(mapping).__name__}."
        )
    tool, route = mapping.get("tool"), mapping.get("route")
    if (tool is None) == (route is None):
        raise ConfigError(
            f"{where}: a fixture names either `tool` (a tool's name) or `route` "
            "('<METHOD> <url pattern>'), exactly one of them."
        )
    unknown = sorted(set(mapping) - {"tool", "route", *STUB_FIELDS})
    if unknown:
        raise ConfigError(
            f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; a fixture may hold "
            f"`tool` or `route` and {', '.join(STUB_FIELDS)}."
        )
    target = f"tool:{tool}" if tool is not None else route
    options = {k: mapping[k] for k in STUB_FIELDS if k in mapping}
    options.setdefault("delay", 0.0)
    for flag in ("timeout", "malformed"):
        options.setdefault(flag, False)
    return stub(target, where=where, **options)


def as_stubs(given: Any, where: str) -> list[Stub]:
    """A list of `cobalt.stub(...)` or of their dict form (`parse_stub`)."""
    if given is None:
        return []
    if isinstance(given, Stub | Mapping) or not isinstance(given, list | tuple):
        raise ConfigError(
            f"{where} must be a list of cobalt.stub(...) declarations (or of their dict form)."
        )
    return [parse_stub(value, f"{where}[{i}]") for i, value in enumerate(given)]


def fixture_path(name: Any, *, where: str, project_dir: Path | None = None) -> Path:
    """`fixtures/<name>` inside the project (`project_dir`; relative to it when None). A
    path that leaves the `fixtures/` folder (absolute, `..`) is refused."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}: `fixture` names a file under {FIXTURES_DIR}/, e.g. 'a.json'.")
    relative = PurePosixPath(name.replace("\\", "/"))
    if relative.parts and relative.parts[0] == FIXTURES_DIR:
        relative = PurePosixPath(*relative.parts[1:])
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise ConfigError(
            f"{where}: fixture {name!r} is outside the project's {FIXTURES_DIR}/ folder; name "
            f"a file inside it (e.g. 'search/refunds.json' for {FIXTURES_DIR}/search/"
            "refunds.json)."
        )
    base = (project_dir or Path(".")) / FIXTURES_DIR
    path = base / Path(*relative.parts)
    if project_dir is not None:
        resolved, root = path.resolve(), base.resolve()
        if resolved != root and root not in resolved.parents:  # a symbolic link out of it
            raise ConfigError(
                f"{where}: fixture {name!r} leads outside the project's {FIXTURES_DIR}/ folder."
            )
    return path


def read_fixture(name: str, *, where: str, project_dir: Path) -> Any:
    """A fixture's content: a `.json` file parsed, any other file as text."""
    path = fixture_path(name, where=where, project_dir=project_dir)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{where}: fixture file {path} does not exist.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: fixture file {path} cannot be read ({exc}).") from None
    if path.suffix.lower() != ".json":
        return text
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where}: fixture file {path} is not valid JSON ({exc}).") from None


# ------------------------------------------------------------------ the tool seam


@dataclass
class ToolPlan:
    """What the engine decided for one tool call (`plan_tool`): `answer()` instead of the
    tool (after `delay` seconds), or the real tool, then `done(result, error)` (recording).
    `mark`: how the trace marks the step (`stubbed`, `injected`, `replayed`; None)."""

    mark: str | None = None
    delay: float = 0.0
    answer: Callable[[], Any] | None = None
    done: Callable[[Any, BaseException | None], None] | None = None


_tool_handler: Callable[[str, dict[str, Any]], ToolPlan | None] | None = None


def set_tool_handler(handler: Callable[[str, dict[str, Any]], ToolPlan | None] | None) -> None:
    """The engine's planner of tool calls (`cobalt_app.intercepts` installs it)."""
    global _tool_handler
    _tool_handler = handler


def plan_tool(name: str, arguments: dict[str, Any]) -> ToolPlan | None:
    """What to do with a call of tool `name` (None: run it, nothing to do)."""
    handler = _tool_handler
    return None if handler is None else handler(name, arguments)


# ------------------------------------------------------------------ the item's state


class NoStateError(RuntimeError):
    """`cobalt.state()` outside an item of an experiment that declares `state=`."""


_state: contextvars.ContextVar[Any] = contextvars.ContextVar("cobalt_item_state", default=MISSING)


def state() -> Any:
    """The running item's state object (`cobalt.experiment(..., state=lambda item: {...})`):
    the tools of a stateful fake environment read and change it; the `state` evaluator
    compares it at the end with the item's `expected_state`."""
    value = _state.get()
    if value is MISSING:
        raise NoStateError(
            "cobalt.state() is only available while an item runs, in an experiment declared "
            "with `state=` (e.g. cobalt.experiment(..., state=lambda item: {'orders': {}}))."
        )
    return value


def set_state(value: Any) -> contextvars.Token:
    return _state.set(value)


def reset_state(token: contextvars.Token) -> None:
    _state.reset(token)
