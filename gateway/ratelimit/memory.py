"""The embedded default: each key's buckets in this process (one gateway process; with
`--workers N` each worker keeps its own, so a key may get up to N times its limit: give several
workers or replicas a state server)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.ratelimit import WINDOW_S, Decision, Limits, refill, seconds_to_full, seconds_until


@dataclass(slots=True)
class _Buckets:
    requests: float
    tokens: float
    at: float


class MemoryRateLimiter:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, _Buckets] = {}

    def _refilled(self, key: str, limits: Limits) -> _Buckets:
        now = self._clock()
        rpm, tpm = limits.requests_per_minute or 0, limits.tokens_per_minute or 0
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = _Buckets(float(rpm), float(tpm), now)
            self._forget_full(now)
            return b
        elapsed = now - b.at
        b.requests = refill(b.requests, elapsed, rpm) if rpm else 0.0
        b.tokens = refill(b.tokens, elapsed, tpm) if tpm else 0.0
        b.at = now
        return b

    def _forget_full(self, now: float) -> None:
        # Keys unseen for a whole window are full again, the same as unknown: keep the dict small.
        if len(self._buckets) > 1024:
            for key in [k for k, b in self._buckets.items() if now - b.at > WINDOW_S]:
                del self._buckets[key]

    async def acquire(self, key: str, limits: Limits, *, requests: int, tokens: int) -> Decision:
        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        b = self._refilled(key, limits)
        waits = []
        if rpm is not None and b.requests < requests:
            waits.append(seconds_until(b.requests, requests, rpm))
        if tpm is not None and b.tokens < tokens:
            waits.append(seconds_until(b.tokens, tokens, tpm))
        if not waits:
            if rpm is not None:
                b.requests -= requests
            if tpm is not None:
                b.tokens -= tokens
        return Decision(
            allowed=not waits,
            remaining_requests=int(b.requests),
            reset_requests_s=seconds_to_full(b.requests, rpm) if rpm else 0.0,
            remaining_tokens=int(b.tokens),
            reset_tokens_s=seconds_to_full(b.tokens, tpm) if tpm else 0.0,
            retry_after_s=max(waits) if waits else None,
        )

    async def settle(self, key: str, limits: Limits, *, tokens: int) -> None:
        tpm = limits.tokens_per_minute
        if tpm is None:
            return
        b = self._refilled(key, limits)
        # A debt is bounded by one window's limit.
        b.tokens = max(-float(tpm), min(float(tpm), b.tokens - tokens))

    async def close(self) -> None:
        self._buckets.clear()
