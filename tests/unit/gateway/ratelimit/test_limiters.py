"""Token buckets per key, in this process and in a real redis-server: requests and tokens taken
both or neither, refused with the wait until they fit, refilled with time, settled to real usage,
and atomic across clients (several gateway replicas on one server)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from gateway.errors import RateLimitError, StateUnavailableError
from gateway.ratelimit import Decision, Limits, Quota, RateLimiter, duration, key_id
from gateway.ratelimit.memory import MemoryRateLimiter
from gateway.ratelimit.redis import KEY_PREFIX, RedisRateLimiter
from tests.support.redis_server import RedisServer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# A limiter, and a way to let seconds pass for one key's buckets.
Backend = tuple[RateLimiter, Callable[[str, float], object]]


@pytest.fixture(params=["memory", "redis"])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "memory":
        clock = Clock()
        memory = MemoryRateLimiter(clock)

        def advance_memory(key: str, seconds: float) -> None:
            clock.now += seconds

        yield memory, advance_memory
        return
    url = request.getfixturevalue("redis_url")
    shared = RedisRateLimiter(url)
    client = aioredis.Redis.from_url(url)

    async def rewind(key: str, seconds: float) -> None:
        # The server's clock cannot be moved: the bucket's last update is moved back instead.
        at = float(await client.hget(KEY_PREFIX + key, "at"))
        await client.hset(KEY_PREFIX + key, "at", str(at - seconds * 1000))

    yield shared, rewind
    await shared.close()
    await client.aclose()


async def _advance(advance: Callable[[str, float], object], key: str, seconds: float) -> None:
    result = advance(key, seconds)
    if asyncio.iscoroutine(result):
        await result


async def test_requests_are_admitted_up_to_the_limit_then_refused_with_the_wait(limiter: Backend) -> None:
    limits = Limits(requests_per_minute=3)
    shared, _ = limiter
    decisions = [await shared.acquire("k", limits, requests=1, tokens=0) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.remaining_requests for d in decisions[:3]] == [2, 1, 0]
    refused = decisions[3]
    # One request comes back every 20 s at 3 per minute.
    # (Redis buckets refill by the server's real clock between the calls: a few seconds' slack.)
    assert refused.retry_after_s == pytest.approx(20.0, abs=2.0)
    assert refused.reset_requests_s == pytest.approx(60.0, abs=2.0)


async def test_keys_have_their_own_buckets(limiter: Backend) -> None:
    limits = Limits(requests_per_minute=1)
    shared, _ = limiter
    assert (await shared.acquire("a", limits, requests=1, tokens=0)).allowed
    assert (await shared.acquire("b", limits, requests=1, tokens=0)).allowed
    assert not (await shared.acquire("a", limits, requests=1, tokens=0)).allowed


async def test_a_request_refused_for_tokens_takes_no_request(limiter: Backend) -> None:
    limits = Limits(requests_per_minute=2, tokens_per_minute=100)
    shared, _ = limiter
    assert (await shared.acquire("k", limits, requests=1, tokens=80)).allowed
    refused = await shared.acquire("k", limits, requests=1, tokens=30)
    assert not refused.allowed
    assert refused.remaining_requests == 1 and 20 <= refused.remaining_tokens <= 25
    # 10 tokens short at 100 per minute: 6 s.
    assert refused.retry_after_s == pytest.approx(6.0, abs=2.0)
    assert (await shared.acquire("k", limits, requests=1, tokens=20)).allowed


async def test_buckets_refill_with_time_up_to_the_limit(limiter: Backend) -> None:
    limits = Limits(requests_per_minute=60, tokens_per_minute=600)
    shared, advance = limiter
    first = await shared.acquire("k", limits, requests=1, tokens=600)
    assert first.allowed and first.remaining_tokens == 0
    await _advance(advance, "k", 30.0)
    half = await shared.acquire("k", limits, requests=1, tokens=0)
    assert 299 <= half.remaining_tokens <= 330
    await _advance(advance, "k", 3600.0)
    full = await shared.acquire("k", limits, requests=1, tokens=0)
    assert full.remaining_tokens == 600 and full.remaining_requests == 59


async def test_settling_gives_back_unused_tokens_and_charges_extra(limiter: Backend) -> None:
    limits = Limits(tokens_per_minute=1000)
    shared, _ = limiter
    assert (await shared.acquire("k", limits, requests=1, tokens=900)).remaining_tokens == 100
    await shared.settle("k", limits, tokens=-850)  # reserved 900, used 50
    assert 950 <= (await shared.acquire("k", limits, requests=1, tokens=0)).remaining_tokens <= 1000
    await shared.settle("k", limits, tokens=5000)  # used far more than reserved: a debt, bounded
    after = await shared.acquire("k", limits, requests=1, tokens=1)
    assert not after.allowed and after.remaining_tokens < 0
    assert after.retry_after_s == pytest.approx(60.0, abs=3.0)


async def test_the_shared_limit_is_atomic_across_clients(redis_url: str) -> None:
    """Two replicas' clients racing on one key: exactly the limit is admitted."""
    replicas = [RedisRateLimiter(redis_url), RedisRateLimiter(redis_url)]
    limits = Limits(requests_per_minute=10, tokens_per_minute=1000)
    try:
        decisions = await asyncio.gather(
            *(replicas[i % 2].acquire("k", limits, requests=1, tokens=10) for i in range(40))
        )
    finally:
        for replica in replicas:
            await replica.close()
    assert sum(d.allowed for d in decisions) == 10


