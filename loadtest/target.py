"""The interface every measured client implements, and the shared error vocabulary."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol

import aiohttp

from loadtest.metrics import RequestRecord
from loadtest.workload import Prompt

_DETAIL_LIMIT = 300


class Target(Protocol):
    """One way of reaching the model (OpenAI HTTP, Triton gRPC, Triton HTTP generate_stream).

    `send` never raises for a failed request: the failure is the record's `error` kind, so one bad
    request cannot abort a run and every failure is counted.
    """

    name: str

    async def open(self, max_concurrency: int) -> None: ...

    async def send(self, prompt: Prompt) -> RequestRecord: ...

    async def aclose(self) -> None: ...


def error_kind(exc: BaseException) -> str:
    """A short, bounded label for an exception (the error-count key)."""
    # aiohttp's ServerTimeoutError (ConnectionTimeoutError, SocketTimeoutError) is a TimeoutError too.
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return "timeout"
    # Refused, unreachable, DNS or TLS failure: the request never reached the server.
    if isinstance(exc, (aiohttp.ClientConnectorError, ConnectionRefusedError)):
        return "connect_error"
    # The peer went away mid-request: reset, disconnected before the response, body cut short.
    if isinstance(exc, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError)):
        return "connection_closed"
    # A response aiohttp could not parse (a malformed status line or headers): the protocol broke.
    if type(exc) is aiohttp.ClientResponseError:
        return "connection_closed"
    # Not for aiohttp's errors: ClientResponseError's `code` is a deprecated alias of its status.
    if not isinstance(exc, aiohttp.ClientError):
        code = getattr(exc, "code", None)
        if callable(code):  # grpc.aio.AioRpcError
            try:
                status = code()
                return f"grpc_{getattr(status, 'name', status)}".lower()
            except Exception:  # a broken status object must not hide the original failure
                pass
    name = type(exc).__name__
    return "bad_json" if name == "JSONDecodeError" else name


def server_message(body: bytes) -> str:
    """An error response's message: `error.message` (OpenAI's and Anthropic's shapes), or a string
    `error`/`detail`, when the body is JSON shaped so, else the body's text."""
    text = body.decode("utf-8", "replace").strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        return text
    if isinstance(parsed, dict):
        error = parsed.get("error", parsed.get("detail"))
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
    return text


def detail(text: object) -> str:
    s = str(text)
    return s if len(s) <= _DETAIL_LIMIT else s[:_DETAIL_LIMIT] + "..."


def http_session(
    max_concurrency: int, timeout: float, *, fresh_connections: bool = False, client: str = "aiohttp"
) -> Any:
    """The HTTP targets' client: one keep-alive connection per concurrent request, bodies left raw;
    with `fresh_connections`, a new connection for every request (as many separate clients would
    connect: a server's SO_REUSEPORT workers then each get a fair share of requests, not of a few
    long-lived connections).

    `timeout` bounds each wait on the server (a read, or getting a connection from the pool), not a
    whole stream, so a long generation that keeps producing tokens is never cut off; connecting has 30 s.
    Call from inside the running event loop; the caller closes the session.

    `client="lean"` gives `loadtest.lean_http.LeanSession` instead, the same calls over a bare
    asyncio protocol: several times cheaper per token, for bench-host's many-worker cells.
    """
    if client == "lean":
        from loadtest.lean_http import LeanSession

        return LeanSession(timeout, fresh_connections=fresh_connections)
    if client != "aiohttp":
        raise ValueError(f"unknown HTTP client {client!r} (aiohttp or lean)")
    connector = aiohttp.TCPConnector(
        limit=max_concurrency, limit_per_host=max_concurrency, force_close=fresh_connections
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, connect=timeout, sock_connect=30.0, sock_read=timeout),
        # Raw reads are timed and parsed as they arrive: ask for, and expect, uncompressed bodies.
        headers={"accept-encoding": "identity"},
        auto_decompress=False,
    )
