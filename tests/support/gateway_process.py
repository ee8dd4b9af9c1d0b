"""The gateway as users run it: `gateway serve` in a subprocess on a free port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GatewayProcess:
    def __init__(self, args: Sequence[str], *, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tempfile.mkstemp(prefix="gateway-", suffix=".log")[1])
        self._args = [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *args,
        ]
        self._env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, wait: str = "/health/ready", timeout: float = 120.0) -> GatewayProcess:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(self._args, stdout=log, stderr=subprocess.STDOUT, env=self._env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited ({self.process.returncode}):\n{self.log_text()}")
            try:
                if httpx.get(self.base_url + wait, timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        # A `with` block whose start fails never reaches __exit__: stop it here, or it outlives the test.
        self.stop()
        raise RuntimeError(f"gateway not ready within {timeout} s:\n{self.log_text()}")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-5000:]

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
