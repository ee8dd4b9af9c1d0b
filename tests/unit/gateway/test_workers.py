"""The worker pool: one SO_REUSEPORT socket per worker, connections spread over every worker, graceful
stop, a dead worker replaced on its own socket."""

from __future__ import annotations

import collections
import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from gateway.workers import reuseport_sockets
from tests.support.gateway_process import free_port


def test_reuseport_sockets_share_one_port_and_each_listens() -> None:
    sockets = reuseport_sockets("127.0.0.1", 0, 3, 16)
    try:
        ports = {s.getsockname()[1] for s in sockets}
        assert len(ports) == 1 and ports != {0}
        assert all(s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) for s in sockets)
        # Each socket is a listener of its own: a connection lands on exactly one of them.
        with socket.create_connection(("127.0.0.1", ports.pop()), timeout=5):
            for s in sockets:
                s.setblocking(False)
            accepted = []
            deadline = time.monotonic() + 5
            while not accepted and time.monotonic() < deadline:
                for s in sockets:
                    with contextlib.suppress(BlockingIOError):
                        accepted.append(s.accept()[0])
            assert len(accepted) == 1
            accepted[0].close()
    finally:
        for s in sockets:
            s.close()


def test_reuseport_sockets_refuse_a_port_held_without_reuseport() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        with pytest.raises(OSError):
            reuseport_sockets("127.0.0.1", holder.getsockname()[1], 2, 16)


def _get(port: int, path: str = "/", timeout: float = 30.0) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        assert response.status == 200
        return int(response.read())
    finally:
        conn.close()


def _wait_serving(proc: subprocess.Popen[bytes], port: int, workers: int) -> None:
    """Until every worker has answered at least once (each new connection is hashed anew)."""
    seen: set[int] = set()
    deadline = time.monotonic() + 60
    while len(seen) < workers:
        assert proc.poll() is None, "the pool exited"
        assert time.monotonic() < deadline, f"only {len(seen)} of {workers} workers answered"
        try:
            seen.add(_get(port, timeout=5))
        except (OSError, http.client.HTTPException):
            time.sleep(0.05)


@pytest.fixture
def pool() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.pid_app", str(port), "4"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        _wait_serving(proc, port, 4)
        yield proc, port
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert proc.stderr is not None
        proc.stderr.close()


def test_new_connections_are_spread_over_every_worker(pool: tuple[subprocess.Popen[bytes], int]) -> None:
    _, port = pool
    served = collections.Counter(_get(port) for _ in range(400))
    assert len(served) == 4
    # The kernel hashes each connection's addresses: 100 expected per worker, a binomial spread of
    # about +-9 (one shared accepting socket gives a burst to one worker; here none gets twice its share).
    assert max(served.values()) < 150 and min(served.values()) > 50, served


def test_a_stop_signal_lets_requests_in_flight_finish(pool: tuple[subprocess.Popen[bytes], int]) -> None:
    proc, port = pool
    started = []
    for _ in range(8):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/slow?s=1.5")
        started.append((conn, conn.getresponse()))  # the head: the request is in a worker
    proc.send_signal(signal.SIGTERM)
    for conn, response in started:
        assert response.status == 200 and int(response.read()) > 0
        conn.close()
    assert proc.wait(30) == 0
    with pytest.raises(OSError):
        _get(port, timeout=2)


def test_a_killed_worker_is_replaced_and_serves_again(pool: tuple[subprocess.Popen[bytes], int]) -> None:
    proc, port = pool
    victim = _get(port)
    os.kill(victim, signal.SIGKILL)
    seen: set[int] = set()
    deadline = time.monotonic() + 60
    # The replacement takes over the dead worker's socket: every connection is answered, and four
    # distinct live workers answer again.
    while len(seen - {victim}) < 4:
        assert time.monotonic() < deadline, seen
        try:
            seen.add(_get(port, timeout=5))
        except (OSError, http.client.HTTPException):
            time.sleep(0.05)
    assert proc.poll() is None
