"""A cheap stand-in for Triton's HTTP `generate_stream` of the synthetic `tensorrt_llm` model, for
measuring the gateway's own CPU per token where the CPU Triton would take the machine's cores.

Every step (5 ms by default) each open stream gets one token event, written as one batched engine
step writes them, until its `request_output_len`; the events and the framing (chunked SSE) are
byte for byte what the CPU Triton writes for the engine route. Only generate_stream is served: the
gateway still reads the model's config from the real Triton over gRPC.

    python -m loadtest.fake_triton_http PORT [STEP_MS]
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, cast

import httptools
import orjson

HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"
)
EVENT = (
    b'data: {"id":"%s","model_name":"tensorrt_llm","model_version":"1",'
    b'"output_ids":%d,"sequence_length":1}\n\n'
)


class _Connection(asyncio.Protocol):
    def __init__(self, engine: FakeEngine) -> None:
        self._engine = engine
        self._parser = httptools.HttpRequestParser(self)
        self._body: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_message_begin(self) -> None:
        self._body = []

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        request: dict[str, Any] = orjson.loads(b"".join(self._body))
        n = request.get("request_output_len", 16)
        n = n[0] if isinstance(n, list) else n
        assert self.transport is not None
        self.transport.write(HEAD)
        self._engine.streams[self] = [str(request.get("id", "0")).encode(), int(n), 0]

    def connection_lost(self, exc: Exception | None) -> None:
        self._engine.streams.pop(self, None)


class FakeEngine:
    """The open streams and the step timer that writes each of them its next token."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.streams: dict[_Connection, list[Any]] = {}
        self._next = 0.0

    def _step(self) -> None:
        loop = asyncio.get_running_loop()
        finished = []
        for conn, stream in self.streams.items():
            request_id, n, i = stream
            i += 1
            stream[2] = i
            event = EVENT % (request_id, 100 + (i * 37) % 3000)
            out = b"%x\r\n%s\r\n" % (len(event), event)
            if i >= n:
                out += b"0\r\n\r\n"
                finished.append(conn)
            assert conn.transport is not None
            conn.transport.write(out)
        for conn in finished:
            self.streams.pop(conn, None)
        self._next += self.step_s
        loop.call_at(max(self._next, loop.time()), self._step)

    async def serve(self, port: int, started: asyncio.Future[int] | None = None) -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Connection(self), "127.0.0.1", port)
        self._next = loop.time() + self.step_s
        loop.call_at(self._next, self._step)
        bound = int(server.sockets[0].getsockname()[1])
        if started is not None:
            started.set_result(bound)
        else:
            print(f"listening on {bound}", flush=True)
        async with server:
            await server.serve_forever()


def main() -> None:
    import uvloop

    port = int(sys.argv[1])
    step_ms = float(sys.argv[2]) if len(sys.argv) > 2 else 5.0
    uvloop.run(FakeEngine(step_ms / 1000).serve(port))


if __name__ == "__main__":
    main()
