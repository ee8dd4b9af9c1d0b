"""The HTTP targets' aiohttp failures land in the shared error kinds (`loadtest.target.error_kind`).

Both the exception classes on their own and the exceptions aiohttp really raises against a misbehaving
server on a local socket: refusing, hanging up, cutting a stream short, never answering.
"""

import asyncio
import json
import socket
import warnings

import aiohttp
import pytest

from loadtest.openai_client import OpenAITarget
from loadtest.target import error_kind, http_session
from loadtest.workload import Prompt, Workload
from tests.support.http_servers import cut_stream, hang_up, never_answer, not_found


class _RpcError(Exception):
    def code(self):
        class _Status:
            name = "UNAVAILABLE"

        return _Status()


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (asyncio.TimeoutError(), "timeout"),
        (TimeoutError(), "timeout"),
        (aiohttp.ServerTimeoutError("read"), "timeout"),
        (aiohttp.ConnectionTimeoutError("connect"), "timeout"),
        (aiohttp.SocketTimeoutError("sock read"), "timeout"),
        (ConnectionRefusedError(111, "Connection refused"), "connect_error"),
        (aiohttp.ServerDisconnectedError(), "connection_closed"),
        (aiohttp.ClientPayloadError("Response payload is not completed"), "connection_closed"),
        (aiohttp.ClientConnectionResetError("Cannot write to closing transport"), "connection_closed"),
        (aiohttp.ClientOSError(104, "Connection reset by peer"), "connection_closed"),
        (aiohttp.ClientConnectionError("Connection closed"), "connection_closed"),
        (ConnectionResetError(104, "Connection reset by peer"), "connection_closed"),
        (aiohttp.ClientResponseError(None, (), status=400, message="bad status line"), "connection_closed"),
        (_RpcError(), "grpc_unavailable"),
        (json.JSONDecodeError("Expecting value", "x", 0), "bad_json"),
        (ValueError("other"), "ValueError"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else v,
)
def test_error_kind_classifies_aiohttp_exceptions(exc, kind):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecated aiohttp attribute is read on the way
        assert error_kind(exc) == kind


async def test_session_pool_and_timeouts():
    session = http_session(7, 12.0)
    try:
        connector = session.connector
        assert connector is not None
        assert (connector.limit, connector.limit_per_host) == (7, 7)
        assert not connector.force_close  # keep-alive
        assert session.auto_decompress is False
        assert session.headers["accept-encoding"] == "identity"
        # Per wait (a read, a pooled connection), like the former client's read/pool timeouts.
        assert session.timeout == aiohttp.ClientTimeout(
            total=None, connect=12.0, sock_connect=30.0, sock_read=12.0
        )
    finally:
        await session.close()


async def _send_one(url: str, timeout: float = 5.0):
    target = OpenAITarget(url, "m", Workload(max_tokens=4), timeout=timeout)
    await target.open(1)
    try:
        return await target.send(Prompt("hi"))
    finally:
        await target.aclose()


@pytest.mark.parametrize(
    ("handler", "raised", "kind"),
    [
        (hang_up, "ServerDisconnectedError", "connection_closed"),
        (cut_stream, "ClientPayloadError", "connection_closed"),
        (never_answer, "SocketTimeoutError", "timeout"),
    ],
    ids=["server-disconnected", "stream-cut-short", "no-answer"],
)
async def test_real_aiohttp_failures_are_counted_by_kind(handler, raised, kind):
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        record = await _send_one(f"http://127.0.0.1:{port}/v1", timeout=0.3)
    finally:
        server.close()
    assert record.error == kind, record.error_detail
    assert (record.error_detail or "").startswith(raised)
    if handler is cut_stream:
        assert len(record.chunk_times) == 1  # the token before the cut still counts


async def test_refused_connection_is_connect_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    record = await _send_one(f"http://127.0.0.1:{port}/v1")
    assert record.error == "connect_error", record.error_detail
    assert "ClientConnectorError" in (record.error_detail or "")


async def test_an_http_error_is_reported_with_the_servers_own_message():
    from loadtest.cli import error_lines
    from loadtest.metrics import summarize

    server = await asyncio.start_server(not_found, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        record = await _send_one(f"http://127.0.0.1:{port}/v1")
    finally:
        server.close()
    assert (record.error, record.error_detail) == ("http_404", "The model `m` does not exist.")
    summary = summarize([record, record], label="c=1", mode="concurrency", load=1.0)
    assert error_lines([summary]) == ["c=1: http_404 x2: The model `m` does not exist."]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"error": {"message": "m1"}}', "m1"),
        (b'{"type": "error", "error": {"type": "not_found_error", "message": "m2"}}', "m2"),
        (b'{"detail": "Not Found"}', "Not Found"),
        (b'{"error": "plain"}', "plain"),
        (b"<html>bad gateway</html>", "<html>bad gateway</html>"),
    ],
)
def test_server_messages_are_read_from_the_usual_error_shapes(body: bytes, message: str) -> None:
    from loadtest.target import server_message

    assert server_message(body) == message


def test_run_help_shows_defaults_and_duration_lifts_the_request_cap() -> None:
    import sys

    from loadtest.cli import DEFAULT_REQUESTS, build_parser, request_limit

    run = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    text = " ".join(run.format_help().split())
    assert "(default: 128)" in text and "(default: 300.0)" in text  # --max-tokens, --timeout
    assert f"none given: {DEFAULT_REQUESTS}, or no limit with --duration" in text
    assert request_limit(None, 3.0) == sys.maxsize
    assert request_limit(None, None) == DEFAULT_REQUESTS
    assert request_limit(5, 3.0) == 5


async def test_the_responses_endpoint_is_timed_by_its_text_deltas_and_counted_by_its_usage():
    from gateway.apis.responses.protocol import Response
    from gateway.apis.responses.stream import ResponseBuilder

    builder = ResponseBuilder(
        Response(id="resp_1", created_at=1, status="in_progress", model="m").model_dump(mode="json"),
        streaming=True,
    )
    usage = {
        "input_tokens": 2,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 5,
    }
    frames = (
        builder.start() + builder.text("a") + builder.text("b") + builder.text("c") + builder.finish(usage)
    )
    bodies: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        fields = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:] if line)
        bodies.append(head.split(b" ")[1] + b" " + await reader.readexactly(int(fields[b"content-length"])))
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            + f"content-length: {len(frames)}\r\n\r\n".encode()
            + frames
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    target = OpenAITarget(f"http://127.0.0.1:{port}/v1", "m", Workload(max_tokens=16, endpoint="responses"))
    await target.open(1)
    try:
        record = await target.send(Prompt("hi"))
    finally:
        await target.aclose()
        server.close()
    assert record.error is None, record.error_detail
    assert len(record.chunk_times) == 3 and record.output_tokens == 3 and record.prompt_tokens == 2
    path, body = bodies[0].split(b" ", 1)
    assert path == b"/v1/responses"
    assert json.loads(body) == {
        "model": "m",
        "input": [{"role": "user", "content": "hi"}],
        "max_output_tokens": 16,
        "store": False,
        "stream": True,
    }
