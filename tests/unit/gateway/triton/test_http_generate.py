"""Triton's HTTP generate_stream as the generation transport: the JSON request carries what the
gRPC request carries, events parse as gRPC responses do, and the client reads SSE, refusals and
error events, and closes the connection of a stream left early (against a scripted aiohttp server)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gateway.engine import GenerationRequest, SamplingParams
from gateway.triton import contract as c
from gateway.triton.http import (
    HttpStatusError,
    StreamError,
    TransportError,
    TritonHttp,
    is_connection_failure,
)
from gateway.triton.tensors import build_json_request, json_request_fits, parse_json_response
from tests.unit.gateway.triton.test_translation import (
    CURRENT,
    ENGINE,
    build,
    contract_of,
    request,
    tensor_values,
)


@pytest.mark.parametrize(
    ("config", "route", "req"),
    [
        (CURRENT, "ensemble", request(temperature=0.5, min_tokens=3, repetition_penalty=1.2)),
        (CURRENT, "ensemble", request(temperature=0)),
        (
            ENGINE,
            "engine",
            GenerationRequest(
                "r",
                "unused",
                (5, 6, 7),
                SamplingParams(max_tokens=4, top_k=3, length_penalty=1.5),
                end_id=2,
                end_token_ids=(3, 9),
            ),
        ),
    ],
)
def test_the_json_request_carries_every_input_of_the_grpc_request(
    config: str, route: c.Route, req: GenerationRequest
) -> None:
    contract = contract_of(config, route)
    kw = {"seed": 42, "num_sequences": 2, "stream": True}
    grpc_values = tensor_values(build(contract, req, **kw))
    body = build_json_request(contract, req, request_id="rid", **kw)  # type: ignore[arg-type]
    assert body.pop("id") == "rid"
    assert set(body) == set(grpc_values)
    for name, value in body.items():
        _, _, flat = grpc_values[name]
        assert (value if isinstance(value, list) else [value]) == flat, name


def test_json_values_take_the_type_of_their_tensor() -> None:
    # Triton's JSON parser refuses an integer for an FP32 input and a float for an INT32 one.
    body = build_json_request(
        contract_of(CURRENT),
        request(temperature=1, top_p=1),
        request_id="r",
        seed=None,
        num_sequences=1,
        stream=True,
    )
    assert type(body["temperature"]) is float and type(body["top_p"]) is float
    assert type(body["max_tokens"]) is int and type(body["stream"]) is bool


FULL_ENGINE = ENGINE.replace(
    "input [",
    """input [
  { name: "return_log_probs" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "return_generation_logits" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "embedding_bias" data_type: TYPE_FP32 dims: [ -1 ] optional: true },""",
    1,
).replace(
    "output [",
    """output [
  { name: "output_log_probs" data_type: TYPE_FP32 dims: [ -1, -1 ] },
  { name: "generation_logits" data_type: TYPE_FP32 dims: [ -1, -1, -1 ] },""",
    1,
)


def _with(**kw: object) -> GenerationRequest:
    return GenerationRequest("r", "", (1, 2), SamplingParams(max_tokens=4), **kw)  # type: ignore[arg-type]


def test_top_logprobs_and_logit_bias_stay_on_grpc() -> None:
    contract = contract_of(FULL_ENGINE, "engine")
    assert contract.top_logprobs and contract.logit_bias
    assert json_request_fits(contract, _with())
    assert json_request_fits(contract, _with(logprobs=0))
    assert not json_request_fits(contract, _with(logprobs=2))
    assert not json_request_fits(contract, _with(logit_bias=((1, 1.0),), vocab_size=10))


def test_a_streamed_event_is_parsed_like_a_grpc_response() -> None:
    event = {
        "id": "1",
        "model_name": "ensemble",
        "output_ids": 2657,
        "sequence_length": 1,
        "text_output": "x",
    }
    parsed = parse_json_response(event, whole=False)
    assert parsed.token_ids == (2657,) and parsed.text is None and not parsed.empty


def test_a_whole_result_is_cut_to_its_sequence_length() -> None:
    event = {"output_ids": [[4, 5, 6, 0, 0]], "sequence_length": [3], "output_log_probs": [-0.5, -1.0, -2.0]}
    parsed = parse_json_response(event, whole=True)
    assert parsed.token_ids == (4, 5, 6)
    assert parsed.log_probs == (-0.5, -1.0, -2.0)


def test_a_text_only_event_keeps_its_text_and_counts() -> None:
    parsed = parse_json_response(
        {"text_output": "é!", "num_output_tokens": 2, "sequence_index": 1}, whole=False
    )
    assert parsed.text == "é!".encode() and parsed.num_output_tokens == 2 and parsed.index == 1


def test_an_event_without_outputs_is_empty() -> None:
    assert parse_json_response({"id": "1", "model_name": "ensemble", "model_version": "1"}, whole=False).empty


# ------------------------------------------------------------------------------- the HTTP client


class Scripted:
    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.headers: list[dict[str, str]] = []
        self.closed = asyncio.Event()
        self.released = asyncio.Event()  # set at the end of the test: open streams may end

    async def generate_stream(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        model = request.match_info["model"]
        if model == "missing":
            return web.json_response(
                {"error": "Request for unknown model: 'missing' is not found"}, status=404
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if model == "failing":
            await response.write(b'data: {"output_ids":1}\n\ndata: {"error":"engine failed"}\n\n')
            return response
        if model == "backlog":
            # A reader far behind Triton: a thousand events already buffered, then nothing more.
            await response.write(b"".join(b'data: {"output_ids":%d}\n\n' % t for t in range(1000)))
            await self.released.wait()
            return response
        if model == "silent":
            # A stream whose end Triton lost: one token, then nothing, the response never ended.
            await response.write(b'data: {"output_ids":1}\n\n')
            await self.released.wait()
            return response
        if model == "slow":
            for token in range(6):
                await response.write(b'data: {"output_ids":%d}\n\n' % token)
                await asyncio.sleep(0.1)
            return response
        if model == "endless":
            try:
                for token in range(10**6):
                    await response.write(b'data: {"output_ids":%d}\n\n' % token)
                    await asyncio.sleep(0.001)
            except (ConnectionResetError, asyncio.CancelledError):
                self.closed.set()
                raise
            return response
        # Two events in one write and one split across writes: framing is by the blank line.
        await response.write(b'data: {"output_ids":1}\n\ndata: {"output_ids":2}\n\ndata: {"outp')
        await response.write(b'ut_ids":3}\n\n')
        return response


async def serve(scripted: Scripted) -> tuple[web.AppRunner, str]:
    """The scripted generate_stream on a free local port: its runner and its URL."""
    app = web.Application()
    app.router.add_post("/v2/models/{model}/generate_stream", scripted.generate_stream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def served() -> AsyncIterator[tuple[Scripted, str]]:
    scripted = Scripted()
    runner, url = await serve(scripted)
    yield scripted, url
    scripted.released.set()
    await runner.cleanup()


async def test_events_are_read_across_chunk_boundaries_and_the_body_is_json(served) -> None:
    scripted, url = served
    http = TritonHttp(url, timeout_s=5)
    try:
        events = [
            e
            async for e in http.generate_stream(
                "ensemble", {"id": "7", "max_tokens": 3}, {"traceparent": "t"}
            )
        ]
    finally:
        await http.close()
    assert [e["output_ids"] for e in events] == [1, 2, 3]
    assert scripted.bodies == [{"id": "7", "max_tokens": 3}]
    assert scripted.headers[0]["traceparent"] == "t"


async def test_a_refusal_carries_tritons_status_and_message(served) -> None:
    _, url = served
    http = TritonHttp(url, timeout_s=5)
    try:
        with pytest.raises(HttpStatusError) as info:
            [e async for e in http.generate_stream("missing", {})]
    finally:
        await http.close()
    assert info.value.status == 404 and "unknown model" in info.value.message


async def test_an_error_event_ends_the_stream_with_its_message(served) -> None:
    _, url = served
    http = TritonHttp(url, timeout_s=5)
    seen = []
    try:
        with pytest.raises(StreamError, match="engine failed"):
            async for event in http.generate_stream("failing", {}):
                seen.append(event)
    finally:
        await http.close()
    assert seen == [{"output_ids": 1}]


async def test_leaving_a_stream_early_closes_its_connection(served) -> None:
    scripted, url = served
    http = TritonHttp(url, timeout_s=5)
    try:
        async with contextlib.aclosing(http.generate_stream("endless", {})) as events:
            async for event in events:
                if event["output_ids"] == 3:
                    break
        # Triton notices the closed connection at its next write, as this server does.
        await asyncio.wait_for(scripted.closed.wait(), 10)
    finally:
        await http.close()


async def test_a_stream_behind_triton_lets_other_tasks_run_between_buffered_events(served) -> None:
    # As a gRPC read does between messages: otherwise a stream whose client has gone works through
    # its whole backlog before its cancellation arrives (the consumer here never waits, as writing
    # to a disconnected client does not), and every other stream waits for it.
    _, url = served
    http = TritonHttp(url, timeout_s=5)
    consumed = 0
    first = asyncio.Event()

    async def consume() -> None:
        nonlocal consumed
        async with contextlib.aclosing(http.generate_stream("backlog", {})) as events:
            async for _ in events:
                consumed += 1
                first.set()

    try:
        task = asyncio.create_task(consume())
        await first.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await http.close()
    assert consumed < 5


async def test_an_endpoint_that_refuses_connections_is_a_connection_failure() -> None:
    http = TritonHttp("http://127.0.0.1:1", timeout_s=5)
    try:
        with pytest.raises(Exception) as info:
            [e async for e in http.generate_stream("ensemble", {})]
    finally:
        await http.close()
    assert is_connection_failure(info.value)


def test_the_client_streams_under_uvloop_as_the_gateway_runs_it() -> None:
    # uvloop's transports are not asyncio.Transport subclasses; the gateway serves under uvloop.
    import uvloop

    async def main() -> list[int]:
        scripted = Scripted()
        runner, url = await serve(scripted)
        http = TritonHttp(url, timeout_s=5)
        try:
            ids = []
            for _ in range(2):  # the second request reuses the first one's connection
                ids += [e["output_ids"] async for e in http.generate_stream("ensemble", {})]
            return ids
        finally:
            await http.close()
            scripted.released.set()
            await runner.cleanup()

    assert uvloop.run(main()) == [1, 2, 3, 1, 2, 3]


async def test_a_connection_is_reused_after_a_complete_response_only(served) -> None:
    _, url = served
    http = TritonHttp(url, timeout_s=5)
    try:
        for _ in range(3):
            assert [e["output_ids"] async for e in http.generate_stream("ensemble", {})] == [1, 2, 3]
        assert len(http._idle) == 1
        async with contextlib.aclosing(http.generate_stream("endless", {})) as events:
            async for _event in events:
                break
        assert len(http._idle) == 0  # the one idle connection was taken, and closed after it
    finally:
        await http.close()


async def test_an_idle_connection_that_triton_closed_is_replaced_by_a_new_one() -> None:
    scripted = Scripted()
    app = web.Application()
    app.router.add_post("/v2/models/{model}/generate_stream", scripted.generate_stream)
    runner = web.AppRunner(app, keepalive_timeout=0.01)  # the server drops idle connections at once
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    http = TritonHttp(f"http://127.0.0.1:{port}", timeout_s=5)
    try:
        assert [e["output_ids"] async for e in http.generate_stream("ensemble", {})] == [1, 2, 3]
        (idle,) = http._idle
        gone = asyncio.Event()
        lost = idle.connection_lost

        def on_lost(exc: Exception | None) -> None:
            lost(exc)
            gone.set()

        idle.connection_lost = on_lost  # type: ignore[method-assign]
        if not idle.lost:
            await asyncio.wait_for(gone.wait(), 10)
        assert [e["output_ids"] async for e in http.generate_stream("ensemble", {})] == [1, 2, 3]
    finally:
        await http.close()
        scripted.released.set()
        await runner.cleanup()


async def test_a_started_stream_that_goes_silent_fails_after_the_idle_limit(served) -> None:
    _, url = served
    http = TritonHttp(url, timeout_s=5, stream_idle_s=0.3)
    seen = []
    started = asyncio.get_running_loop().time()
    try:
        with pytest.raises(TransportError, match=r"sent nothing on the stream for 0\.3 s"):
            async for event in http.generate_stream("silent", {}):
                seen.append(event)
        failed_after = asyncio.get_running_loop().time() - started
        assert http._idle == []  # the unfinished response's connection is closed, not reused
    finally:
        await http.close()
    assert seen == [{"output_ids": 1}]
    # The check runs every 0.3 s and needs one whole silent period: at most two periods.
    assert 0.3 <= failed_after < 2.0


async def test_a_stream_that_keeps_coming_outlives_the_idle_limit(served) -> None:
    _, url = served
    http = TritonHttp(url, timeout_s=5, stream_idle_s=0.25)
    try:
        # 0.6 s in all, an event every 0.1 s: every gap is well under the limit.
        events = [e["output_ids"] async for e in http.generate_stream("slow", {})]
    finally:
        await http.close()
    assert events == [0, 1, 2, 3, 4, 5]
