"""A request the llmapi model never answers (the newest model.py drops some errors without a reply):
the adapter gives up after the stream idle bound with a timeout and cancels its gRPC call, while a
request beside it on the same connection is served in full (against a scripted gRPC server)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from gateway.engine import GenerationRequest, SamplingParams
from gateway.errors import DeadlineExceededError
from gateway.triton.llmapi_engine import LlmapiAdapter
from gateway.triton.pool import TritonPool
from tests.support.waiting import wait_until

CONFIG = Path(__file__).resolve().parents[3] / "data" / "llmapi" / "current" / "config.pbtxt"
SILENT_PROMPT = "dropped"
IDLE_S = 0.3


@dataclass
class SilentForOne(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The llmapi model (upstream's current config, decoupled) answering every request with its
    prompt as cumulative text in two steps, except SILENT_PROMPT, which it never answers."""

    cancelled: list[str] = field(default_factory=list)

    async def ModelConfig(self, request, context):
        config = text_format.Parse(CONFIG.read_text(), mc.ModelConfig())
        config.model_transaction_policy.decoupled = True
        return service_pb2.ModelConfigResponse(config=config)

    async def ModelStreamInfer(self, request_iterator, context):
        request = await anext(aiter(request_iterator))
        raw = request.raw_input_contents[0]
        (length,) = struct.unpack_from("<I", raw)
        prompt = raw[4 : 4 + length].decode()
        if prompt == SILENT_PROMPT:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(request.id)
                raise
        for text, final in ((prompt[:2], False), (prompt, True)):
            response = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
            out = response.outputs.add()
            out.name, out.datatype = "text_output", "BYTES"
            out.shape.append(1)
            response.raw_output_contents.append(struct.pack("<I", len(text)) + text.encode())
            if final:
                response.parameters["triton_final_response"].bool_param = True
            yield service_pb2.ModelStreamInferResponse(infer_response=response)


@pytest.fixture
async def served() -> AsyncIterator[tuple[SilentForOne, LlmapiAdapter]]:
    servicer = SilentForOne()
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    pool = TritonPool([f"127.0.0.1:{port}"], timeout_s=5, stream_idle_s=IDLE_S)
    adapter = LlmapiAdapter(pool, "tensorrt_llm")
    await adapter.introspect()
    yield servicer, adapter
    for endpoint in pool.endpoints:
        await endpoint.connection.close()
    await server.stop(None)


def _request(prompt: str) -> GenerationRequest:
    return GenerationRequest("r", prompt, (), SamplingParams(max_tokens=8))


async def _text(adapter: LlmapiAdapter, prompt: str) -> str:
    return "".join([d.text.decode() async for d in adapter.generate(_request(prompt))])


async def test_a_request_the_model_never_answers_times_out_and_is_cancelled(
    served: tuple[SilentForOne, LlmapiAdapter],
) -> None:
    servicer, adapter = served
    silent = asyncio.ensure_future(_text(adapter, SILENT_PROMPT))
    # A request sent beside it is served in full, while the silent one waits.
    assert await _text(adapter, "hello there") == "hello there"
    with pytest.raises(DeadlineExceededError, match=r"Triton sent nothing for 0\.3 s") as raised:
        await asyncio.wait_for(silent, 30)
    assert raised.value.status_code == 504 and raised.value.code == "timeout"
    # The call is cancelled, not left half-closed: Triton lets go of the request (and a model that
    # was only slow stops generating).
    await wait_until(lambda: len(servicer.cancelled) == 1, timeout=30)
    assert await _text(adapter, "after") == "after"
