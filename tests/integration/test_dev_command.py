"""`gateway dev` as `make run` starts it: one ready line, only once the gateway serves (Triton's
start is said in words that cannot be mistaken for it), naming the tokenizer directory; the
commands it prints run as printed; --tool-parser reaches the served model."""

from __future__ import annotations

import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support import http_client
from tests.support.gateway_process import free_port

STARTUP_TIMEOUT_S = 300.0
READY_WORD = re.compile(r"\bready\b", re.IGNORECASE)


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    parents = [pid]
    while parents:
        listed = subprocess.run(["pgrep", "-P", ",".join(map(str, parents))], capture_output=True, text=True)
        parents = [int(p) for p in listed.stdout.split()]
        found += parents
    return found


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")


def test_gateway_dev_says_serving_only_when_it_serves_and_sets_the_tool_parser() -> None:
    port = free_port()
    command = [str(Path(sys.executable).with_name("gateway")), "dev", "--port", str(port)]
    proc = subprocess.Popen(
        [*command, "--engine-mode", "synthetic", "--tool-parser", "none"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        seen = []
        while True:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.1))
            seen.append(line)
            if line.startswith("Ready: "):
                break
            assert proc.poll() is None, "".join(seen)
        # The one ready line: no line before it says ready (Triton's start included); the
        # capability table's status cells are no lines of their own.
        said = [s for s in seen[:-1] if READY_WORD.search(s) and "│" not in s]
        assert not said, "".join(seen)
        assert any(s.startswith("gateway dev: Triton started (gRPC ") for s in seen), "".join(seen)
        # It is printed once the gateway serves: it accepts a connection, and its model is ready.
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            pass
        assert http_client.get(f"http://127.0.0.1:{port}/health/ready", timeout=10).status_code == 200
        tokenizer = line.split("tokenizer ", 1)[1].split(")", 1)[0]
        assert (Path(tokenizer) / "tokenizer.json").is_file()
        curl, check = lines.get(timeout=5).strip(), lines.get(timeout=5).strip()
        assert curl.startswith(f"curl http://127.0.0.1:{port}/v1/chat/completions ")
        program = shlex.split(check)[0]
        found = shutil.which(program) if "/" not in program else program
        assert found and Path(found).resolve() == Path(command[0]).resolve(), check
        assert f"tokenizer={tokenizer}" in check
        assert "U+FFFD" in lines.get(timeout=5)
        # Both run as printed, by a shell in the directory `gateway dev` was started in.
        ran = subprocess.run(["bash", "-c", check], capture_output=True, text=True, timeout=120, check=False)
        assert ran.returncode == 0 and "ready" in ran.stdout, ran.stdout + ran.stderr
        if shutil.which("curl"):
            ran = subprocess.run(
                ["bash", "-c", curl], capture_output=True, text=True, timeout=120, check=False
            )
            assert ran.returncode == 0 and '"chat.completion"' in ran.stdout, ran.stdout + ran.stderr
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        r = http_client.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "tools": tools,
                "max_tokens": 4,
            },
            timeout=60,
        )
        # The dev default is hermes; --tool-parser none reached the model: a 400 asking for one.
        assert r.status_code == 400, r.text
        assert "tool_parser" in r.json()["error"]["message"]
        # Neither the gateway nor the synthetic engine (no model to run) loaded torch: each start of
        # it costs seconds of CPU.
        engines = [p for p in _descendants(proc.pid) if "tensorrt_llm/1/model.py" in _cmdline(p)]
        assert engines, "the stack's engine should be running"
        for pid in [proc.pid, *engines]:
            assert "libtorch" not in Path(f"/proc/{pid}/maps").read_text(), _cmdline(pid)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_gateway_dev_leaves_no_process_behind(signum: int) -> None:
    """`make run`'s stack: the Triton child goes when the gateway goes, even when it is killed."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "dev", "--port", str(port), "--engine-mode", "synthetic"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if http_client.get(f"http://127.0.0.1:{port}/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, "gateway dev exited early"
            time.sleep(0.2)
        # This gateway's own process tree only: another stack on the machine is not ours to judge.
        descendants = _descendants(proc.pid)
        assert any("tritonserver" in _cmdline(p) for p in descendants), "the Triton stack should be running"
        proc.send_signal(signum)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in descendants):
            time.sleep(0.2)
        assert not any(Path(f"/proc/{p}").exists() for p in descendants)
    finally:
        if proc.poll() is None:
            proc.kill()
