"""Per-key rate limits: requests and tokens per minute for each API key, as token buckets that a
backend keeps (`memory`: this process; `redis`: a Redis or Valkey server shared by every gateway
replica). Below the HTTP plumbing and the core, which meet here: the middleware opens a `Quota` for
each generation request, the core reserves its tokens once it knows them, and the middleware
settles the reservation with what the request really used.

How tokens are counted (as OpenAI roughly does): at admission a request reserves its prompt tokens
plus its output limit (`max_tokens` times the sequences asked for); when it ends, the reservation
is settled to the tokens it really used (prompt plus generated), and the difference goes back to
the bucket (or, rarely, is charged). A bucket holds one minute's limit and refills continuously."""

from __future__ import annotations

import contextvars
import hashlib
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from gateway.errors import RateLimitError, StateUnavailableError
from gateway.logs import Repeating

logger = logging.getLogger(__name__)

WINDOW_S = 60.0


@dataclass(frozen=True, slots=True)
class Limits:
    # None: that dimension is not limited.
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    @property
    def any(self) -> bool:
        return self.requests_per_minute is not None or self.tokens_per_minute is not None


@dataclass(frozen=True, slots=True)
class Decision:
    """What a bucket said about one request: whether it was admitted, and the bucket's state after
    (the figures of OpenAI's `x-ratelimit-*` headers). Seconds are floats; levels whole numbers."""

    allowed: bool
    remaining_requests: int
    reset_requests_s: float
    remaining_tokens: int
    reset_tokens_s: float
    # When refused: how long until the request would fit (None: it never fits in the limit).
    retry_after_s: float | None = None


class RateLimiter(Protocol):
    async def acquire(self, key: str, limits: Limits, *, requests: int, tokens: int) -> Decision:
        """Take `requests` and `tokens` from the key's buckets, both or neither, atomically.
        Raises StateUnavailableError when the backend cannot answer."""
        ...

    async def settle(self, key: str, limits: Limits, *, tokens: int) -> None:
        """Charge `tokens` more (negative: give them back), at most up to a full bucket."""
        ...

    async def close(self) -> None: ...


def refill(level: float, elapsed_s: float, limit: int) -> float:
    """A bucket's level after `elapsed_s`: it refills `limit` per minute, up to `limit`."""
    return min(float(limit), level + max(0.0, elapsed_s) * limit / WINDOW_S)


def seconds_to_full(level: float, limit: int) -> float:
    return max(0.0, (limit - level) * WINDOW_S / limit)


def seconds_until(level: float, need: int, limit: int) -> float:
    return max(0.0, (need - level) * WINDOW_S / limit)


