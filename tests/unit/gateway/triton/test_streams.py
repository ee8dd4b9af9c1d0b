"""The ModelStreamInfer call opened ahead of need: a request takes it, a new one is opened behind
it, and an open call never turns into a request by itself (against a scripted gRPC server)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from tritonclient.grpc import service_pb2

from gateway.triton import connection as conn_module
from gateway.triton.connection import TritonConnection
from tests.support.fake_triton import FakeTriton, start_fake_triton
from tests.support.waiting import wait_until

TOKENS = [5, 6, 7]


def _request(request_id: str) -> service_pb2.ModelInferRequest:
    return service_pb2.ModelInferRequest(model_name="ensemble", id=request_id)


async def _generate(connection: TritonConnection, request_id: str, metadata=None) -> list[int]:
    """One request the way the engine sends it: write, read to the final response, half-close."""
    call = connection.open_stream(metadata)
    await call.write(_request(request_id))
    tokens = []
    async for message in call:
        response = message.infer_response
        assert response.id == request_id
        if response.parameters["triton_final_response"].bool_param:
            break
        tokens.append(int.from_bytes(response.raw_output_contents[0][:4], "little"))
    connection.end_stream(call)
    return tokens


async def _until_ready(connection: TritonConnection) -> None:
    for _ in range(200):
        try:
            if await connection.server_ready():
                return
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.05)  # the channel reconnects with a 250 ms backoff
    raise AssertionError("the fake Triton did not come back")


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeTriton, grpc.aio.Server, str]]:
    servicer = FakeTriton(tokens=TOKENS)
    server, url = await start_fake_triton(servicer)
    yield servicer, server, url
    await server.stop(None)


@pytest.fixture
async def connection(fake) -> AsyncIterator[TritonConnection]:
    _, _, url = fake
    connection = TritonConnection(url, timeout_s=5)
    yield connection
    await connection.close()


async def test_each_request_after_the_first_uses_a_stream_opened_before_it_and_one_stays_open(
    fake, connection: TritonConnection
) -> None:
    servicer, _, _ = fake
    for i in range(4):
        assert await _generate(connection, f"r{i}") == TOKENS
        # The stream for the next request is open on the server before that request exists.
        await wait_until(lambda i=i: servicer.streams == i + 2)
    assert [r.id for r in servicer.requests] == ["r0", "r1", "r2", "r3"]
    assert servicer.cancelled_unused == 0
    await connection.close()
    # Closing the connection ends the open, unused stream without a request.
    await wait_until(lambda: servicer.cancelled_unused == 1)
    assert len(servicer.requests) == 4


async def test_an_open_stream_unused_for_its_maximum_age_is_cancelled_and_the_next_request_still_works(
    fake, connection: TritonConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    servicer, _, _ = fake
    monkeypatch.setattr(conn_module, "SPARE_STREAM_MAX_AGE_S", 0.05)
    assert await _generate(connection, "a") == TOKENS
    # No open call is left behind on an idle channel (an open call keeps the channel pinging).
    await wait_until(lambda: servicer.cancelled_unused == 1)
    assert await _generate(connection, "b") == TOKENS
    assert [r.id for r in servicer.requests] == ["a", "b"]


async def test_a_stream_opened_before_triton_restarted_is_not_used(
    fake, connection: TritonConnection
) -> None:
    servicer, server, url = fake
    assert await _generate(connection, "before") == TOKENS
    await wait_until(lambda: servicer.streams == 2)
    # The open stream dies with the server; the next request must not be written on it.
    await server.stop(None)
    server2, _ = await start_fake_triton(servicer, port=int(url.rsplit(":", 1)[1]))
    try:
        await _until_ready(connection)
        assert await _generate(connection, "after") == TOKENS
    finally:
        await server2.stop(None)
    assert [r.id for r in servicer.requests] == ["before", "after"]


async def test_a_request_with_metadata_gets_a_stream_carrying_it_and_leaves_the_open_one(
    fake, connection: TritonConnection
) -> None:
    servicer, _, _ = fake
    assert await _generate(connection, "plain") == TOKENS
    await wait_until(lambda: servicer.streams == 2)
    traced = (("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),)
    assert await _generate(connection, "traced", traced) == TOKENS
    assert servicer.metadata[-1]["traceparent"] == traced[0][1]
    # The stream opened for the next plain request was left for it.
    assert servicer.streams == 3
    assert await _generate(connection, "plain2") == TOKENS
    await wait_until(lambda: servicer.streams == 4)
    assert [r.id for r in servicer.requests] == ["plain", "traced", "plain2"]
