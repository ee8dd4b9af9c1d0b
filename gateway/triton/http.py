"""One Triton HTTP endpoint's generate extension: `POST /v2/models/<model>/generate_stream` (SSE).

The cheaper transport for generation: reading a streamed token over HTTP/1.1 (one SSE event, one
orjson parse) costs the gateway about a third of the CPU of a `ModelStreamInfer` message through
grpc.aio, whose per-message machinery alone (completion queue, poller thread, Cython call
objects) costs more than the whole HTTP read; `make bench` and the README give the figures.

Cancellation: closing a response closes its connection (a connection is reused only after a
complete response), and Triton cancels the request when it next writes to it, one engine step
later. On the ensemble route the adapter also sends the engine a `stop` request over gRPC, as it
does for a cancelled gRPC call: Triton passes neither on to an ensemble's composing models.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import aiohttp
import orjson

_SEPARATOR = b"\n\n"
_DATA = b"data: "


class HttpStatusError(Exception):
    """Triton refused the request before streaming: its status and its `{"error": ...}` message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class StreamError(Exception):
    """An `{"error": ...}` event inside the stream."""


class TritonHttp:
    def __init__(self, url: str, *, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        # Made inside the running loop, on first use (a session belongs to the loop it was made on).
        if self._session is None:
            self._session = aiohttp.ClientSession(
                # No pool limit: each open stream holds a connection, as each holds a gRPC call.
                connector=aiohttp.TCPConnector(limit=0, enable_cleanup_closed=False),
                timeout=aiohttp.ClientTimeout(total=None, connect=self.timeout_s),
                # Triton's events are small and come one per engine step: nothing to decompress.
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def generate_stream(
        self, model: str, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The stream's events as JSON objects, until Triton ends the response (its final response).
        Leaving the iteration early closes the connection, which cancels the request in Triton."""
        send_headers = {"Content-Type": "application/json"}
        if headers:
            send_headers.update(headers)
        response = await self.session.post(
            f"{self.url}/v2/models/{model}/generate_stream",
            data=orjson.dumps(body),
            headers=send_headers,
        )
        complete = False
        try:
            if response.status != 200:
                raise HttpStatusError(response.status, _error_message(await response.read()))
            buffer = b""
            content = response.content
            while True:
                chunk = await content.readany()
                if not chunk:
                    break
                buffer = buffer + chunk if buffer else chunk
                start = 0
                while (end := buffer.find(_SEPARATOR, start)) >= 0:
                    if start:
                        # Several events in one read: the gateway is behind Triton. Let the
                        # other streams (and a client's disconnect) run between them, as a gRPC
                        # read does between messages; otherwise a cancelled stream works through
                        # its whole buffered backlog first, and so does every other stream.
                        await asyncio.sleep(0)
                    event = buffer[start:end]
                    start = end + 2
                    # One `data:` line per event (Triton writes no other field, and no comments).
                    if event.startswith(_DATA):
                        obj = orjson.loads(event[6:])
                        if "error" in obj:
                            raise StreamError(str(obj["error"]))
                        yield obj
                buffer = buffer[start:]
            if buffer.strip():
                raise aiohttp.ClientPayloadError("Triton's stream ended inside an event")
            complete = True
        finally:
            if complete:
                response.release()
            else:
                # An unfinished response must not go back to the pool: closing its connection is
                # what tells Triton the client is gone.
                response.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


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
    return isinstance(exc, aiohttp.ClientConnectorError)
