"""The gateway as users run it: `gateway serve` in a subprocess on a free port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from deploy.devstack import DevRepository, TritonServer, prepare_dev_repository
from tests.support import http_client

# The Triton models `gateway dev --engine` serves: the C++ repository, and a CPU stand-in of
# TensorRT-LLM's llmapi model (agent tests run over both).
DEV_ENGINES = ("cpp", "llmapi")


def piped_env() -> dict[str, str]:
    """This process's environment without a terminal's size: what a command whose output goes to a
    pipe or a log collector sees. Under pytest-xdist a worker's environment says COLUMNS=80, and a
    readline import under pytest sets it in the C environment too."""
    return {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GatewayProcess:
    """`gateway serve ARGS`, or with command="dev" the whole dev stack as `make run` starts it."""

    def __init__(
        self, args: Sequence[str], *, env: dict[str, str] | None = None, command: str = "serve"
    ) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tempfile.mkstemp(prefix="gateway-", suffix=".log")[1])
        self._args = [
            sys.executable,
            "-m",
            "gateway.cli",
            command,
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
                if http_client.get(self.base_url + wait, timeout=1.0).status_code == 200:
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


@contextmanager
def agent_gateway(
    root: Path, model_options: str, args: Sequence[str] = (), *, ready_timeout: float = 600
) -> Iterator[tuple[GatewayProcess, DevRepository]]:
    """The agent tiny model (64k context, `<think>` tokens: what agent clients' prompts need) on a
    CPU Triton of its own, served by a gateway as model ``tiny``; `model_options` is the rest of its
    ``--model`` spec, `args` more gateway flags. The default wait is generous: the CPU Triton loads
    its torch model slowly on a loaded machine."""
    repo = prepare_dev_repository(root / "repo", tokenizer_kind="agent")
    server = TritonServer([repo.path], work_dir=root / "server")
    server.start()
    try:
        server.wait_ready(ready_timeout)
        spec = f"name=tiny,tokenizer={repo.model_dir},triton_model={repo.ensemble},{model_options}"
        with GatewayProcess(["--triton-url", server.grpc_url, "--model", spec, *args]) as process:
            yield process, repo
    finally:
        server.stop()