def duration(seconds: float) -> str:
    """OpenAI's reset format: `20ms`, `1s`, `8.64s`, `6m0s`."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{round(seconds, 2):g}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{round(rest, 2):g}s"


def key_id(api_key: str | None) -> str:
    """What a key is kept under: a digest (the key itself never leaves the process)."""
    if not api_key:
        return "anonymous"
    return hashlib.sha256(api_key.encode()).hexdigest()[:32]


class KeyLimits:
    """The limits of each key: its own where configured, else the default."""

    def __init__(self, default: Limits, per_key: Mapping[str, Limits]) -> None:
        self._default = default
        self._per_key = dict(per_key)

    @property
    def configured(self) -> bool:
        return self._default.any or any(lim.any for lim in self._per_key.values())

    def for_key(self, api_key: str | None) -> Limits:
        return self._per_key.get(api_key or "", self._default)


# How an API writes a key's limits and a bucket's state as response headers.
HeaderFormat = Callable[[Limits, Decision], dict[str, str]]


def openai_headers(limits: Limits, decision: Decision) -> dict[str, str]:
    """OpenAI's `x-ratelimit-*` headers for the key's limited dimensions, and Retry-After on a refusal."""
    out: dict[str, str] = {}
    if limits.requests_per_minute is not None:
        out["x-ratelimit-limit-requests"] = str(limits.requests_per_minute)
        out["x-ratelimit-remaining-requests"] = str(max(0, decision.remaining_requests))
        out["x-ratelimit-reset-requests"] = duration(decision.reset_requests_s)
    if limits.tokens_per_minute is not None:
        out["x-ratelimit-limit-tokens"] = str(limits.tokens_per_minute)
        out["x-ratelimit-remaining-tokens"] = str(max(0, decision.remaining_tokens))
        out["x-ratelimit-reset-tokens"] = duration(decision.reset_tokens_s)
    out.update(retry_after(decision))
    return out


def retry_after(decision: Decision) -> dict[str, str]:
    """`retry-after` in whole seconds (at least 1) on a refusal that a wait can cure; both APIs send it."""
    if decision.allowed or decision.retry_after_s is None:
        return {}
    return {"retry-after": str(max(1, math.ceil(decision.retry_after_s)))}


class Quota:
    """One request's dealings with its key's buckets: `reserve` at admission (the core calls it,
    raising RateLimitError when the key is over its limit), `settle` when the request is done."""

    __slots__ = ("_format", "_key", "_limiter", "_limits", "_requested", "decision", "reserved")

    # A state server that cannot be reached does not stop serving: limits are then not enforced,
    # and this says so in the log.
    _unreachable = Repeating()

    def __init__(
        self, limiter: RateLimiter, key: str, limits: Limits, header_format: HeaderFormat = openai_headers
    ) -> None:
        self._limiter = limiter
        self._key = key
        self._limits = limits
        self._format = header_format
        self.decision: Decision | None = None
        self.reserved = 0
        self._requested = 0

    async def reserve(self, tokens: int) -> None:
        limit = self._limits.tokens_per_minute
        if limit is not None and tokens > limit:
            raise RateLimitError(
                f"Request too large: it may use up to {tokens} tokens (prompt plus max_tokens), more "
                f"than this key's limit of {limit} tokens per minute. Lower max_tokens or the prompt.",
                kind="tokens",
            )
        self._requested = tokens
        try:
            decision = await self._limiter.acquire(self._key, self._limits, requests=1, tokens=tokens)
        except StateUnavailableError as exc:
            self._report(exc)
            return
        self.decision = decision
        if not decision.allowed:
            raise RateLimitError(
                self._refusal(decision), kind=self._refused_kind(decision), headers=self.headers()
            )
        self.reserved = tokens

    async def settle(self, used_tokens: int) -> None:
        if self.decision is None or not self.decision.allowed or self._limits.tokens_per_minute is None:
            return
        delta = used_tokens - self.reserved
        if delta == 0:
            return
        try:
            await self._limiter.settle(self._key, self._limits, tokens=delta)
        except StateUnavailableError as exc:
            self._report(exc)

    def _report(self, exc: BaseException) -> None:
        message = f"rate limits not enforced: the state server failed: {exc}"
        if self._unreachable.should_log(message):
            logger.warning("%s", message)

    def _refused_kind(self, decision: Decision) -> str:
        if self._limits.requests_per_minute is not None and decision.remaining_requests < 1:
            return "requests"
        return "tokens"

    def _refusal(self, decision: Decision) -> str:
        wait = duration(decision.retry_after_s or 0.0)
        if self._refused_kind(decision) == "requests":
            return (
                f"Rate limit reached for requests: limit {self._limits.requests_per_minute} per minute, "
                f"used up. Please try again in {wait}."
            )
        return (
            f"Rate limit reached for tokens: limit {self._limits.tokens_per_minute} per minute, "
            f"remaining {max(0, decision.remaining_tokens)}, requested up to {self._requested}. "
            f"Please try again in {wait}."
        )

    def headers(self) -> dict[str, str]:
        """The rate-limit headers of the request's API (OpenAI's unless the path's API has its own)."""
        return {} if self.decision is None else self._format(self._limits, self.decision)


current_quota: contextvars.ContextVar[Quota | None] = contextvars.ContextVar("current_quota", default=None)


def _memory(state_url: str | None) -> RateLimiter:
    from gateway.ratelimit.memory import MemoryRateLimiter

    return MemoryRateLimiter()


def _redis(state_url: str | None) -> RateLimiter:
    from gateway.ratelimit.redis import RedisRateLimiter

    assert state_url is not None, "the redis limiter needs a state URL"
    return RedisRateLimiter(state_url)


LIMITERS: dict[str, Callable[[str | None], RateLimiter]] = {"memory": _memory, "redis": _redis}


def open_limiter(state_url: str | None) -> RateLimiter:
    """The shared limiter when the gateway has a state server, else this process's own."""
    return LIMITERS["redis" if state_url else "memory"](state_url)
