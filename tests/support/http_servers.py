"""Misbehaving HTTP servers for the load generator's client tests: each an `asyncio.start_server`
handler that reads one request and then answers in its own wrong (or plainly erroneous) way."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request, its body read past; returns its head (request line and headers)."""
    head = await reader.readuntil(b"\r\n\r\n")
    fields = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:] if line)
    await reader.readexactly(int(fields.get(b"content-length", b"0")))
    return head


async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.close()


async def cut_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One token of a chunked stream, then the connection closes without the last chunk."""
    await read_request(reader)
    event = b'data: {"choices": [{"index": 0, "text": " t0"}]}\n\n'
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        + f"{len(event):x}\r\n".encode()
        + event
        + b"\r\n"
    )
    await writer.drain()
    writer.close()


async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    await reader.read()  # silent until the client gives up and closes
    writer.close()


NOT_FOUND_MESSAGE = "The model `m` does not exist."


async def not_found(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    body = b'{"error": {"message": "%s", "type": "invalid_request_error"}}' % NOT_FOUND_MESSAGE.encode()
    writer.write(
        b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    writer.close()


def keep_alive(response: bytes, heads: list[bytes]) -> Handler:
    """A well-behaved server: answers every request on a connection with `response` until the client
    closes it; `heads` gets an entry per connection, the head of its latest request."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = len(heads)
        heads.append(b"")
        try:
            while True:
                heads[index] = await read_request(reader)
                writer.write(response)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return serve
