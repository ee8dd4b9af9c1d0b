"""Stored responses (the Responses API's `store`) behind one small interface, so another backend (a
store shared by several gateway replicas) is one more file here and one registry entry, with no
change to the API code. Below the APIs and the configuration, which takes its allowed values from
`STORES`.

A backend keeps each response with the conversation it answered (its input items, oldest first,
the items of every earlier response it continued included), and applies the retention bounds.
`redis` is the store shared by gateway replicas (`--state-url`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    # Unix time in seconds: retention by age counts from here.
    created_at: float
    # The Response object as the client got it.
    response: dict[str, Any]
    # The input items the response answered, each with its id, oldest first.
    input_items: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class StoreSettings:
    state_dir: Path
    # Responses older than this many seconds are dropped; None: kept regardless of age.
    max_age_s: float | None
    # At most this many responses are kept, the oldest dropped first; None: no bound.
    max_count: int | None
    # The state server shared by gateway replicas (redis://...), for the `redis` store.
    state_url: str | None = None


class ResponseStore(Protocol):
    async def put(self, record: StoredResponse) -> None: ...

    async def get(self, response_id: str) -> StoredResponse | None:
        """The response, or None when it is unknown, deleted or past retention."""
        ...

    async def delete(self, response_id: str) -> bool:
        """True when the response was there."""
        ...

    async def close(self) -> None: ...


def _sqlite(settings: StoreSettings) -> ResponseStore:
    from gateway.store.sqlite import SqliteResponseStore

    return SqliteResponseStore(
        settings.state_dir / "responses.sqlite3", settings.max_age_s, settings.max_count
    )


def _memory(settings: StoreSettings) -> ResponseStore:
    from gateway.store.memory import MemoryResponseStore

    return MemoryResponseStore(settings.max_age_s, settings.max_count)


def _redis(settings: StoreSettings) -> ResponseStore:
    from gateway.errors import ServerConfigError
    from gateway.store.redis import RedisResponseStore

    if settings.state_url is None:
        raise ServerConfigError("the redis response store needs --state-url (redis://host:port/db)")
    return RedisResponseStore(settings.state_url, settings.max_age_s, settings.max_count)


# The configuration's allowed values come from here.
STORES: dict[str, Callable[[StoreSettings], ResponseStore]] = {
    "sqlite": _sqlite,
    "memory": _memory,
    "redis": _redis,
}


def open_store(kind: str, settings: StoreSettings) -> ResponseStore:
    try:
        factory = STORES[kind]
    except KeyError:
        from gateway.errors import ServerConfigError

        raise ServerConfigError(
            f"unknown response store {kind!r}; expected one of {', '.join(STORES)}"
        ) from None
    return factory(settings)
