"""Per-key rate limits on the generation routes: a `Quota` for each request (the core reserves its
tokens once it knows them), the API's rate-limit headers on the response (OpenAI's `x-ratelimit-*`;
Anthropic's `anthropic-ratelimit-*` on /v1/messages), and the settlement with the tokens the request
really used once the response (the whole stream) is done."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.logs import current_request
from gateway.ratelimit import (
    HeaderFormat,
    KeyLimits,
    Quota,
    RateLimiter,
    current_quota,
    key_id,
    openai_headers,
)


def presented_key(scope: Scope) -> str | None:
    """The API key the request carries (`Authorization: Bearer KEY` or `x-api-key: KEY`)."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            return value[7:].strip().decode("latin-1") if value.lower().startswith(b"bearer ") else None
        if name == b"x-api-key":
            return value.strip().decode("latin-1")
    return None


class RateLimitMiddleware:
    """Behind the API-key check, so the key is a valid one; without configured keys every request
    shares one bucket (a client could otherwise escape its limit by inventing keys)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        paths: frozenset[str],
        limiter: RateLimiter,
        limits: KeyLimits,
        keyed: bool,
        header_format: Callable[[str], HeaderFormat] = lambda path: openai_headers,
    ) -> None:
        self.app = app
        self._paths = paths
        self._limiter = limiter
        self._limits = limits
        self._keyed = keyed
        self._header_format = header_format

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self._paths:
            await self.app(scope, receive, send)
            return
        key = presented_key(scope) if self._keyed else None
        limits = self._limits.for_key(key)
        if not limits.any:
            await self.app(scope, receive, send)
            return
        quota = Quota(self._limiter, key_id(key), limits, self._header_format(scope["path"]))
        token = current_quota.set(quota)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = message.get("headers", [])
                present = {name.lower() for name, _ in headers}
                extra = [
                    (name.encode(), value.encode())
                    for name, value in quota.headers().items()
                    if name.encode() not in present
                ]
                message["headers"] = [*headers, *extra]
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            current_quota.reset(token)
            record = current_request.get()
            # Unknown usage (the request ended before it was counted) keeps the reservation.
            if record is not None and record.prompt_tokens is not None:
                await quota.settle(record.prompt_tokens + (record.completion_tokens or 0))
