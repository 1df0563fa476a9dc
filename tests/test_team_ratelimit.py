"""The shared rate budget: GCRA in Redis (DB 5) or in-process, 429 Retry-After, the SDK path."""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path

import openai
import pytest

from cobalt.config import ConfigError, load_config
from cobalt_app.providers import ProviderHub
from cobalt_app.ratelimit import (
    Limit,
    LocalBuckets,
    RateLimiter,
    RedisBuckets,
    call_with_budget,
    limiter_for,
    parse_limits,
)
from tests.fake_provider import FakeProvider
from tests.team_harness import REDIS_URL


def fresh_key() -> str:
    return f"sk-test-{secrets.token_hex(8)}"


def test_limits_read_requests_per_minute_or_second_and_burst():
    limits = parse_limits(
        {"openai": 120, "anthropic": {"requests_per_second": 4, "burst": 3}}, source="cobalt.toml"
    )
    assert limits["openai"] == Limit(rate=2.0, burst=1)
    assert limits["anthropic"] == Limit(rate=4.0, burst=3)
    assert parse_limits({}) == {}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"openai": {"rpm": 3}}, "`rate_limits.openai`: unknown key 'rpm'"),
        ({"openai": {}}, "needs one of requests_per_minute or requests_per_second"),
        ({"openai": {"requests_per_second": 0}}, "the rate must be a number above 0"),
        ({"openai": {"requests_per_minute": 60, "burst": 0}}, "burst must be a whole number"),
        ({"openai": "fast"}, "must be a number (requests per minute) or a table"),
    ],
)
def test_a_bad_rate_limit_names_the_key_and_what_to_write(spec, message):
    with pytest.raises(ConfigError) as caught:
        parse_limits(spec, source="cobalt.toml")
    assert message in str(caught.value)
    assert str(caught.value).startswith("cobalt.toml: ")


def test_the_limiter_lives_in_redis_with_a_redis_broker_and_in_process_otherwise(
    tmp_path: Path, monkeypatch
):
    (tmp_path / "cobalt.toml").write_text("[rate_limits]\nopenai = 60\n")
    assert isinstance(limiter_for(load_config(tmp_path)).buckets, LocalBuckets)
    monkeypatch.setenv("COBALT_BROKER_URL", REDIS_URL)
    assert isinstance(limiter_for(load_config(tmp_path)).buckets, RedisBuckets)
    (tmp_path / "cobalt.toml").write_text("")
    assert limiter_for(load_config(tmp_path)) is None


@pytest.mark.parametrize("backend", ["redis", "local"])
def test_reservations_are_spaced_by_the_rate_after_the_burst(backend):
    limit = Limit(rate=20.0, burst=3)
    buckets = RedisBuckets(REDIS_URL) if backend == "redis" else LocalBuckets()

    async def reserve_all() -> list[float]:
        name = f"cobalt:rate:test:{secrets.token_hex(6)}"
        return [await buckets.reserve(name, limit) for _ in range(6)]

    waits = asyncio.run(reserve_all())
    assert waits[:3] == [0.0, 0.0, 0.0]
    # Then one every 50 ms (minus the few ms the calls themselves took).
    for position, wait in enumerate(waits[3:], start=1):
        assert 0.05 * position - 0.02 <= wait <= 0.05 * position + 0.001, waits


def test_two_limiters_share_one_redis_budget():
    """Two workers are two processes with two clients; the bucket is the same Redis key."""
    limits = {"openai": Limit(rate=10.0)}
    first = RateLimiter(limits, RedisBuckets(REDIS_URL))
    second = RateLimiter(limits, RedisBuckets(REDIS_URL))
    key = fresh_key()

    async def both() -> list[float]:
        started = time.monotonic()
        stamps: list[float] = []

        async def take(limiter: RateLimiter) -> None:
            await limiter.acquire("openai", key)
            stamps.append(time.monotonic() - started)

        await asyncio.gather(*(take(first if i % 2 else second) for i in range(8)))
        return sorted(stamps)

    stamps = asyncio.run(both())
    assert stamps[-1] >= 0.7 * 0.95  # 8 requests at 10/s: the last one 0.7 s after the first
    # The n-th request is let through no sooner than n/10 s after the start. (Measured as the
    # task wakes up, a stamp can only come late: under load one late stamp shortens the gap to
    # the next, so the gaps themselves prove nothing.)
    for position, stamp in enumerate(stamps):
        assert stamp >= 0.1 * position * 0.95, stamps


