"""The load generator's Messages API target, against a socket server replaying the gateway's own
event writer: tokens timed per delta, usage read from the events, failures counted."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.apis.messages.errors import error_event
from gateway.apis.messages.stream import PING, MessageStreamWriter
from gateway.errors import EngineError
from loadtest.anthropic_client import AnthropicTarget
from loadtest.workload import Prompt, Workload


def stream(*, fail: bool) -> bytes:
    writer = MessageStreamWriter("msg_1", "m")
    # 4 of the 9 prompt tokens read from the cache: Anthropic counts them apart from input_tokens.
    out = writer.start(9, 4) + PING + writer.text("a") + writer.text("b") + writer.text("c")
    if fail:
        return out + error_event(EngineError("boom"))
    return out + writer.finish("max_tokens", None, prompt_tokens=9, output_tokens=3, cached_tokens=4)


def serve(events: bytes, seen: list[dict]):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        fields = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:] if line)
        seen.append(
            {"head": head, "body": json.loads(await reader.readexactly(int(fields[b"content-length"])))}
        )
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            + f"content-length: {len(events)}\r\n\r\n".encode()
            + events
        )
        await writer.drain()
        writer.close()

    return handler


@pytest.mark.parametrize("fail", [False, True])
async def test_a_streamed_message_is_timed_per_delta_and_counted_from_usage(fail: bool) -> None:
    seen: list[dict] = []
    server = await asyncio.start_server(serve(stream(fail=fail), seen), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    target = AnthropicTarget(
        f"http://127.0.0.1:{port}",
        "m",
        Workload(max_tokens=3, stream=True, temperature=0, ignore_eos=True),
        api_key="k",
    )
    await target.open(1)
    try:
        record = await target.send(Prompt("hi"))
    finally:
        await target.aclose()
        server.close()
    assert seen[0]["body"] == {
        "model": "m",
        "max_tokens": 3,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
    }
    assert b"x-api-key: k" in seen[0]["head"].lower() and b"post /v1/messages " in seen[0]["head"].lower()
    assert len(record.chunk_times) == 3
    assert record.prompt_tokens == 9
    if fail:
        assert record.error == "stream_error" and "boom" in (record.error_detail or "")
    else:
        assert record.error is None
        assert record.output_tokens == 3 and record.usage_reported
