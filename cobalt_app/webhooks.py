"""Webhooks: POST a JSON event to the `[[webhooks]]` of the config.

Events: `run.completed`, `run.failed` (after a run is finalised), `ci.passed`, `ci.failed`
(after `cobalt run --ci` decided). With a `secret` (or `secret_env`, the name of a variable
holding it) the body is signed: `X-Cobalt-Signature: sha256=<hex HMAC-SHA256 of the body>`.
Deliveries are retried with exponential backoff on network errors, 429 and 5xx; a delivery
that still fails is logged and never changes the outcome of the run.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cobalt.config import Config
from cobalt.redaction import redact
from cobalt.version import __version__
from cobalt_app import storable
from cobalt_app.ratelimit import retry_after
from cobalt_app.results import iso

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger("cobalt.webhooks")

DEFAULT_EVENTS = ("run.completed", "run.failed", "ci.failed")
DEFAULT_RETRIES = 3
DEFAULT_TIMEOUT = 10.0
BACKOFF_BASE = 0.5
BACKOFF_CAP = 30.0
SIGNATURE_HEADER = "X-Cobalt-Signature"
RUN_EVENTS = {"completed": "run.completed", "failed": "run.failed"}


def sign(secret: str, body: bytes) -> str:
    """The signature header value: `sha256=` + hex HMAC-SHA256 of the raw body."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str) -> bool:
    """What a receiver does: recompute and compare in constant time."""
    return hmac.compare_digest(sign(secret, body), header or "")


def subscribers(config: Config, event: str) -> list[dict[str, Any]]:
    hooks = config.get("webhooks") or []
    return [h for h in hooks if event in (h.get("events") or DEFAULT_EVENTS)]


def ci_context() -> dict[str, str] | None:
    """Where the build ran, when it ran on GitHub Actions (links back from a notification)."""
    if os.environ.get("GITHUB_ACTIONS") != "true":
        return None
    names = {
        "repository": "GITHUB_REPOSITORY",
        "sha": "GITHUB_SHA",
        "ref": "GITHUB_REF",
        "runId": "GITHUB_RUN_ID",
        "workflow": "GITHUB_WORKFLOW",
    }
    return {"provider": "github", **{k: os.environ.get(v, "") for k, v in names.items()}}


def run_payload(event: str, run: Any) -> dict[str, Any]:
    return {
        "event": event,
        "timestamp": iso(),
        "cobalt": __version__,
        "run": {
            "id": run.id,
            "name": run.name,
            "status": run.status,
            "file": run.file,
            "tags": run.tags,
            "gitCommit": run.git_commit or None,
            "createdAt": run.created_at.isoformat() if run.created_at else None,
            "finishedAt": run.finished_at.isoformat() if run.finished_at else None,
            "failure": run.failure or None,
            "resultsPath": run.results_path or None,
            "summary": run.summary,
        },
    }


def ci_payload(event: str, outcome: Any) -> dict[str, Any]:
    return {
        "event": event,
        "timestamp": iso(),
        "cobalt": __version__,
        "exitCode": outcome.exit_code,
        "passed": outcome.passed,
        "violations": [c.line() for c in outcome.violations],
        "runs": [
            {
                "id": report.run_id,
                "name": report.name,
                "file": report.file,
                "status": report.status,
                "passed": report.passed,
                "baseline": report.baseline_id,
                "checks": [c.to_dict() for c in report.checks],
            }
            for report in outcome.reports
        ],
        "importErrors": [{"file": f.file, "error": f.error} for f in outcome.import_failures],
        "configErrors": list(outcome.config_errors),
        "ci": ci_context(),
    }


def secret_of(hook: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(secret, problem): the secret from `secret` or from the variable named by `secret_env`."""
    if hook.get("secret"):
        return str(hook["secret"]), None
    name = hook.get("secret_env")
    if not name:
        return None, None
    value = os.environ.get(name)
    if not value:
        return None, f"the variable {name} (secret_env) is not set"
    return value, None


def retry_delay(attempt: int, response: httpx.Response | None) -> float:
    hinted = None if response is None else retry_after(response.headers)
    if hinted is not None:
        return min(max(hinted, 0.0), BACKOFF_CAP)
    return min(BACKOFF_BASE * 2**attempt, BACKOFF_CAP)


async def deliver(hook: Mapping[str, Any], event: str, payload: Mapping[str, Any]) -> bool:
    """POST one event to one webhook, with retries; True when a 2xx arrived. Never raises."""
    url = hook["url"]
    shown = redact(url, "url")  # scheme and host: paths often carry a token (Slack)
    secret, problem = secret_of(hook)
    if problem:
        logger.error("webhook %s (%s) not sent: %s", shown, event, problem)
        return False
    body = json.dumps(storable.redacted(payload), ensure_ascii=False, default=str).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": f"cobalt/{__version__}",
        "X-Cobalt-Event": event,
        "X-Cobalt-Delivery": uuid.uuid4().hex,
    }
    if secret:
        headers[SIGNATURE_HEADER] = sign(secret, body)
    retries = int(hook.get("retries", DEFAULT_RETRIES))
    timeout = float(hook.get("timeout", DEFAULT_TIMEOUT))
    problem = ""
    import httpx  # here: a `cobalt run` whose project has no webhook never imports it (~45 ms)

    async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
        for attempt in range(retries + 1):
            response: httpx.Response | None = None
            try:
                response = await client.post(url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if response.is_success:
                    return True
                problem = f"HTTP {response.status_code}"
                if response.status_code != 429 and response.status_code < 500:
                    break  # the receiver refused this request; sending it again won't help
            if attempt < retries:
                await asyncio.sleep(retry_delay(attempt, response))
    attempts = attempt + 1
    logger.error(
        "webhook %s (%s) failed after %d attempt%s: %s",
        shown,
        event,
        attempts,
        "s" * (attempts > 1),
        problem,
    )
    return False


async def send(config: Config, event: str, payload: Mapping[str, Any]) -> list[bool]:
    """Deliver an event to every webhook subscribed to it, concurrently."""
    hooks = subscribers(config, event)
    if not hooks:
        return []
    return list(await asyncio.gather(*(deliver(h, event, payload) for h in hooks)))


async def notify_run(config: Config, run: Any) -> list[bool]:
    """After a run is finalised: `run.completed` or `run.failed`. Never raises."""
    event = RUN_EVENTS.get(run.status)
    if event is None or not subscribers(config, event):
        return []
    try:
        return await send(config, event, run_payload(event, run))
    except Exception:  # a notification must never change the run's outcome
        logger.exception("webhook %s for run %s could not be sent", event, run.id)
        return []


def notify_ci(config: Config, outcome: Any) -> list[bool]:
    """After `cobalt run --ci`: `ci.passed` or `ci.failed` (blocking). Never raises."""
    from cobalt_app import aio

    event = "ci.passed" if outcome.passed else "ci.failed"
    if not subscribers(config, event):
        return []
    try:
        return aio.run(send(config, event, ci_payload(event, outcome)))
    except Exception:
        logger.exception("webhook %s could not be sent", event)
        return []
