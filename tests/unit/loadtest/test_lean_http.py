"""The lean load-generator client (`loadtest.lean_http`) records what the aiohttp one records.

Each test runs the real targets with both clients against a server on a local socket: the same
streams (split anywhere, chunked or not), the same error kinds for the same misbehaviour, keep-alive
reuse against a new connection per request.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from loadtest.anthropic_client import AnthropicTarget
from loadtest.metrics import RequestRecord
from loadtest.openai_client import OpenAITarget
from loadtest.workload import Prompt, Workload
from tests.support.http_servers import (
    NOT_FOUND_MESSAGE,
    Handler,
    cut_stream,
    hang_up,
    keep_alive,
    never_answer,
    not_found,
    read_request,
)
from tests.support.waiting import wait_until

CLIENTS = ("aiohttp", "lean")


def _completion_events(n: int) -> list[bytes]:
    events = [f'data: {{"choices": [{{"index": 0, "text": " t{i}"}}]}}\n\n'.encode() for i in range(n)]
    events.append(b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": %d}}\n\n' % n)
    events.append(b"data: [DONE]\n\n")
    return events


def _messages_events(n: int) -> list[bytes]:
    def event(kind: str, data: str) -> bytes:
        return f"event: {kind}\ndata: {data}\n\n".encode()

    out = [event("message_start", '{"message": {"usage": {"input_tokens": 3, "output_tokens": 1}}}')]
    out += [event("content_block_delta", f'{{"delta": {{"text": "t{i}"}}}}') for i in range(n)]
    out += [event("message_delta", f'{{"usage": {{"output_tokens": {n}}}}}'), event("message_stop", "{}")]
    return out


def _streaming(events: list[bytes], *, chunked: bool, split: int) -> Handler:
    """Writes the events as one response, each write `split` bytes (cutting events and chunk frames
    anywhere), with a pause between writes so that the client sees them as separate reads."""
    body = b"".join(events)
    if chunked:
        framed = b"".join(f"{len(e):x}\r\n".encode() + e + b"\r\n" for e in events) + b"0\r\n\r\n"
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    else:
        framed = body
        head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            + b"content-length: %d\r\n\r\n" % len(body)
        )

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await read_request(reader)
                data = head + framed
                for i in range(0, len(data), split):
                    writer.write(data[i : i + split])
                    await writer.drain()
                    await asyncio.sleep(0.001)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return serve


async def _send(
    handler: Handler, client: str, *, messages: bool = False, timeout: float = 5.0
) -> RequestRecord:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        return await _send_to(f"http://127.0.0.1:{port}", client, messages=messages, timeout=timeout)
    finally:
        server.close()


async def _send_to(base: str, client: str, *, messages: bool = False, timeout: float = 5.0) -> RequestRecord:
    workload = Workload(max_tokens=4, include_usage=True)
    target: Any
    if messages:
        target = AnthropicTarget(base, "m", workload, timeout=timeout, client=client)
    else:
        target = OpenAITarget(base + "/v1", "m", workload, timeout=timeout, client=client)
    await target.open(1)
    try:
        return await target.send(Prompt("hi"))
    finally:
        await target.aclose()


def _outcome(record: RequestRecord) -> tuple[Any, ...]:
    return (
        record.error,
        len(record.chunk_times),
        record.output_tokens,
        record.prompt_tokens,
        record.usage_reported,
    )


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
@pytest.mark.parametrize("split", [7, 64, 100_000], ids=lambda n: f"writes-of-{n}")
@pytest.mark.parametrize("messages", [False, True], ids=["completions", "messages"])
async def test_both_clients_record_the_same_stream(chunked: bool, split: int, messages: bool) -> None:
    events = _messages_events(5) if messages else _completion_events(5)
    handler = _streaming(events, chunked=chunked, split=split)
    records = [await _send(handler, client, messages=messages) for client in CLIENTS]
    assert _outcome(records[0]) == _outcome(records[1]) == (None, 5, 5, 3, True)
    for record in records:
        assert record.start <= record.chunk_times[0] <= record.chunk_times[-1] <= record.end


async def _garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b"data: not an HTTP status line\r\n\r\n")
    await writer.drain()
    writer.close()


async def _stall_mid_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 1000\r\n\r\n"
        b'data: {"choices": [{"index": 0, "text": " t0"}]}\n\n'
    )
    await writer.drain()
    await reader.read()
    writer.close()


@pytest.mark.parametrize(
    ("handler", "kind", "tokens"),
    [
        (hang_up, "connection_closed", 0),
        (cut_stream, "connection_closed", 1),
        (_garbage, "connection_closed", 0),
        (never_answer, "timeout", 0),
        (_stall_mid_stream, "timeout", 1),
        (not_found, "http_404", 0),
    ],
    ids=["hang-up", "cut-short", "not-http", "no-answer", "stalled", "404"],
)
@pytest.mark.parametrize("client", CLIENTS)
async def test_failures_land_in_the_same_error_kinds(
    handler: Handler, kind: str, tokens: int, client: str
) -> None:
    record = await _send(handler, client, timeout=0.3)
    assert record.error == kind, record.error_detail
    assert len(record.chunk_times) == tokens  # a token before the failure still counts
    if handler is not_found:
        assert record.error_detail == NOT_FOUND_MESSAGE


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_refused_connection_is_a_connect_error(client: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    record = await _send_to(f"http://127.0.0.1:{port}", client)
    assert record.error == "connect_error", record.error_detail


@pytest.mark.parametrize(("fresh", "expected"), [(False, 1), (True, 5)], ids=["keep-alive", "fresh"])
async def test_keep_alive_reuses_one_connection_and_fresh_opens_one_per_request(
    fresh: bool, expected: int
) -> None:
    accepted: list[bytes] = []  # the latest request's head, per connection
    body = b"".join(_completion_events(2))
    serve = keep_alive(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        + b"content-length: %d\r\n\r\n" % len(body)
        + body,
        accepted,
    )

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    target = OpenAITarget(
        f"http://127.0.0.1:{port}/v1", "m", Workload(max_tokens=2), fresh_connections=fresh, client="lean"
    )
    await target.open(1)
    try:
        records = [await target.send(Prompt("hi")) for _ in range(5)]
    finally:
        await target.aclose()
        server.close()
    assert [r.error for r in records] == [None] * 5
    assert len(accepted) == expected
    assert (b"connection: close" in accepted[-1].lower()) is fresh


async def test_a_kept_alive_connection_the_server_closed_is_not_reused() -> None:
    served = 0
    body = b"".join(_completion_events(1))

    async def serve_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        await read_request(reader)
        served += 1
        # Keep-alive by HTTP/1.1's default, then closed by the server while the client holds it idle.
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve_once, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    target = OpenAITarget(f"http://127.0.0.1:{port}/v1", "m", Workload(max_tokens=1), client="lean")
    await target.open(1)
    try:
        first = await target.send(Prompt("hi"))
        idle = [c for conns in target._session._idle.values() for c in conns]
        assert len(idle) == 1
        await wait_until(lambda: idle[0].transport.is_closing())  # the server's close has arrived
        second = await target.send(Prompt("hi"))
    finally:
        await target.aclose()
        server.close()
    assert (first.error, second.error, served) == (None, None, 2)


def test_an_unknown_client_is_refused() -> None:
    from loadtest.target import http_session

    with pytest.raises(ValueError, match="aiohttp or lean"):
        http_session(1, 1.0, client="curl")


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_stream_longer_than_the_timeout_is_not_cut_while_it_keeps_coming(client: str) -> None:
    events = _completion_events(8)

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        body = b"".join(events)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body))
        for event in events:  # 1 s in all, an event every 0.1 s: each wait well under the 0.3 s timeout
            writer.write(event)
            await writer.drain()
            await asyncio.sleep(0.1)
        writer.close()

    record = await _send(slow, client, timeout=0.3)
    assert _outcome(record) == (None, 8, 8, 3, True)