def test_a_429_pauses_every_worker_for_its_retry_after_and_the_request_succeeds(
    fake_provider: FakeProvider,
):
    limits = {"openai": Limit(rate=50.0)}
    refused = RateLimiter(limits, RedisBuckets(REDIS_URL))
    other_worker = RateLimiter(limits, RedisBuckets(REDIS_URL))
    key = fresh_key()
    fake_provider.fail_next(2, 429, retry_after=0.5)

    async def scenario() -> tuple[str, float, float]:
        client = openai.AsyncOpenAI(
            base_url=fake_provider.openai_base_url, api_key=key, max_retries=0
        )
        started = time.monotonic()

        async def ask() -> str:
            reply = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "ECHO: fine"}]
            )
            return reply.choices[0].message.content

        text = await call_with_budget(refused, "openai", key, ask, retries=3)
        elapsed = time.monotonic() - started
        waited = await other_worker.acquire("openai", key)
        await client.close()
        return text, elapsed, waited

    text, elapsed, _ = asyncio.run(scenario())
    assert text == "fine"
    assert elapsed >= 1.0  # two Retry-After: 0.5 honoured
    assert fake_provider.request_count("/v1/chat") == 3
    times = [r["time"] for r in fake_provider.requests]
    assert times[1] - times[0] >= 0.45 and times[2] - times[1] >= 0.45


def test_a_penalty_makes_the_other_workers_wait_too():
    limits = {"openai": Limit(rate=100.0)}
    first = RateLimiter(limits, RedisBuckets(REDIS_URL))
    second = RateLimiter(limits, RedisBuckets(REDIS_URL))
    key = fresh_key()

    async def scenario() -> float:
        started = time.monotonic()
        await first.penalise("openai", key, 0.4)
        await second.acquire("openai", key)  # sleeps until the penalty has passed
        return time.monotonic() - started

    # Measured from before the penalty: a stall between the two calls (a busy machine)
    # shortens the wait but never lets the second worker go early.
    assert 0.39 <= asyncio.run(scenario()) <= 2


def test_errors_that_retrying_cannot_fix_are_raised_at_once(fake_provider: FakeProvider):
    limiter = RateLimiter({"openai": Limit(rate=100.0)}, LocalBuckets())
    fake_provider.fail_next(1, 400, retry_after=None)

    async def scenario() -> None:
        client = openai.AsyncOpenAI(base_url=fake_provider.openai_base_url, api_key="k")
        try:
            await call_with_budget(
                limiter,
                "openai",
                "k",
                lambda: client.chat.completions.create(model="m", messages=[]),
                retries=3,
            )
        finally:
            await client.close()

    with pytest.raises(openai.BadRequestError):
        asyncio.run(scenario())
    assert fake_provider.request_count("/v1/chat") == 1


def test_judge_calls_of_the_provider_hub_keep_to_the_budget(fake_provider: FakeProvider):
    limiter = RateLimiter({"openai": Limit(rate=10.0)}, RedisBuckets(REDIS_URL))
    hub = ProviderHub({"provider": "openai", "max_retries": 2}, limiter=limiter)

    async def judge_five() -> tuple[list[str], list[int]]:
        try:
            replies = await asyncio.gather(
                *(
                    hub.chat(provider="openai", model="m", system="s", user=f"ECHO: {i}")
                    for i in range(5)
                )
            )
            retries = [client.max_retries for client in hub._clients.values()]
        finally:
            await hub.aclose()
        return sorted(r.text for r in replies), retries

    texts, retries = asyncio.run(judge_five())
    assert texts == ["0", "1", "2", "3", "4"]
    times = sorted(r["time"] for r in fake_provider.requests)
    assert times[-1] - times[0] >= 0.4 * 0.95
    # The SDK's own retries are off: the budget's loop retries, each try within the budget.
    assert retries == [0]
