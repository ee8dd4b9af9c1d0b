"""Stored responses in a Redis or Valkey server that every gateway replica shares (`--state-url`):
a response stored through one replica is retrieved or continued through any other. The same
retention bounds as SQLite: by age (the record's own expiry, and checked on read) and by count
(an index sorted by creation time; one Lua script stores and trims atomically)."""

from __future__ import annotations

import json
import time
from typing import Any

from redis.exceptions import RedisError

from gateway.errors import StateUnavailableError
from gateway.state_server import connect
from gateway.store import StoredResponse

KEY_PREFIX = "trtllm-gateway:responses:"
INDEX = "trtllm-gateway:response-index"
# Dropped by one put at most (age or count): a long-idle store is trimmed over several puts.
_TRIM_BATCH = 1000

# KEYS[1]: the index (zset id -> created_at); KEYS[2]: the record.
# ARGV: id, created_at, record json, ttl ms (0: none), oldest created_at kept (or '-inf'),
# max count (0: none), key prefix, batch.
_PUT = """
local index, key, id = KEYS[1], KEYS[2], ARGV[1]
if tonumber(ARGV[4]) > 0 then
  redis.call('SET', key, ARGV[3], 'PX', ARGV[4])
else
  redis.call('SET', key, ARGV[3])
end
redis.call('ZADD', index, ARGV[2], id)
local prefix, batch = ARGV[7], tonumber(ARGV[8])
if ARGV[5] ~= '-inf' then
  local old = redis.call('ZRANGEBYSCORE', index, '-inf', '(' .. ARGV[5], 'LIMIT', 0, batch)
  for _, gone in ipairs(old) do
    redis.call('DEL', prefix .. gone)
    redis.call('ZREM', index, gone)
  end
end
local max = tonumber(ARGV[6])
if max > 0 then
  local over = redis.call('ZCARD', index) - max
  if over > 0 then
    local gone = redis.call('ZRANGE', index, 0, math.min(over, batch) - 1)
    for _, old in ipairs(gone) do
      redis.call('DEL', prefix .. old)
      redis.call('ZREM', index, old)
    end
  end
end
return 1
"""


class RedisResponseStore:
    def __init__(self, url: str, max_age_s: float | None, max_count: int | None) -> None:
        self._client = connect(url)
        self._put = self._client.register_script(_PUT)
        self._max_age_s = max_age_s
        self._max_count = max_count

    def _expired(self, created_at: float) -> bool:
        return self._max_age_s is not None and created_at < time.time() - self._max_age_s

    async def put(self, record: StoredResponse) -> None:
        data = json.dumps(
            {"created_at": record.created_at, "response": record.response, "input_items": record.input_items}
        )
        ttl_ms = 0
        oldest = "-inf"
        if self._max_age_s is not None:
            # Expires when it reaches the age bound; one already past it is not stored at all.
            ttl_ms = int((record.created_at + self._max_age_s - time.time()) * 1000)
            oldest = repr(time.time() - self._max_age_s)
            if ttl_ms <= 0:
                await self.delete(record.id)
                return
        args: list[Any] = [
            record.id,
            repr(record.created_at),
            data,
            ttl_ms,
            oldest,
            self._max_count or 0,
            KEY_PREFIX,
            _TRIM_BATCH,
        ]
        try:
            await self._put(keys=[INDEX, KEY_PREFIX + record.id], args=args)
        except RedisError as exc:
            raise StateUnavailableError(f"the state server failed to store a response: {exc}") from exc

    async def get(self, response_id: str) -> StoredResponse | None:
        try:
            raw = await self._client.get(KEY_PREFIX + response_id)
        except RedisError as exc:
            raise StateUnavailableError(f"the state server failed to read a response: {exc}") from exc
        if raw is None:
            return None
        data = json.loads(raw)
        if self._expired(data["created_at"]):
            return None
        return StoredResponse(response_id, data["created_at"], data["response"], data["input_items"])

    async def delete(self, response_id: str) -> bool:
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.delete(KEY_PREFIX + response_id)
                pipe.zrem(INDEX, response_id)
                deleted, _ = await pipe.execute()
        except RedisError as exc:
            raise StateUnavailableError(f"the state server failed to delete a response: {exc}") from exc
        return bool(deleted)

    async def close(self) -> None:
        await self._client.aclose()
