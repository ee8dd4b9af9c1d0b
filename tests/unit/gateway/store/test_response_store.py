"""Stored responses: every backend behind the one interface (redis against a real redis-server);
SQLite keeps them across a restart; each applies the age and count bounds."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.errors import ServerConfigError, StateUnavailableError
from gateway.store import STORES, StoredResponse, StoreSettings, open_store
from gateway.store.redis import INDEX
from tests.support.gateway_process import free_port


def record(i: int, *, age_s: float = 0.0) -> StoredResponse:
    return StoredResponse(
        f"resp_{i}",
        time.time() - age_s,
        {"id": f"resp_{i}", "object": "response", "output": [{"type": "message", "text": "ü🙂"}]},
        [
            {
                "id": f"msg_{i}",
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "hi"}],
            }
        ],
    )


def settings(
    kind: str, request: pytest.FixtureRequest, state_dir: Path, max_age_s: float | None, max_count: int | None
) -> StoreSettings:
    """The redis store runs against the tests' real redis-server, emptied for each test."""
    url = request.getfixturevalue("redis_url") if kind == "redis" else None
    return StoreSettings(state_dir, max_age_s, max_count, url)


@pytest.mark.parametrize("kind", sorted(STORES))
async def test_put_get_delete(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    store = open_store(kind, settings(kind, request, tmp_path, None, None))
    try:
        assert await store.get("resp_1") is None
        await store.put(record(1))
        got = await store.get("resp_1")
        assert (
            got is not None
            and got.response == record(1).response
            and got.input_items == record(1).input_items
        )
        assert await store.delete("resp_1") is True
        assert await store.delete("resp_1") is False
        assert await store.get("resp_1") is None
    finally:
        await store.close()


@pytest.mark.parametrize("kind", sorted(STORES))
async def test_retention_by_count_drops_the_oldest(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = open_store(kind, settings(kind, request, tmp_path, None, 2))
    try:
        for i in range(3):
            await store.put(record(i, age_s=10 - i))
        assert await store.get("resp_0") is None
        assert await store.get("resp_1") is not None and await store.get("resp_2") is not None
    finally:
        await store.close()


@pytest.mark.parametrize("kind", sorted(STORES))
async def test_retention_by_age(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    store = open_store(kind, settings(kind, request, tmp_path, 60.0, None))
    try:
        await store.put(record(0, age_s=120))
        await store.put(record(1))
        assert await store.get("resp_0") is None
        assert await store.get("resp_1") is not None
    finally:
        await store.close()


async def test_sqlite_keeps_responses_across_a_restart(tmp_path: Path) -> None:
    settings = StoreSettings(tmp_path / "state", None, None)
    store = open_store("sqlite", settings)
    await store.put(record(7))
    await store.close()
    reopened = open_store("sqlite", settings)
    try:
        got = await reopened.get("resp_7")
        assert got is not None and got.response == record(7).response
    finally:
        await reopened.close()


async def test_redis_shares_responses_between_replicas_and_drops_them_at_their_age(
    redis_url: str, tmp_path: Path
) -> None:
    first = open_store("redis", StoreSettings(tmp_path, 3600.0, 10, redis_url))
    second = open_store("redis", StoreSettings(tmp_path, 3600.0, 10, redis_url))
    client = aioredis.Redis.from_url(redis_url)
    try:
        await first.put(record(1, age_s=60))
        got = await second.get("resp_1")
        assert got is not None and got.input_items == record(1).input_items
        # The record expires by itself when it reaches the age bound (here in about 59 minutes).
        ttl_ms = await client.pttl("trtllm-gateway:responses:resp_1")
        assert 3400_000 < ttl_ms <= 3540_000
        assert await second.delete("resp_1") is True
        assert await first.get("resp_1") is None
        assert await client.zcard(INDEX) == 0
    finally:
        await first.close()
        await second.close()
        await client.aclose()


async def test_redis_without_a_state_url_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ServerConfigError, match="state-url"):
        open_store("redis", StoreSettings(tmp_path, None, None))


async def test_an_unreachable_redis_is_a_state_error(tmp_path: Path) -> None:
    store = open_store("redis", StoreSettings(tmp_path, None, None, f"redis://127.0.0.1:{free_port()}/0"))
    try:
        with pytest.raises(StateUnavailableError):
            await store.get("resp_1")
    finally:
        await store.close()


def test_an_unknown_store_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ServerConfigError, match="sqlite"):
        open_store("redis-please", StoreSettings(tmp_path, None, None))
