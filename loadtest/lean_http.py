"""The load generator's lean HTTP client: the part of aiohttp's client API the targets use (`post`
as an async context manager, `status`, `read()`, `content.iter_any()`), over a bare asyncio protocol
with httptools (the parser uvicorn serves with).

Why: bench-host must load eight saturated gateway workers from a few cores. aiohttp's client pays
per read for its payload stream, a timer context and a new future, and per request for its
connector, request and response objects; a streamed token is one read of a few hundred bytes, so
that cost is paid per token. Here a read is `feed_data`, an append, and at most one waiter woken;
the read timeout is one timer per request that re-arms itself, not one per read. Run it on uvloop.

Errors are the built-in ones `loadtest.target.error_kind` already counts: `ConnectionRefusedError`
(connect_error), `ConnectionError` for a reset, a truncated or a malformed response
(connection_closed), `TimeoutError` (timeout).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from urllib.parse import urlsplit

import httptools

from gateway.asyncutil import IdleWatch


class _Connection(asyncio.Protocol):
    """One connection and the response being read on it."""

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key  # (host, port): where it goes back to when kept alive
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.chunks: deque[bytes] = deque()
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.error: BaseException | None = None
        self.active = False  # a read arrived since the read timeout last looked
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.active = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"malformed HTTP response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.complete:
            self._fail(exc if isinstance(exc, ConnectionError) else ConnectionError("connection closed"))
        self._wake()

    # ---- httptools callbacks
    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()
        self._wake()

    # ---- the reader's side
    def take_activity(self) -> bool:
        """Whether a read came since the last call (for the read timeout's IdleWatch)."""
        active, self.active = self.active, False
        return active

    def timed_out(self, timeout: float) -> None:
        if not self.complete and self.error is None:
            self._fail(TimeoutError(f"no data from the server for {timeout:g} s"))

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        """Until the next read, the end of the response, or a failure."""
        if self.error is not None:
            raise self.error
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None
        if self.error is not None:
            raise self.error

    def reset(self) -> None:
        """Ready for the next response on this kept-alive connection."""
        self.status = 0
        self.chunks.clear()
        self.headers_done = self.complete = self.keep_alive = False


class _Content:
    def __init__(self, conn: _Connection) -> None:
        self._conn = conn

    async def iter_any(self) -> AsyncIterator[bytes]:
        """Each read's body bytes as they arrive (several reads joined when the reader fell behind)."""
        conn = self._conn
        chunks = conn.chunks
        while True:
            if chunks:
                data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                yield data
                continue
            if conn.complete:
                return
            await conn.wait()


class LeanResponse:
    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self.status = conn.status
        self.content = _Content(conn)

    async def read(self) -> bytes:
        conn = self._conn
        while not conn.complete:
            await conn.wait()
        body = b"".join(conn.chunks)
        conn.chunks.clear()
        return body


class _Post:
    def __init__(self, session: LeanSession, url: str, data: bytes, headers: Mapping[str, str]) -> None:
        self._session = session
        self._url = url
        self._data = data
        self._headers = headers
        self._conn: _Connection | None = None
        self._watchdog: IdleWatch | None = None

    async def __aenter__(self) -> LeanResponse:
        conn = self._conn = await self._session._send(self._url, self._data, self._headers)
        timeout = self._session.timeout
        self._watchdog = IdleWatch(timeout, conn.take_activity, lambda: conn.timed_out(timeout))
        while not conn.headers_done:
            await conn.wait()
        return LeanResponse(conn)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        conn = self._conn
        if conn is not None:
            self._session._release(conn)


class LeanSession:
    """One host's client: a new connection per request (`fresh_connections`), or idle keep-alive
    connections reused after a complete response; a connection left mid-response is closed."""

    def __init__(self, timeout: float, *, fresh_connections: bool = False) -> None:
        self.timeout = timeout
        self._fresh = fresh_connections
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._open: set[_Connection] = set()

    def post(self, url: str, *, data: bytes, headers: Mapping[str, str]) -> _Post:
        return _Post(self, url, data, headers)

    async def _send(self, url: str, data: bytes, headers: Mapping[str, str]) -> _Connection:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"the lean client speaks plain http only: {url}")
        host, port = parts.hostname, parts.port or 80
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        lines = [f"POST {path} HTTP/1.1", f"host: {parts.netloc}", f"content-length: {len(data)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if self._fresh:
            lines.append("connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        key = (host, port)
        idle = self._idle.get(key)
        conn: _Connection | None = None
        while idle and conn is None:
            conn = idle.pop()
            if conn.transport is None or conn.transport.is_closing():
                conn = None  # the server closed it while it was idle
        if conn is None:
            loop = asyncio.get_running_loop()
            try:
                _, conn = await asyncio.wait_for(
                    loop.create_connection(lambda: _Connection(key), host, port), 30.0
                )
            except asyncio.TimeoutError as exc:
                raise TimeoutError(f"connecting to {host}:{port} took over 30 s") from exc
        assert conn is not None
        self._open.add(conn)
        assert conn.transport is not None
        conn.transport.write(head + data)
        return conn

    def _release(self, conn: _Connection) -> None:
        self._open.discard(conn)
        transport = conn.transport
        if self._fresh or not (conn.complete and conn.keep_alive and conn.error is None):
            if transport is not None:
                transport.close()
            return
        conn.reset()
        self._idle.setdefault(conn.key, []).append(conn)

    async def close(self) -> None:
        for conns in [list(self._open), *self._idle.values()]:
            for conn in conns:
                if conn.transport is not None:
                    conn.transport.close()
        self._open.clear()
        self._idle.clear()
