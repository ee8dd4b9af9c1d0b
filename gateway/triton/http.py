"""One Triton HTTP endpoint's generate extension: `POST /v2/models/<model>/generate_stream` (SSE).

The cheaper transport for generation: reading a streamed token over HTTP/1.1 (one SSE event, one
orjson parse) costs the gateway about a third of the CPU of a `ModelStreamInfer` message through
grpc.aio, whose per-message machinery alone (completion queue, poller thread, Cython call
objects) costs more than the whole HTTP read; `make bench` and docs/bench/ give the figures.

The client is an asyncio protocol over httptools' parser (the one uvicorn serves with), not
aiohttp: a streamed token is one read of a few hundred bytes, and aiohttp's general reader pays
per read for its payload stream, a new future, a timer context (`asyncio.current_task`, and on
Python 3.11 a `getpid` system call) and several coroutine frames. At a few streams per worker
every token is its own read, so that cost was paid per token (docs/bench/lowload-2026-11-25.md).

Cancellation: closing a response closes its connection (a connection is reused only after a
complete response), and Triton cancels the request when it next writes to it, one engine step
later. On the ensemble route the adapter also sends the engine a `stop` request over gRPC, as it
does for a cancelled gRPC call: Triton passes neither on to an ensemble's composing models.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncGenerator, Mapping
from typing import Any, cast
from urllib.parse import quote, urlsplit

import httptools
import orjson

from gateway.asyncutil import IdleWatch

_SEPARATOR = b"\n\n"
_DATA = b"data: "
# Events buffered unread before the connection stops reading (Triton then waits on the socket,
# as it would behind a slow gRPC reader); reading resumes once the reader has caught up.
_PAUSE_AT = 512


class HttpStatusError(Exception):
    """Triton refused the request before streaming: its status and its `{"error": ...}` message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class StreamError(Exception):
    """An `{"error": ...}` event inside the stream."""


class TransportError(Exception):
    """The connection to Triton failed or broke (a malformed or unfinished response included)."""


class ConnectFailure(TransportError):
    """The endpoint could not be reached at all: another endpoint may serve the request."""


