"""Stored responses: every backend behind the one interface; SQLite keeps them across a restart
and applies the age and count bounds."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gateway.errors import ServerConfigError
from gateway.store import STORES, StoredResponse, StoreSettings, open_store


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


@pytest.mark.parametrize("kind", sorted(STORES))
async def test_put_get_delete(kind: str, tmp_path: Path) -> None:
    store = open_store(kind, StoreSettings(tmp_path, None, None))
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
async def test_retention_by_count_drops_the_oldest(kind: str, tmp_path: Path) -> None:
    store = open_store(kind, StoreSettings(tmp_path, None, 2))
    try:
        for i in range(3):
            await store.put(record(i, age_s=10 - i))
        assert await store.get("resp_0") is None
        assert await store.get("resp_1") is not None and await store.get("resp_2") is not None
    finally:
        await store.close()


@pytest.mark.parametrize("kind", sorted(STORES))
async def test_retention_by_age(kind: str, tmp_path: Path) -> None:
    store = open_store(kind, StoreSettings(tmp_path, 60.0, None))
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


def test_an_unknown_store_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ServerConfigError, match="sqlite"):
        open_store("redis-please", StoreSettings(tmp_path, None, None))
