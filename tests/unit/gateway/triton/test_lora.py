"""LoRA on the wire: the task id alone, the weights once more when the backend no longer holds the
adapter (invisibly), a full cache as 503 with Retry-After (against a scripted Triton)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2, service_pb2

from gateway.engine import GenerationRequest, LoraRequest, LoraTensors, SamplingParams
from gateway.errors import EngineError, EngineUnavailableError, InvalidRequestError
from gateway.triton.engine import TritonAdapter
from gateway.triton.pool import TritonPool
from tests.support.fake_triton import FakeTriton, start_fake_triton

ENGINE = """
name: "tensorrt_llm"
backend: "tensorrtllm"
max_batch_size: 8
model_transaction_policy { decoupled: true }
input [
  { name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "input_lengths" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "request_output_len" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "streaming" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "lora_task_id" data_type: TYPE_UINT64 dims: [ 1 ] optional: true },
  { name: "lora_weights" data_type: TYPE_FP16 dims: [ -1, -1 ] optional: true },
  { name: "lora_config" data_type: TYPE_INT32 dims: [ -1, 3 ] optional: true }
]
output [
  { name: "output_ids" data_type: TYPE_INT32 dims: [ -1, -1 ] },
  { name: "sequence_length" data_type: TYPE_INT32 dims: [ -1 ] }
]
"""
WEIGHTS = np.arange(12, dtype=np.float16).reshape(1, 12)
CONFIG = np.array([[1, 0, 2]], dtype=np.int32)


@dataclass
class LoraTriton(FakeTriton):
    """The backend's LoRA cache, as TensorRT-LLM words its answers."""

    cached: set[int] = field(default_factory=set)
    full: bool = False
    # Never keeps an adapter (a backend that keeps losing it): every request is a miss.
    forgetful: bool = False

    async def ModelConfig(self, request, context):
        config = text_format.Parse(ENGINE, model_config_pb2.ModelConfig())
        return service_pb2.ModelConfigResponse(config=config)

    async def ModelStreamInfer(
        self, request_iterator, context
    ) -> AsyncIterator[service_pb2.ModelStreamInferResponse]:
        async def first() -> AsyncIterator[service_pb2.ModelInferRequest]:
            async for request in request_iterator:
                yield request
                return

        async for request in first():
            names = [i.name for i in request.inputs]
            if "lora_task_id" in names:
                raw = request.raw_input_contents[names.index("lora_task_id")]
                task = int(np.frombuffer(raw, dtype=np.uint64)[0])
                error = None
                if "lora_weights" in names and not self.forgetful:
                    if self.full:
                        error = (
                            "Executor failed process requestId 3 due to the following error: "
                            f"PEFT Cache is full. Could not store taskId={task}"
                        )
                    else:
                        self.cached.add(task)
                elif task not in self.cached:
                    error = (
                        f"Encountered error for requestId 7: LoRA task {task} not found in cache. "
                        "Please send LoRA weights with request"
                    )
                if error is not None:
                    self.requests.append(request)
                    yield service_pb2.ModelStreamInferResponse(error_message=error)
                    return

            async def again(
                request: service_pb2.ModelInferRequest = request,
            ) -> AsyncIterator[service_pb2.ModelInferRequest]:
                yield request

            async for response in super().ModelStreamInfer(again(), context):
                yield response


@pytest.fixture
async def triton() -> AsyncIterator[tuple[LoraTriton, TritonAdapter]]:
    servicer = LoraTriton(tokens=[5, 6])
    server, url = await start_fake_triton(servicer)
    pool = TritonPool([url], timeout_s=5)
    try:
        adapter = TritonAdapter(pool, "tensorrt_llm")
        await adapter.ensure_ready()
        yield servicer, adapter
    finally:
        await pool.close()
        await server.stop(None)


def _request(lora: LoraRequest | None) -> GenerationRequest:
    return GenerationRequest("r", "", (1, 2, 3), SamplingParams(max_tokens=2), lora=lora)


def _lora(misses: list[int], task_id: int = 11) -> LoraRequest:
    async def tensors() -> LoraTensors:
        return LoraTensors(task_id, WEIGHTS, CONFIG)

    return LoraRequest("a", task_id, tensors, on_miss=lambda: misses.append(task_id))


