"""Subprocess plumbing for the benchmark: free ports, readiness polls, clean stops."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from http.client import HTTPException
from pathlib import Path
from typing import Any

# The servers polled are the ones this process started, on this host: never through a proxy.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class NotReady(RuntimeError):
    """A server did not come up; the message carries the tail of its log."""


def serve_command(
    port: int,
    grpc_url: str,
    spec: str,
    *,
    http_url: str | None = None,
    workers: int = 1,
    extra: Sequence[str] = (),
) -> list[str]:
    """The documented `gateway serve` command line for one model (`spec`, as `--model` takes it)
    on one Triton, its streams over Triton's HTTP generate_stream when `http_url` is given."""
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--triton-url", grpc_url, "--model", spec]
    if http_url is not None:
        cmd += ["--triton-http-url", http_url]
    if workers > 1:
        cmd += ["--workers", str(workers)]
    return cmd + list(extra)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def wait_http_ready(
    proc: subprocess.Popen[bytes],
    url: str,
    timeout: float,
    log_path: Path,
    *,
    headers: dict[str, str] | None = None,
) -> None:
    """Poll url until it answers 200; fail early, with the log's tail, if the process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise NotReady(f"exited with {proc.returncode}: {log_tail(log_path)}")
        # A non-200 answer (HTTPError), a refused or dropped connection, a timeout: not ready yet.
        with (
            contextlib.suppress(OSError, HTTPException),
            _NO_PROXY.open(urllib.request.Request(url, headers=headers or {}), timeout=2.0) as resp,
        ):
            if resp.status == 200:
                return
        time.sleep(0.2)
    raise NotReady(f"not ready after {timeout:.0f}s: {log_tail(log_path)}")


def stop_process(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGTERM the process group we started (server plus its workers), SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def spawn_logged(
    cmd: list[str], log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start cmd in its own process group (so stop_process reaches its workers), output to log_path."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log_file:
        # The child holds its own copy of the descriptor; ours can close right away.
        return subprocess.Popen(
            cmd, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )


def bench_setup() -> None:
    """What every benchmark's `main` starts with: timestamped INFO logs, and no reach for the hub
    (the tiny models are built locally; anything fetching at run time would fail offline)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def given_args(args: argparse.Namespace, *dests: str, **renamed: str) -> dict[str, Any]:
    """The config fields the command line set, for `dataclasses.replace` over the config's
    defaults: each option in `dests` sets the field of its name, each in `renamed` (dest=field) that
    field; an option left out (None) sets nothing."""
    fields = {**{dest: dest for dest in dests}, **renamed}
    return {field: getattr(args, dest) for dest, field in fields.items() if getattr(args, dest) is not None}


def results_dir(out_dir: str | None, kind: str) -> Path:
    """Where a benchmark writes (`--out`, or results/KIND-<timestamp>), with its work/ made."""
    out = Path(out_dir or f"results/{kind}-{time.strftime('%Y%m%d-%H%M%S')}")
    (out / "work").mkdir(parents=True, exist_ok=True)
    return out


def split_args(values: Sequence[str]) -> tuple[str, ...]:
    """Repeated `--gateway-arg` values, each possibly several space-separated arguments, as one list."""
    return tuple(a for value in values for a in value.split())
