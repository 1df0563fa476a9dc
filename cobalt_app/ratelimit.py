"""One request budget per provider and API key, shared by every process that calls it.

`rate_limits` in the configuration sets it::

    [rate_limits.openai]
    requests_per_minute = 500      # or requests_per_second
    burst = 5                      # requests allowed back to back (default 1)

    [rate_limits]
    anthropic = 50                 # a bare number is requests per minute

The budget is GCRA (a token bucket kept as one "theoretical arrival time"). With a Redis
broker (team mode) the bucket lives in Redis, so all workers of a team draw from it; without
one it lives in the process. Each request *reserves* its slot and sleeps until then, so
waiting callers are served in order without polling. A 429 pushes the whole bucket back by
its Retry-After, so every worker pauses, not only the one that was refused.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from cobalt.config import Config, ConfigError

T = TypeVar("T")

KEY_PREFIX = "cobalt:rate:"
RETRYABLE_STATUS = {408, 409, 429, 500, 502, 503, 504, 529}
RETRYABLE_ERRORS = ("APIConnectionError", "APITimeoutError")

# Reserve a slot: returns the milliseconds to wait before sending (as text: Lua numbers
# returned to Redis are truncated to integers).
RESERVE_SCRIPT = """
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local wait = tat - tolerance - now
if wait < 0 then wait = 0 end
local new_tat = tat + interval
redis.call('SET', KEYS[1], string.format('%.3f', new_tat), 'PX',
           math.ceil(new_tat - now + tolerance) + 1000)
return string.format('%.3f', wait)
"""

# Push the bucket back: nobody may send before now + ARGV[1] milliseconds.
PENALISE_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local until_ms = now + tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < until_ms then
  redis.call('SET', KEYS[1], string.format('%.3f', until_ms), 'PX',
             math.ceil(tonumber(ARGV[1])) + 60000)
end
return 1
"""


@dataclass(frozen=True)
class Limit:
    """`rate` requests per second, `burst` of them allowed back to back."""

    rate: float
    burst: int = 1

    @property
    def interval_ms(self) -> float:
        return 1000.0 / self.rate

    @property
    def tolerance_ms(self) -> float:
        return (self.burst - 1) * self.interval_ms


def parse_limits(raw: Any, *, source: str = "configuration") -> dict[str, Limit]:
    """`rate_limits` → {provider: Limit}; a bad entry raises ConfigError naming the key."""
    if not raw:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: `rate_limits` must be a table of provider names.")
    limits: dict[str, Limit] = {}
    for provider, spec in raw.items():
        where = f"{source}: `rate_limits.{provider}`"
        if _is_number(spec):
            spec = {"requests_per_minute": spec}
        if not isinstance(spec, dict):
            raise ConfigError(f"{where} must be a number (requests per minute) or a table.")
        unknown = set(spec) - {"requests_per_minute", "requests_per_second", "burst"}
        if unknown:
            raise ConfigError(
                f"{where}: unknown key {sorted(unknown)[0]!r}; use requests_per_minute or "
                "requests_per_second, and optionally burst."
            )
        if ("requests_per_minute" in spec) == ("requests_per_second" in spec):
            raise ConfigError(f"{where} needs one of requests_per_minute or requests_per_second.")
        per_minute = "requests_per_minute" in spec
        value = spec["requests_per_minute" if per_minute else "requests_per_second"]
        if not _is_number(value) or value <= 0:
            raise ConfigError(f"{where}: the rate must be a number above 0 (got {value!r}).")
        burst = spec.get("burst", 1)
        if not isinstance(burst, int) or isinstance(burst, bool) or burst < 1:
            raise ConfigError(f"{where}.burst must be a whole number of at least 1.")
        rate = value / 60.0 if per_minute else float(value)
        limits[str(provider)] = Limit(rate=rate, burst=burst)
    return limits


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def bucket_name(provider: str, api_key: str) -> str:
    """Per provider and key; the key itself never leaves the process (only a digest)."""
    digest = hashlib.sha256(api_key.encode("utf-8")).hexdigest()[:16]
    return f"{KEY_PREFIX}{provider}:{digest}"


class LocalBuckets:
    """The same GCRA in one process (the embedded mode has no Redis)."""

    def __init__(self) -> None:
        self._tat: dict[str, float] = {}
        self._lock = threading.Lock()

    async def reserve(self, name: str, limit: Limit) -> float:
        with self._lock:
            now = time.monotonic() * 1000
            tat = max(self._tat.get(name, 0.0), now)
            self._tat[name] = tat + limit.interval_ms
            return max(0.0, tat - limit.tolerance_ms - now) / 1000

    async def penalise(self, name: str, seconds: float) -> None:
        with self._lock:
            until = time.monotonic() * 1000 + seconds * 1000
            self._tat[name] = max(self._tat.get(name, 0.0), until)


