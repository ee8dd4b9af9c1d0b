"""`TritonModel`: the Engine protocol over one served model, whichever TensorRT-LLM contract its
Triton model speaks. The contract is detected once, from the model config, and every request then
goes to that contract's adapter: the C++ repository's (`TritonAdapter`: an ensemble or a
`tensorrt_llm` engine model) or the llmapi model's (`LlmapiAdapter`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Literal

from tritonclient.grpc import model_config_pb2 as mc

from gateway.config import ServedModel
from gateway.engine import Engine, EngineInfo, GenerationDelta, GenerationRequest
from gateway.errors import EngineUnavailableError, GatewayError
from gateway.text.images import takes_images
from gateway.triton import contract as c
from gateway.triton.engine import TritonAdapter
from gateway.triton.llmapi import UnsupportedModelError, declares, is_llmapi
from gateway.triton.llmapi_engine import LlmapiAdapter
from gateway.triton.pool import TritonPool, read_model_config

ContractKind = Literal["tensorrt_llm", "llmapi"]

# What a user is told the gateway can serve, when a model is none of these.
KNOWN_CONTRACTS = (
    "the TensorRT-LLM C++ repository (an ensemble with text_input and max_tokens, or a tensorrt_llm "
    "model with input_ids, input_lengths, request_output_len and output_ids)",
    "TensorRT-LLM's llmapi Python model (text_input, sampling_param_* inputs, text_output)",
)


def detect_contract(config: mc.ModelConfig) -> ContractKind:
    """Which contract a model config speaks, or UnsupportedModelError naming the model, what its
    config declares and the contracts the gateway knows (one line)."""
    if is_llmapi(config):
        return "llmapi"
    if config.ensemble_scheduling.step or c.is_engine(config):
        return "tensorrt_llm"
    try:
        c.read_contract(config, "ensemble")
    except c.ContractError:
        pass
    else:
        return "tensorrt_llm"
    raise UnsupportedModelError(
        f"Triton model {config.name!r} ({declares(config)}) speaks no contract the gateway knows: "
        + "; ".join(KNOWN_CONTRACTS)
    )


Adapter = TritonAdapter | LlmapiAdapter


def _unsupported(exc: c.ContractError) -> UnsupportedModelError:
    return UnsupportedModelError(f"{exc}; the contracts the gateway knows: {'; '.join(KNOWN_CONTRACTS)}")


class TritonModel:
    def __init__(self, pool: TritonPool, model: ServedModel) -> None:
        self._pool = pool
        self._config = model
        self._adapter: Adapter | None = None
        self._lock = asyncio.Lock()
        self._unready: str | None = None

    @property
    def adapter(self) -> Adapter:
        if self._adapter is None:
            raise EngineUnavailableError(f"Triton model {self._config.triton_model!r} is not available yet")
        return self._adapter

    @property
    def unready_reason(self) -> str | None:
        if self._adapter is not None and self._unready is None:
            return self._adapter.unready_reason
        return self._unready

    def adapter_for(self, kind: ContractKind) -> Adapter:
        model = self._config
        if kind == "llmapi":
            return LlmapiAdapter(self._pool, model.triton_model, vision=takes_images(model.tokenizer))
        return TritonAdapter(self._pool, model.triton_model, model.route, engine_model=model.engine_model)

    async def detect(self) -> Adapter:
        """Read the model config (from the first endpoint that answers) and pick the adapter."""
        async with self._lock:
            if self._adapter is not None:
                return self._adapter
            # A model served by the engine route alone names its engine model, and may have no
            # ensemble at all: the contract is then the engine model's.
            model = self._config
            name = (
                model.engine_model if model.route == "engine" and model.engine_model else model.triton_model
            )
            self._adapter = self.adapter_for(detect_contract(await read_model_config(self._pool, name)))
            return self._adapter

    async def introspect(self) -> None:
        adapter = await self.detect()
        try:
            await adapter.introspect()
        except c.ContractError as exc:
            raise _unsupported(exc) from None

    async def ensure_ready(self) -> None:
        """On every request: cheap once the contract is known."""
        adapter = self._adapter
        if adapter is None:
            await self.introspect()
            return
        try:
            await adapter.ensure_ready()
        except c.ContractError as exc:
            raise _unsupported(exc) from None

    @property
    def info(self) -> EngineInfo:
        return self.adapter.info

    async def is_ready(self) -> bool:
        if self._adapter is None:
            try:
                await self.detect()
            except GatewayError as exc:
                self._unready = exc.message
                return False
            self._unready = None
        return await self.adapter.is_ready()

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        return self.adapter.generate(request)

    async def lora_engine(self) -> Engine:
        """The engine that serves this model's LoRA requests: the C++ adapter's choice (an ensemble
        older than v0.15 sends them to its engine model), or the llmapi adapter itself."""
        await self.ensure_ready()
        adapter = self.adapter
        if isinstance(adapter, TritonAdapter):
            return await adapter.lora_engine()
        return adapter

    async def close(self) -> None:
        if self._adapter is not None:
            await self._adapter.close()


def adapter_for(pool: TritonPool, model: ServedModel) -> TritonModel:
    """The engine of one served model (its contract detected when Triton first answers, its route
    then chosen unless forced): the one place the app and `gateway check` build it."""
    return TritonModel(pool, model)


async def probe_contracts(pool: TritonPool, models: list[ServedModel]) -> list[str]:
    """Start-up check, before the port is bound: one line for each model whose Triton model
    Triton serves but the gateway cannot (a Triton not up yet is no error: it may start later)."""
    problems = []
    for model in models:
        engine = TritonModel(pool, model)
        try:
            await engine.detect()
        except UnsupportedModelError as exc:
            problems.append(f"model {model.name!r}: {exc.message}")
        except GatewayError:
            continue
    return problems
