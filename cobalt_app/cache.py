"""The judge cache: replies keyed by SHA-256 of the canonical JSON of the whole request.

The key covers provider, model, parameters and the fully rendered prompt, so changing any of
them misses. Errors are never stored; a reply is stored redacted (a judge's reason quoting a
key from the output it read), like everything Cobalt writes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from cobalt_app import storable
from cobalt_app.models import JudgeCacheEntry


def cache_key(payload: dict[str, Any]) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def cache_get(key: str) -> Any | None:
    now = timezone.now()
    return (
        JudgeCacheEntry.objects.filter(key=key)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .values_list("value", flat=True)
        .first()
    )


def cache_put(key: str, *, provider: str, model: str, value: Any, ttl: float | None) -> None:
    now = timezone.now()
    expires = now + timedelta(seconds=ttl) if ttl else None
    JudgeCacheEntry.objects.update_or_create(
        key=key,
        defaults={
            "provider": provider,
            "model": model,
            "value": storable.redacted(value),
            "created_at": now,
            "expires_at": expires,
        },
    )


async def cached_call(
    env: Any,
    request: dict[str, Any],
    call: Callable[[], Awaitable[dict[str, Any]]],
    *,
    provider: str,
    model: str,
) -> tuple[dict[str, Any], bool]:
    """The cached answer to `request` (keyed by `cache_key(request)`), else `call()`'s, which
    is then stored: (the answer, whether it came from the cache). `env` is a run's environment
    (its `db` thread and cache settings). What `call()` raises is never stored."""
    key = cache_key(request)
    if env.cache_enabled:
        hit = await env.db(cache_get, key)
        if isinstance(hit, dict):
            return hit, True
    value = await call()
    if env.cache_enabled:
        await env.db(cache_put, key, provider=provider, model=model, value=value, ttl=env.cache_ttl)
    return value, False


def cache_clear(*, older_than_days: float | None = None) -> int:
    """Delete cache entries (all, or those created more than N days ago, or expired)."""
    entries = JudgeCacheEntry.objects.all()
    if older_than_days is not None:
        cutoff = timezone.now() - timedelta(days=older_than_days)
        entries = entries.filter(Q(created_at__lt=cutoff) | Q(expires_at__lt=timezone.now()))
    deleted, _ = entries.delete()
    return deleted
