"""`python -m loadtest.triton_http_drops`: does Triton's HTTP generate_stream deliver every response
under load? Against the native engine, at a given `net.core.wmem_default` per run.

Why: tritonserver's HTTP frontend hands each generate_stream response to the connection's thread with
libevhtp's `evthr_defer`, which writes a command to a non-blocking socketpair; when that thread is
behind and the socket's send buffer is full the write fails, and Triton ignores the failure
(`http_server.cc`, `GenerateRequestClass::InferResponseComplete`, 2.51 and the same code at the time
of writing). A lost command is a lost start (the stream's data comes before its status line), a
lost token (the stream ends cleanly, short) or a lost end (the stream never ends). The socketpair's
buffer is `net.core.wmem_default` when Triton creates it: 212992 bytes hold 278 commands.

Each run starts a tritonserver on the native engine (every token its own response, `--step-ms`
apart), raising `net.core.wmem_default` while Triton creates its sockets (root only), then sends
`--requests` streams of `--tokens` tokens over `--streams` keep-alive connections, each request
with an id of its own, and checks every response as bytes: the status line first, exactly the
tokens asked for, only its own id, a clean end within `--stall-s`. The engine's own counters are
printed beside, to show it sent every token.

    python -m loadtest.triton_http_drops --wmem 212992,33554432
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from deploy.devstack import TritonServer
from deploy.model_repo import render_repository
from deploy.tiny_model import build_tiny_model

_ID = re.compile(rb'"id":"(r\d+)"')
_END = b"\r\n0\r\n\r\n"
MODEL = "drops_tensorrt_llm"


async def _load(host: str, port: int, args: argparse.Namespace) -> dict[str, Any]:
    requests = iter(range(args.requests))
    outcome: Counter[str] = Counter()
    samples: list[str] = []

    async def connection() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        leftover = b""
        for i in requests:
            rid = f"r{i}"
            body = json.dumps(
                {
                    "id": rid,
                    "input_ids": [11, 12, 13, 14],
                    "input_lengths": 4,
                    "request_output_len": args.tokens,
                    "streaming": True,
                    "exclude_input_in_output": True,
                }
            ).encode()
            writer.write(
                f"POST /v2/models/{MODEL}/generate_stream HTTP/1.1\r\nHost: triton\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            got, leftover = leftover, b""
            ended = False
            try:
                while _END not in got:
                    data = await asyncio.wait_for(reader.read(65536), args.stall_s)
                    if not data:
                        break
                    got += data
            except asyncio.TimeoutError:
                pass
            end = got.find(_END)
            if end >= 0:
                ended = True
                got, leftover = got[: end + len(_END)], got[end + len(_END) :]
            ids = set(_ID.findall(got))
            tokens = got.count(b"data: ")
            if not got.startswith(b"HTTP/1.1 "):
                kind = "data before the status line"
            elif not ended:
                kind = "never ended (stalled)"
            elif ids - {rid.encode()}:
                kind = "another request's data"
            elif tokens != args.tokens:
                kind = "ended short (tokens lost)"
            else:
                kind = "ok"
            outcome[kind] += 1
            if kind != "ok" and len(samples) < 3:
                samples.append(f"{rid}: {kind}, {tokens} of {args.tokens} tokens, starts {got[:24]!r}")
            if not ended or leftover:
                # A broken connection cannot be trusted for the next request.
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
                leftover = b""
        writer.close()

    start = time.monotonic()
    await asyncio.gather(*(connection() for _ in range(args.streams)))
    return {"outcome": dict(outcome), "samples": samples, "seconds": round(time.monotonic() - start, 1)}


def _run(wmem: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    repo = render_repository(
        root / f"repo-{wmem}",
        backend="native",
        variant="current",
        variables={
            "tokenizer_dir": build_tiny_model("bpe"),
            "synthetic_step_ms": args.step_ms,
            "engine_instance_count": args.instances,
            "name_prefix": "drops_",
        },
    )
    server = TritonServer([repo], work_dir=root / f"server-{wmem}", http_send_buffer=wmem)
    server.start()
    try:
        server.wait_ready(300)
        result = asyncio.run(_load("127.0.0.1", server.http_port, args))
        result["engine"] = {
            line.split("{")[0].removeprefix("native_engine_"): float(line.rsplit(" ", 1)[1])
            for line in server.metrics_text().splitlines()
            if line.startswith("native_engine_") and "_total" in line
        }
        result["send_buffer"] = server.http_send_buffer_applied
        return result
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.triton_http_drops", description=__doc__)
    p.add_argument("--wmem", default="212992,33554432", help="comma list of net.core.wmem_default values")
    p.add_argument("--streams", type=int, default=128, help="concurrent keep-alive connections")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--step-ms", type=float, default=1.0)
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--stall-s", type=float, default=3.0, help="a stream silent this long is stalled")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="triton-http-drops-") as tmp:
        for wmem in (int(x) for x in args.wmem.split(",")):
            result = _run(wmem, args, Path(tmp))
            applied = result.pop("send_buffer")
            print(
                f"net.core.wmem_default {wmem}"
                f"{'' if applied else ' (NOT applied: needs root; ran with the current value)'}: "
                f"{args.requests} streams of {args.tokens} tokens, {args.streams} at a time, "
                f"{args.step_ms:g} ms steps, {result['seconds']} s: {result['outcome']}; "
                f"engine: {result['engine']}"
            )
            for sample in result["samples"]:
                print(f"  e.g. {sample}")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
