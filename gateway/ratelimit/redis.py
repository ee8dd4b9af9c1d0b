"""Each key's buckets in a Redis or Valkey server that every gateway replica shares (`--state-url`).
One Lua script per call refills, checks and takes from both buckets of a key atomically, with the
server's clock, so replicas never race on a read-modify-write nor disagree about time."""

from __future__ import annotations

from typing import Any

from redis.exceptions import RedisError

from gateway.errors import StateUnavailableError
from gateway.ratelimit import Decision, Limits, seconds_to_full
from gateway.state_server import connect

KEY_PREFIX = "trtllm-gateway:ratelimit:"
# A bucket untouched for a window is full, the same as no bucket: let the server forget it.
_TTL_MS = 120_000

# KEYS[1]: the key's hash {r: requests level, t: tokens level, at: ms}.
# ARGV: rpm, tpm (0: not limited), requests, tokens, mode (acquire | settle).
# Returns {allowed, requests level, tokens level, ms until it would fit}.
_SCRIPT = """
local rpm = tonumber(ARGV[1])
local tpm = tonumber(ARGV[2])
local nreq = tonumber(ARGV[3])
local ntok = tonumber(ARGV[4])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local saved = redis.call('HMGET', KEYS[1], 'r', 't', 'at')
local r, t, at = tonumber(saved[1]), tonumber(saved[2]), tonumber(saved[3])
local elapsed = 0
if at then elapsed = math.max(0, now - at) end
if rpm > 0 then r = math.min(rpm, (r or rpm) + elapsed * rpm / 60000) else r = 0 end
if tpm > 0 then t = math.min(tpm, (t or tpm) + elapsed * tpm / 60000) else t = 0 end
local allowed = 1
local wait = 0
if ARGV[5] == 'acquire' then
  if rpm > 0 and r < nreq then
    allowed = 0
    wait = math.max(wait, (nreq - r) * 60000 / rpm)
  end
  if tpm > 0 and t < ntok then
    allowed = 0
    wait = math.max(wait, (ntok - t) * 60000 / tpm)
  end
  if allowed == 1 then
    if rpm > 0 then r = r - nreq end
    if tpm > 0 then t = t - ntok end
  end
elseif tpm > 0 then
  t = math.max(-tpm, math.min(tpm, t - ntok))
end
redis.call('HSET', KEYS[1], 'r', tostring(r), 't', tostring(t), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return {allowed, tostring(r), tostring(t), tostring(wait)}
"""


class RedisRateLimiter:
    def __init__(self, url: str) -> None:
        self._client = connect(url)
        self._script = self._client.register_script(_SCRIPT)

    async def _run(self, key: str, limits: Limits, requests: int, tokens: int, mode: str) -> list[Any]:
        args: list[str | int] = [
            limits.requests_per_minute or 0,
            limits.tokens_per_minute or 0,
            requests,
            tokens,
            mode,
            _TTL_MS,
        ]
        try:
            result: list[Any] = await self._script(keys=[KEY_PREFIX + key], args=args)
        except RedisError as exc:
            raise StateUnavailableError(f"the state server failed: {exc}") from exc
        return result

    async def acquire(self, key: str, limits: Limits, *, requests: int, tokens: int) -> Decision:
        allowed, r, t, wait_ms = await self._run(key, limits, requests, tokens, "acquire")
        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        req_level, tok_level = float(r), float(t)
        return Decision(
            allowed=bool(int(allowed)),
            remaining_requests=int(req_level),
            reset_requests_s=seconds_to_full(req_level, rpm) if rpm else 0.0,
            remaining_tokens=int(tok_level),
            reset_tokens_s=seconds_to_full(tok_level, tpm) if tpm else 0.0,
            retry_after_s=None if int(allowed) else float(wait_ms) / 1000,
        )

    async def settle(self, key: str, limits: Limits, *, tokens: int) -> None:
        if limits.tokens_per_minute is not None:
            await self._run(key, limits, 0, tokens, "settle")

    async def close(self) -> None:
        await self._client.aclose()
