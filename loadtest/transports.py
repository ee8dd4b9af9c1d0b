"""`python -m loadtest.transports`: CPU per streamed token of the ways to read Triton's streams.

The candidates for the gateway's Triton hot path, each in its own process against one running
Triton (the synthetic engine: `python -m deploy.devstack --engine-mode synthetic`), interleaved
in rounds, medians reported:
  grpc-floor    grpc.aio ModelStreamInfer, messages left as bytes (no protobuf parsing at all):
                the least any gRPC reader in Python can cost
  gateway-grpc  the gateway's Triton adapter over gRPC (tritonclient's protobufs, outputs read
                straight from raw_output_contents)
  http-floor    HTTP generate_stream with aiohttp, events split and parsed with orjson, nothing else
  gateway-http  the gateway's Triton adapter over HTTP generate_stream (--triton-http-url)
The CPU is the process's own (time.process_time) over the measured requests, after a warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

VARIANTS = ("grpc-floor", "gateway-grpc", "http-floor", "gateway-http")


async def _reader(args: argparse.Namespace) -> Callable[[], Awaitable[int]]:
    import grpc
    from tritonclient.grpc import service_pb2

    from gateway.engine import GenerationRequest, SamplingParams
    from gateway.triton.engine import TritonAdapter
    from gateway.triton.pool import TritonPool
    from gateway.triton.tensors import build_json_request, build_request

    http_urls = [args.http] if args.variant == "gateway-http" else []
    pool = TritonPool([args.grpc], timeout_s=30, http_urls=http_urls)
    adapter = TritonAdapter(pool, args.model, args.route)
    await adapter.introspect()
    prompt_ids = tuple(random.Random(1).randrange(100, 400) for _ in range(args.prompt_tokens))
    request = GenerationRequest(
        "bench",
        "hello world " * (args.prompt_tokens // 2),
        prompt_ids,
        SamplingParams(max_tokens=args.max_tokens, ignore_eos=True),
    )
    kw = {"request_id": "1", "seed": None, "num_sequences": 1, "stream": True}
    if args.variant.startswith("gateway"):

        async def gateway() -> int:
            return sum([d.num_tokens async for d in adapter.generate(request)])

        return gateway
    if args.variant == "grpc-floor":
        channel = grpc.aio.insecure_channel(args.grpc)
        method = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=None,
        )
        message = build_request(adapter.contract, request, **kw)  # type: ignore[arg-type]
        ids = iter(range(1, 2**62))

        async def grpc_floor() -> int:
            call = method()
            # Each request its own id: the engine knows requests by id.
            message.id = str(next(ids))
            await call.write(message)
            n = 0
            # max_tokens responses, then the empty final one.
            while n <= args.max_tokens and await call.read() is not grpc.aio.EOF:
                n += 1
            call.cancel()
            return n - 1

        return grpc_floor
    import aiohttp
    import orjson

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    url = f"{args.http}/v2/models/{adapter.contract.model}/generate_stream"
    body = build_json_request(adapter.contract, request, **kw)  # type: ignore[arg-type]
    ids = iter(range(1, 2**62))

    async def http_floor() -> int:
        n = 0
        body["id"] = str(next(ids))
        data = orjson.dumps(body)
        async with session.post(url, data=data, headers={"Content-Type": "application/json"}) as resp:
            buffer = b""
            async for chunk in resp.content.iter_any():
                buffer += chunk
                while (end := buffer.find(b"\n\n")) >= 0:
                    orjson.loads(buffer[6:end])
                    buffer = buffer[end + 2 :]
                    n += 1
        return n

    return http_floor


async def _measure(args: argparse.Namespace) -> dict[str, object]:
    one = await _reader(args)

    async def run(requests: int) -> int:
        queue = list(range(requests))
        tokens = 0

        async def worker() -> None:
            nonlocal tokens
            while queue:
                queue.pop()
                n = await one()  # awaited first: `tokens += await ...` would lose other workers' counts
                tokens += n

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        return tokens

    await run(args.concurrency)  # warm-up: connections, caches
    cpu, wall = time.process_time(), time.perf_counter()
    tokens = await run(args.requests)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"cpu_ms_per_token": cpu * 1000 / tokens, "tokens_per_s": tokens / wall, "tokens": tokens}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.transports", description=__doc__)
    p.add_argument("--grpc", required=True, help="Triton gRPC HOST:PORT")
    p.add_argument("--http", required=True, help="Triton HTTP URL")
    p.add_argument("--model", default="ensemble", help="the ensemble")
    p.add_argument("--route", default="ensemble", choices=("ensemble", "engine"))
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--requests", type=int, default=192)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--variant", help=argparse.SUPPRESS)  # one measurement, in a child process
    args = p.parse_args(argv)
    if args.variant:
        import uvloop  # as the gateway runs

        print(json.dumps(uvloop.run(_measure(args))))
        sys.stdout.flush()
        os._exit(0)  # no orderly teardown of open channels and sessions to wait for
    results: dict[str, list[float]] = {v: [] for v in args.variants.split(",")}
    for _ in range(args.rounds):
        for variant in results:
            out = subprocess.run(
                [sys.executable, "-m", "loadtest.transports", *(argv or sys.argv[1:]), "--variant", variant],
                capture_output=True,
                text=True,
                check=True,
            )
            results[variant].append(json.loads(out.stdout.strip().splitlines()[-1])["cpu_ms_per_token"])
    print(f"route {args.route}, concurrency {args.concurrency}, {args.max_tokens}-token streams:")
    for variant, values in results.items():
        spread = ", ".join(f"{v:.3f}" for v in values)
        print(f"{variant:13s} {statistics.median(values):.3f} ms/token (rounds: {spread})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
