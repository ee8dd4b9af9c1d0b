"""--keep-alive-requests: a client connection is closed after that many requests on it, so clients
reconnect and SO_REUSEPORT hashes them over the workers anew."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from gateway.http.middleware import ConnectionRequestLimit


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _call(app: ConnectionRequestLimit, client: tuple[str, int]) -> list[tuple[bytes, bytes]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "client": client, "server": ("127.0.0.1", 9000), "headers": []}
    asyncio.run(app(scope, receive, send))
    return list(sent[0]["headers"])


def test_the_nth_response_on_a_connection_says_close_and_the_count_starts_again() -> None:
    app = ConnectionRequestLimit(_ok, max_requests=3)
    a, b = ("10.0.0.1", 5000), ("10.0.0.1", 5001)
    assert (b"connection", b"close") not in _call(app, a) + _call(app, a) + _call(app, b)
    assert _call(app, a)[-1] == (b"connection", b"close")
    # Its port reused by a new connection: counted from one again.
    assert (b"connection", b"close") not in _call(app, a)
    assert (b"connection", b"close") not in _call(app, b)
    assert _call(app, b)[-1] == (b"connection", b"close")


def test_the_table_of_connections_is_bounded() -> None:
    app = ConnectionRequestLimit(_ok, max_requests=2, table_size=4)
    for port in range(10):
        _call(app, ("10.0.0.1", port))
    assert len(app._served) == 4


@pytest.fixture
def server() -> Iterator[int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(ConnectionRequestLimit(_ok, max_requests=2), port=port, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    started = threading.Event()
    while not started.wait(0.05):
        if srv.started:
            started.set()
        assert thread.is_alive()
    try:
        yield port
    finally:
        srv.should_exit = True
        thread.join(10)


def _response(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\r\n\r\nok"):
        chunk = sock.recv(4096)
        assert chunk, data
        data += chunk
    return data


def test_uvicorn_closes_the_connection_after_the_limit(server: int) -> None:
    request = b"GET / HTTP/1.1\r\nhost: localhost\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server), timeout=10) as sock:
        sock.sendall(request)
        assert b"connection: close" not in _response(sock).lower()
        sock.sendall(request)
        assert b"connection: close" in _response(sock).lower()
        # Then the server closes its end: end-of-file, not a timeout.
        assert sock.recv(1) == b""