async def _tokens(adapter: TritonAdapter, request: GenerationRequest) -> list[int]:
    return [t for d in [d async for d in adapter.generate(request)] for t in d.token_ids or ()]


def _inputs(request: service_pb2.ModelInferRequest) -> dict[str, tuple[list[int], bytes]]:
    return {
        i.name: (list(i.shape), raw)
        for i, raw in zip(request.inputs, request.raw_input_contents, strict=True)
    }


async def test_the_id_alone_then_the_weights_once_when_the_backend_lacks_them(
    triton: tuple[LoraTriton, TritonAdapter],
) -> None:
    servicer, adapter = triton
    assert adapter.info.lora
    misses: list[int] = []
    assert await _tokens(adapter, _request(_lora(misses))) == [5, 6]
    first, second = (_inputs(r) for r in servicer.requests)
    assert "lora_weights" not in first and first["lora_task_id"] == ([1, 1], np.uint64(11).tobytes())
    assert second["lora_weights"] == ([1, 1, 12], WEIGHTS.tobytes())
    assert second["lora_config"] == ([1, 1, 3], CONFIG.tobytes())
    assert misses == [11]
    # Cached now: the id alone is enough.
    assert await _tokens(adapter, _request(_lora(misses))) == [5, 6]
    assert "lora_weights" not in _inputs(servicer.requests[-1]) and misses == [11]
    # The base model sends no LoRA input at all.
    await _tokens(adapter, _request(None))
    assert "lora_task_id" not in _inputs(servicer.requests[-1])


async def test_a_full_cache_of_busy_adapters_is_503_with_retry_after(
    triton: tuple[LoraTriton, TritonAdapter],
) -> None:
    servicer, adapter = triton
    servicer.full = True
    with pytest.raises(EngineUnavailableError) as caught:
        await _tokens(adapter, _request(_lora([])))
    assert caught.value.status_code == 503 and caught.value.headers == {"retry-after": "1"}
    assert caught.value.code == "lora_cache_full"


async def test_the_weights_are_resent_once_only(triton: tuple[LoraTriton, TritonAdapter]) -> None:
    servicer, adapter = triton
    servicer.forgetful = True
    misses: list[int] = []
    with pytest.raises(EngineError, match="not found in cache"):
        await _tokens(adapter, _request(_lora(misses)))
    assert len(servicer.requests) == 2 and misses == [11]


async def test_a_model_taking_no_lora_inputs_and_no_engine_behind_it_is_a_clear_400() -> None:
    servicer = FakeTriton(tokens=[5])
    server, url = await start_fake_triton(servicer)
    pool = TritonPool([url], timeout_s=5)
    try:
        adapter = TritonAdapter(pool, "ensemble")
        with pytest.raises(InvalidRequestError) as caught:
            await adapter.lora_engine()
        assert caught.value.code == "lora_not_supported" and "takes no LoRA inputs" in caught.value.message
    finally:
        await pool.close()
        await server.stop(None)


def test_the_llmapi_model_gets_lora_id_name_and_its_server_path() -> None:
    from dataclasses import replace

    from gateway.triton import llmapi as la
    from tests.unit.gateway.triton.test_llmapi import _request as llmapi_request
    from tests.unit.gateway.triton.test_llmapi import _values, upstream

    contract = la.read_llmapi_contract(upstream("current", decoupled=True))
    info = contract.capabilities()
    assert info.lora and info.lora_by_server_path

    async def unused() -> LoraTensors:
        raise AssertionError("the llmapi model loads the adapter itself")

    lora = LoraRequest("sql", 2**62 + 5, unused, server_path="/models/lora/sql")
    values = _values(
        la.build_llmapi_request(contract, replace(llmapi_request(), lora=lora), request_id="1", seed=None)
    )
    assert values["lora_id"] == ("UINT64", [1], 2**62 + 5)
    assert values["lora_name"] == ("BYTES", [1], "sql")
    assert values["lora_path"] == ("BYTES", [1], "/models/lora/sql")
    # 1.2.x declares no LoRA inputs.
    assert not la.read_llmapi_contract(upstream("v1.2")).capabilities().lora
