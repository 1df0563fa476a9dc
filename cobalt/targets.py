"""HTTP targets: test an agent that runs as a service, through its URL.

    svc = cobalt.http_target(
        url="http://127.0.0.1:8000/ask",
        headers={"Authorization": "Bearer ${AGENT_TOKEN}"},
        body={"question": "{{input.question}}"},
        output="$.answer",
    )
    cobalt.experiment("svc", dataset, svc, evaluators=[...])

A target is a runner like any function (`cobalt run`, team workers, MCP and the API import the
experiment file and call it), declared instead of written:

* `body` is a template over the item: every string in it has its `{{path}}` placeholders
  filled from the item (`{{input.question}}` is `item["input"]["question"]`, `{{item}}` the
  whole item); a string that is one placeholder alone keeps the value's type (a list stays a
  list). `GET` requests send no body (`params` are filled the same way).
* `headers` may name environment variables as `${NAME}`: read when each request is sent, never
  stored (the span, the results and errors show `***`); a missing variable is the item's error,
  naming it.
* `output` is how the output is read: a JSON path (`$.answer`, `$.choices[0].message.content`),
  `"body"` for the response's text, or None (the default) for the JSON body, or its text when it
  is not JSON. With `stream=True` the answer is read as server-sent events to the end: the
  path's value is taken from each event's JSON data and the strings joined (`"body"`: the events'
  data joined); an event `[DONE]` ends it.
* `timeout` (seconds per attempt) and `retries` as for model calls: a connection error, 408,
  429 and 5xx are retried with exponential backoff, honouring `Retry-After`.

Every request carries the item's W3C `traceparent` (OpenTelemetry's propagator), from a client
span in the item's trace, so the spans the service exports to Cobalt's receiver are attributed
to the item (`cobalt_app.otlp`). `openai_target(base_url, model)` is a target for the
OpenAI-compatible chat endpoint of the user's own service.
"""

from __future__ import annotations

from typing import Any

from cobalt.target_spec import TargetError, TargetSpec

__all__ = ["HttpTarget", "TargetError", "http_target", "openai_target", "target"]


class HttpTarget(TargetSpec):
    """A declared HTTP runner; see the module's docstring. Call it with a `RunContext`."""

    async def __call__(self, ctx: Any) -> dict[str, Any]:
        from cobalt import http_call  # httpx: only for a run that calls a target (~45 ms)

        return await http_call.call(self, ctx.item)


def http_target(
    url: str,
    *,
    method: str = "POST",
    headers: dict[str, str] | None = None,
    body: Any = None,
    params: dict[str, Any] | None = None,
    output: str | None = None,
    stream: bool = False,
    timeout: float = 60.0,
    retries: int = 2,
    name: str = "",
) -> HttpTarget:
    """A runner that calls an agent service over HTTP (see the module's docstring)."""
    if body is None and method != "GET":
        body = {"input": "{{input}}"}
    return HttpTarget(
        url=url,
        method=str(method).upper() if isinstance(method, str) else method,
        headers=dict(headers or {}),
        body=body,
        params=dict(params or {}),
        output=output,
        stream=stream,
        timeout=timeout,
        retries=retries,
        name=name,
    )


def openai_target(
    base_url: str,
    model: str,
    *,
    api_key_env: str | None = None,
    system: str | None = None,
    message: str = "{{input}}",
    headers: dict[str, str] | None = None,
    stream: bool = False,
    timeout: float = 60.0,
    retries: int = 2,
) -> HttpTarget:
    """A runner for an OpenAI-compatible chat endpoint of the user's own service:
    `POST {base_url}/chat/completions` with the item's `message` as the user's turn; the
    output is the answer's content, the tokens come from its `usage`."""
    all_headers = dict(headers or {})
    if api_key_env:
        all_headers.setdefault("Authorization", f"Bearer ${{{api_key_env}}}")
    messages = [{"role": "user", "content": message}]
    if system:
        messages.insert(0, {"role": "system", "content": system})
    body: dict[str, Any] = {"model": model, "messages": messages}
    if stream:
        body["stream"] = True
    path = "$.choices[0].delta.content" if stream else "$.choices[0].message.content"
    return HttpTarget(
        url=base_url.rstrip("/") + "/chat/completions",
        method="POST",
        headers=all_headers,
        body=body,
        output=path,
        stream=stream,
        timeout=timeout,
        retries=retries,
        name=f"chat {model}",
        usage=True,
    )


def from_config(name: str, table: Any) -> HttpTarget:
    """A target declared in the configuration: `[targets.NAME]` with the keys of
    `http_target` (`url`, `method`, `headers`, `body`, `params`, `output`, `stream`,
    `timeout`, `retries`), or `openai = {base_url, model}`."""
    if not isinstance(table, dict):
        raise TargetError(f"[targets.{name}] must be a table with at least `url`.")
    if "openai" in table:
        options = dict(table["openai"])
        if "base_url" not in options or "model" not in options:
            raise TargetError(f"[targets.{name}] `openai` needs `base_url` and `model`.")
        return openai_target(options.pop("base_url"), options.pop("model"), **options)
    known = {"url", "method", "headers", "body", "params", "output", "stream", "timeout", "retries"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise TargetError(
            f"[targets.{name}]: unknown key {unknown[0]!r}; "
            f"the keys are {', '.join(sorted(known))}."
        )
    if "url" not in table:
        raise TargetError(f"[targets.{name}] needs `url`.")
    return http_target(name=name, **table)


def target(name: str) -> HttpTarget:
    """The target declared as `[targets.NAME]` in the project's configuration
    (`cobalt.experiment("svc", dataset, cobalt.target("svc"))`)."""
    from cobalt.config import load_config

    table = load_config().get(f"targets.{name}")
    if table is None:
        raise TargetError(
            f"no target {name!r} in the configuration: declare it as [targets.{name}] "
            'with `url = "http://..."` (and method, headers, body, output, ...).'
        )
    return from_config(name, table)
