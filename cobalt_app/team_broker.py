"""Team mode's broker side (Redis): the connection, live workers, the sweeper's turn, queue
sizes, and progress announcements that wake `cobalt run` and `cobalt watch` waiting.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from cobalt_app.runs import TeamModeError
from cobalt_app.runs.claims import lease_grace

logger = logging.getLogger("cobalt.team")

KEY = "cobalt:"


def beat_interval() -> float:
    """How often workers renew leases, announce themselves and sweep."""
    return max(0.2, min(10.0, lease_grace() / 4))


_redis: Any = None


def redis_client() -> Any:
    global _redis
    if _redis is None:
        import redis
        from django.conf import settings

        if not settings.BROKER_URL.startswith(("redis://", "rediss://", "unix://")):
            raise TeamModeError(
                "team mode needs a Redis broker: set COBALT_BROKER_URL=redis://host:6379/0"
            )
        _redis = redis.Redis.from_url(settings.BROKER_URL)
    return _redis


def check_broker() -> None:
    """Fail before creating anything when the broker does not answer."""
    from cobalt.redaction import redact

    try:
        redis_client().ping()
    except TeamModeError:
        raise
    except Exception as exc:
        from django.conf import settings

        where = redact(settings.BROKER_URL, "broker_url")
        raise TeamModeError(f"cannot reach the broker at {where}: {exc}") from None


def dispatched_at(run_id: str) -> float:
    """When the run's items were last enqueued (unknown: from now on)."""
    client = redis_client()
    value = client.get(f"{KEY}dispatched:{run_id}")
    if value is None:
        client.set(f"{KEY}dispatched:{run_id}", time.time(), ex=7 * 86400)
        return time.time()
    return float(value)


def queue_size(queue: str) -> int:
    """Messages waiting in a queue (not those a worker has received)."""
    from cobalt_project.celery import app

    with app.connection_for_read() as conn:
        try:
            return conn.default_channel.queue_declare(queue=queue, passive=True).message_count
        except Exception:  # an empty Redis queue does not exist at all
            return 0


def worker_beat(name: str, info: dict[str, Any], ttl: float) -> None:
    redis_client().set(f"{KEY}worker:{name}", json.dumps(info), px=int(ttl * 1000))


def worker_gone(name: str) -> None:
    redis_client().delete(f"{KEY}worker:{name}")


def live_workers() -> list[dict[str, Any]]:
    """Workers that announced themselves within their last few heartbeats."""
    client = redis_client()
    keys = sorted(client.scan_iter(match=f"{KEY}worker:*", count=500))
    values = client.mget(keys) if keys else []
    return [json.loads(v) for v in values if v]


def sweep_turn(name: str) -> bool:
    """One sweeper per interval across all workers."""
    interval_ms = int(beat_interval() * 1000)
    return bool(redis_client().set(f"{KEY}sweeper", name, nx=True, px=interval_ms))


def progress_channel(run_id: str) -> str:
    return f"{KEY}progress:{run_id}"


def announce_progress(run_ids: Iterable[str]) -> None:
    """Wake whoever waits on these runs (`cobalt run`, `cobalt watch`): items were recorded.

    Best effort: a waiting client also reads the database every `POLL_INTERVAL` anyway.
    """
    run_ids = list(run_ids)
    if not run_ids:
        return
    try:
        client = redis_client()
        with client.pipeline(transaction=False) as pipe:
            for run_id in run_ids:
                pipe.publish(progress_channel(run_id), "1")
            pipe.execute()
    except Exception as exc:  # noqa: BLE001 - the waiting side polls; never fail a record
        logger.debug("could not announce progress of %s: %s", run_ids, exc)


class ProgressListener:
    """Sleeps until a worker announces progress on a run, or `timeout` passes."""

    def __init__(self, run_id: str) -> None:
        self.pubsub = None
        try:
            self.pubsub = redis_client().pubsub(ignore_subscribe_messages=True)
            self.pubsub.subscribe(progress_channel(run_id))
        except Exception as exc:  # noqa: BLE001 - without it, wait() polls the database
            logger.debug("progress announcements unavailable: %s", exc)
            self.pubsub = None

    def wait(self, timeout: float) -> None:
        if self.pubsub is None:
            time.sleep(timeout)
            return
        try:
            message = self.pubsub.get_message(timeout=timeout)
            while message is not None:  # several announcements make one wake-up
                message = self.pubsub.get_message(timeout=0)
        except Exception:  # noqa: BLE001 - the connection broke: fall back to polling
            self.close()
            time.sleep(timeout)

    def close(self) -> None:
        if self.pubsub is not None:
            with contextlib.suppress(Exception):
                self.pubsub.close()
            self.pubsub = None