async def test_the_key_itself_is_never_stored(redis_url: str, redis_server: RedisServer) -> None:
    shared = RedisRateLimiter(redis_url)
    client = aioredis.Redis.from_url(redis_url)
    try:
        await shared.acquire(key_id("sk-secret"), Limits(requests_per_minute=5), requests=1, tokens=0)
        keys = [k.decode() for k in await client.keys("*")]
        assert keys == [KEY_PREFIX + key_id("sk-secret")] and "sk-secret" not in keys[0]
        # An idle bucket is full again after a window: the server forgets it.
        assert 0 < await client.pttl(keys[0]) <= 120_000
    finally:
        await shared.close()
        await client.aclose()


async def test_an_unreachable_state_server_is_a_state_error() -> None:
    from tests.support.gateway_process import free_port

    shared = RedisRateLimiter(f"redis://127.0.0.1:{free_port()}/0")
    try:
        with pytest.raises(StateUnavailableError):
            await shared.acquire("k", Limits(requests_per_minute=1), requests=1, tokens=0)
    finally:
        await shared.close()


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0ms"),
        (0.0171, "18ms"),
        (1.0, "1s"),
        (8.64, "8.64s"),
        (59.999, "60s"),
        (360.0, "6m0s"),
        (61.5, "1m1.5s"),
    ],
)
def test_reset_durations_are_written_as_openai_writes_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text


class _Scripted:
    def __init__(self, decision: Decision | None = None, fail: bool = False) -> None:
        self.decision = decision
        self.fail = fail
        self.settled: list[int] = []

    async def acquire(self, key: str, limits: Limits, *, requests: int, tokens: int) -> Decision:
        if self.fail:
            raise StateUnavailableError("down")
        assert self.decision is not None
        return self.decision

    async def settle(self, key: str, limits: Limits, *, tokens: int) -> None:
        self.settled.append(tokens)

    async def close(self) -> None:
        pass


async def test_a_quota_refusal_names_the_limit_and_carries_openais_headers() -> None:
    decision = Decision(False, 4, 12.0, 7, 59.5, retry_after_s=2.2)
    quota = Quota(_Scripted(decision), "k", Limits(5, 1000))
    with pytest.raises(RateLimitError) as caught:
        await quota.reserve(500)
    error = caught.value
    assert error.status_code == 429 and error.error_type == "tokens" and error.code == "rate_limit_exceeded"
    assert "limit 1000 per minute" in error.message and "remaining 7" in error.message
    assert error.headers == {
        "x-ratelimit-limit-requests": "5",
        "x-ratelimit-remaining-requests": "4",
        "x-ratelimit-reset-requests": "12s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "7",
        "x-ratelimit-reset-tokens": "59.5s",
        "retry-after": "3",
    }


async def test_a_request_larger_than_the_token_limit_is_refused_without_a_retry() -> None:
    quota = Quota(_Scripted(Decision(True, 0, 0, 0, 0)), "k", Limits(None, 100))
    with pytest.raises(RateLimitError, match="Request too large") as caught:
        await quota.reserve(101)
    assert "retry-after" not in caught.value.headers


async def test_a_quota_settles_the_difference_to_real_usage() -> None:
    backend = _Scripted(Decision(True, 0, 0, 900, 6.0))
    quota = Quota(backend, "k", Limits(None, 1000))
    await quota.reserve(100)
    await quota.settle(30)
    assert backend.settled == [-70]


async def test_an_unreachable_state_server_does_not_stop_serving() -> None:
    quota = Quota(_Scripted(fail=True), "k", Limits(5, None))
    await quota.reserve(10)
    assert quota.headers() == {}