class _Response(asyncio.Protocol):
    """One keep-alive connection and the response being read on it: httptools calls `on_*` from
    `feed_data`, the body's SSE events are queued whole, and the one reader waiting is woken."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.events: deque[bytes] = deque()
        self.partial = b""
        self.status = 0
        self.error_body: list[bytes] = []
        self.complete = False
        self.keep_alive = False
        self.lost = False
        self.received = False  # any byte of the current response
        self.active = False  # a read since the stream's IdleWatch last looked
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False

    # ---- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.received = self.active = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = TransportError(f"Triton sent a malformed response ({exc})")
            if self.transport is not None:
                self.transport.close()
        if len(self.events) >= _PAUSE_AT and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.complete and self.error is None:
            reason = f" ({exc})" if exc is not None else ""
            self.error = TransportError(f"Triton closed the connection before the response ended{reason}")
        self._wake()

    # ---- httptools callbacks

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self.status != 200:
            self.error_body.append(body)
            return
        buffer = self.partial + body if self.partial else body
        start = 0
        while (end := buffer.find(_SEPARATOR, start)) >= 0:
            self.events.append(buffer[start:end])
            start = end + 2
        self.partial = buffer[start:] if start else buffer

    def on_message_complete(self) -> None:
        self.complete = True
        # Read now: the parser forgets the message's headers once it has ended.
        self.keep_alive = self._parser.should_keep_alive()

    # ---- the reader's side

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self) -> None:
        """Until something new: data, the response's end, or the connection's."""
        if self._paused:
            self._paused = False
            assert self.transport is not None
            self.transport.resume_reading()
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def take_activity(self) -> bool:
        """Whether a read came since the last call (for an IdleWatch)."""
        active, self.active = self.active, False
        return active

    def stalled(self, idle_s: float) -> None:
        """Nothing came for `idle_s`: the stream fails, and closing its connection (an unfinished
        response) cancels the request in Triton."""
        if self.complete or self.error is not None or self.lost:
            return
        self.error = TransportError(f"Triton sent nothing on the stream for {idle_s:g} s")
        self.close()
        self._wake()

    def start(self, request: bytes) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.events.clear()
        self.partial = b""
        self.status = 0
        self.error_body = []
        self.complete = False
        self.keep_alive = False
        self.received = False
        assert self.transport is not None
        self.transport.write(request)

    @property
    def reusable(self) -> bool:
        return (
            self.complete
            and not self.lost
            and self.error is None
            and self.keep_alive
            and self.transport is not None
            and not self.transport.is_closing()
        )

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class TritonHttp:
    def __init__(self, url: str, *, timeout_s: float, stream_idle_s: float | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        # A started stream that sends nothing for this long fails (None: waits as long as it takes).
        # Triton's HTTP frontend can lose a stream's end under load (docs/triton/transports.md),
        # and then the stream would never finish.
        self.stream_idle_s = stream_idle_s
        parts = urlsplit(self.url)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if parts.scheme == "https" else None
        self._host_header = parts.netloc.encode("latin-1")
        # Connections whose last response ended: reused newest first. No pool limit: each open
        # stream holds a connection, as each holds a gRPC call.
        self._idle: list[_Response] = []

    async def _connect(self) -> _Response:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeout_s):
                _, protocol = await loop.create_connection(
                    lambda: _Response(loop),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )
        except OSError as exc:
            raise ConnectFailure(f"Cannot connect to {self.url} ({exc})") from None
        return protocol

    def _request(self, model: str, body: bytes, headers: Mapping[str, str] | None) -> bytes:
        lines = [
            b"POST /v2/models/%s/generate_stream HTTP/1.1" % quote(model, safe="").encode(),
            b"Host: " + self._host_header,
            b"Content-Type: application/json",
            b"Content-Length: %d" % len(body),
        ]
        for name, value in (headers or {}).items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
                raise ValueError(f"header {name!r} cannot be sent")
            lines.append(f"{name}: {value}".encode("latin-1"))
        return b"\r\n".join(lines) + b"\r\n\r\n" + body

    async def _open(self, request: bytes) -> _Response:
        """A connection with the request sent and the response's status read. An idle connection
        that Triton closed meanwhile (nothing of the response came) is replaced by a new one."""
        while self._idle:
            conn = self._idle.pop()
            if conn.lost or conn.transport is None or conn.transport.is_closing():
                continue
            await self._send(conn, request)
            if conn.status or conn.received:
                return conn
            conn.close()
        conn = await self._connect()
        await self._send(conn, request)
        return conn

    @staticmethod
    async def _send(conn: _Response, request: bytes) -> None:
        """The request on `conn`, then until its response's status (or the connection's end)."""
        conn.start(request)
        while not conn.status and not conn.lost and conn.error is None:
            await conn.wait()

    async def generate_stream(
        self, model: str, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The stream's events as JSON objects, until Triton ends the response (its final response).
        Leaving the iteration early closes the connection, which cancels the request in Triton."""
        # OPT_SERIALIZE_NUMPY: a long prompt's ids are one int32 array (text.ids).
        request = self._request(model, orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), headers)
        conn: _Response | None = None
        watchdog: IdleWatch | None = None
        reusable = False
        try:
            conn = await self._open(request)
            if not conn.status:
                raise conn.error or TransportError("Triton closed the connection")
            if conn.status != 200:
                while not conn.complete and conn.error is None:
                    await conn.wait()
                if conn.error is not None:
                    raise conn.error
                raise HttpStatusError(conn.status, _error_message(b"".join(conn.error_body)))
            events = conn.events
            if idle_s := self.stream_idle_s:
                watchdog = IdleWatch(idle_s, conn.take_activity, lambda: conn.stalled(idle_s))
            while True:
                if events:
                    # What came since the last look, as aiohttp's readany() gave it.
                    batch = list(events) if len(events) > 1 else [events[0]]
                    events.clear()
                    first = True
                    for event in batch:
                        if not first:
                            # Several events at once: the gateway is behind Triton. Let the
                            # other streams (and a client's disconnect) run between them, as a
                            # gRPC read does between messages; otherwise a cancelled stream
                            # works through its whole buffered backlog first, and so does every
                            # other stream.
                            await asyncio.sleep(0)
                        first = False
                        # One `data:` line per event (Triton writes no other field, and no comments).
                        if event.startswith(_DATA):
                            obj = orjson.loads(event[6:])
                            if "error" in obj:
                                raise StreamError(str(obj["error"]))
                            yield obj
                    continue
                if conn.complete:
                    break
                if conn.error is not None:
                    raise conn.error
                await conn.wait()
            if conn.partial.strip():
                raise TransportError("Triton's stream ended inside an event")
            reusable = conn.reusable
        finally:
            if watchdog is not None:
                watchdog.cancel()
            if conn is not None:
                if reusable:
                    self._idle.append(conn)
                else:
                    # An unfinished response must not be reused: closing its connection is what
                    # tells Triton the client is gone.
                    conn.close()

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _error_message(body: bytes) -> str:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace").strip() or "no message"
    if isinstance(obj, dict) and "error" in obj:
        return str(obj["error"])
    return body.decode("utf-8", "replace").strip()


def is_connection_failure(exc: BaseException) -> bool:
    """The endpoint could not be reached at all: another endpoint may serve the request."""
    return isinstance(exc, ConnectFailure)
