"""`gateway dev` as `make run` starts it: its ready line comes only once the port accepts
connections, names the tokenizer directory, and --tool-parser reaches the served model."""

from __future__ import annotations

import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.support.gateway_process import free_port

STARTUP_TIMEOUT_S = 300.0


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
            if line.startswith("gateway: serving"):
                break
            assert proc.poll() is None, "".join(seen)
        # The line is printed after the port accepted a connection: it accepts one now.
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            pass
        tokenizer = line.split("tokenizer ", 1)[1].split(")", 1)[0]
        assert (Path(tokenizer) / "tokenizer.json").is_file()
        hint = lines.get(timeout=5) + lines.get(timeout=5)
        assert "curl http://127.0.0.1:" in hint and f"tokenizer={tokenizer}" in hint
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        r = httpx.post(
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
    finally:
        proc.terminate()
        proc.wait(timeout=60)