class RedisBuckets:
    """Buckets in Redis, shared by every worker; one asyncio client per event loop."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._clients: dict[int, Any] = {}
        self._lock = threading.Lock()

    def _client(self) -> Any:
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._clients.get(id(loop))
            if client is None:
                import redis.asyncio

                client = redis.asyncio.Redis.from_url(self.url)
                self._clients[id(loop)] = client
            return client

    async def reserve(self, name: str, limit: Limit) -> float:
        client = self._client()
        wait_ms = await client.eval(
            RESERVE_SCRIPT, 1, name, f"{limit.interval_ms:.3f}", f"{limit.tolerance_ms:.3f}"
        )
        return float(wait_ms) / 1000

    async def penalise(self, name: str, seconds: float) -> None:
        await self._client().eval(PENALISE_SCRIPT, 1, name, f"{seconds * 1000:.3f}")


class RateLimiter:
    """Waits for a slot of the budget before each provider request."""

    def __init__(self, limits: dict[str, Limit], buckets: LocalBuckets | RedisBuckets) -> None:
        self.limits = limits
        self.buckets = buckets

    def covers(self, provider: str) -> bool:
        return provider in self.limits

    async def acquire(self, provider: str, api_key: str) -> float:
        """Sleep until this request may go; returns the seconds waited."""
        limit = self.limits.get(provider)
        if limit is None:
            return 0.0
        wait = await self.buckets.reserve(bucket_name(provider, api_key), limit)
        if wait > 0:
            await asyncio.sleep(wait)
        return wait

    async def penalise(self, provider: str, api_key: str, seconds: float) -> None:
        if provider in self.limits and seconds > 0:
            await self.buckets.penalise(bucket_name(provider, api_key), seconds)


def limiter_for(config: Config) -> RateLimiter | None:
    """The configured limiter: in Redis when the broker is Redis, else in this process."""
    limits = parse_limits(config.get("rate_limits"), source=str(config.path or "configuration"))
    if not limits:
        return None
    broker = config.get("broker_url") or ""
    if broker.startswith(("redis://", "rediss://", "unix://")):
        return RateLimiter(limits, RedisBuckets(broker))
    return RateLimiter(limits, _local_buckets())


_local: LocalBuckets | None = None


def _local_buckets() -> LocalBuckets:
    global _local
    if _local is None:
        _local = LocalBuckets()
    return _local


def backoff_cap() -> float:
    """Backoff stays well below a worker's lease (`COBALT_LEASE_GRACE`, default 60 s)."""
    grace = float(os.environ.get("COBALT_LEASE_GRACE") or 60)
    return max(1.0, min(30.0, grace / 2))


def retry_delay(exc: Exception, attempt: int) -> float | None:
    """Seconds to wait before retrying after `exc`, or None when it is not worth retrying."""
    status = getattr(exc, "status_code", None)
    if status not in RETRYABLE_STATUS and type(exc).__name__ not in RETRYABLE_ERRORS:
        return None
    cap = backoff_cap()
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    hinted = retry_after(headers)
    if hinted is not None:
        return min(max(hinted, 0.0), cap)
    return min(0.5 * 2**attempt + random.uniform(0, 0.25), cap)


def retry_after(headers: Any) -> float | None:
    """Seconds a server asks to wait (`Retry-After`: seconds or an HTTP date; or
    `retry-after-ms`), or None."""
    try:
        millis = headers.get("retry-after-ms")
        if millis:
            return float(millis) / 1000
        value = headers.get("retry-after")
    except Exception:
        return None
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value)
        return parsed.timestamp() - time.time() if parsed else None


async def call_with_budget(
    limiter: RateLimiter,
    provider: str,
    api_key: str,
    call: Callable[[], Awaitable[T]],
    *,
    retries: int,
) -> T:
    """Send one request within the budget; retry 429/5xx honouring Retry-After (capped)."""
    for attempt in range(retries + 1):
        await limiter.acquire(provider, api_key)
        try:
            return await call()
        except Exception as exc:
            delay = retry_delay(exc, attempt)
            if delay is None or attempt == retries:
                raise
            if getattr(exc, "status_code", None) == 429:
                # Everyone waits, and the next `acquire` sleeps until the bucket reopens.
                await limiter.penalise(provider, api_key, delay)
            else:
                await asyncio.sleep(delay)
    raise AssertionError("unreachable")
