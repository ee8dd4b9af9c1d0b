"""The stand-in for Triton's generate_stream writes what the gateway's HTTP client reads from the
CPU Triton: one token event a step, the request's length, and the response's end."""

from __future__ import annotations

import asyncio

from gateway.triton.http import TritonHttp
from gateway.triton.tensors import parse_json_response
from loadtest.fake_triton_http import FakeEngine


async def test_each_step_gives_every_open_stream_one_token_until_its_length() -> None:
    engine = FakeEngine(0.001)
    started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(engine.serve(0, started))
    port = await asyncio.wait_for(started, 10)
    http = TritonHttp(f"http://127.0.0.1:{port}", timeout_s=5)

    async def one(request_id: str, n: int) -> list[tuple[int, ...] | None]:
        body = {"id": request_id, "input_ids": [1, 2], "request_output_len": n, "streaming": True}
        return [
            parse_json_response(e, whole=False).token_ids
            async for e in http.generate_stream("tensorrt_llm", body)
        ]

    try:
        first, second = await asyncio.wait_for(asyncio.gather(one("1", 3), one("2", 5)), 10)
    finally:
        await http.close()
        server.cancel()
    assert len(first) == 3 and len(second) == 5
    assert all(ids is not None and len(ids) == 1 for ids in first + second)
    assert not engine.streams
