"""How the load generator connects (keep-alive, or a new connection per request, as many clients do)
and how bench-host counts the connections each worker holds."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from loadtest import procstat
from loadtest.target import http_session
from tests.support.http_servers import keep_alive


def test_connections_counts_the_established_connections_each_process_holds_on_a_port() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        accepted = [listener.accept()[0] for _ in range(3)]
        try:
            # The accepted ends have the port as their local one; the clients' ends do not count.
            assert procstat.connections([os.getpid()], port) == (3,)
            assert procstat.connections([os.getpid()], port + 1 if port < 65535 else 1) == (0,)
            accepted.pop().close()
            clients.pop().close()
            assert procstat.connections([os.getpid(), 2**22 + 1], port) == (2, 0)  # a gone pid: 0
        finally:
            for s in clients + accepted:
                s.close()


async def _count_connections(fresh: bool, requests: int) -> int:
    heads: list[bytes] = []
    serve = keep_alive(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", heads)
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with http_session(4, 30.0, fresh_connections=fresh) as session:
            for _ in range(requests):
                async with session.get(f"http://127.0.0.1:{port}/") as resp:
                    assert await resp.read() == b"ok"
    finally:
        server.close()
        await server.wait_closed()
    return len(heads)  # one per connection accepted


@pytest.mark.parametrize(("fresh", "expected"), [(False, 1), (True, 5)])
def test_keep_alive_reuses_one_connection_and_fresh_opens_one_per_request(fresh: bool, expected: int) -> None:
    assert asyncio.run(_count_connections(fresh, 5)) == expected
