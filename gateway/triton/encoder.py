"""`TritonEncoder`: the Encoder protocol over a Triton encoder model (an ONNX Runtime, TensorRT or
Python model that embeds or scores). Its layout is read once from the model config, never guessed:

- token ids in: `input_ids` and `attention_mask` (and `token_type_ids` where declared), INT32 or
  INT64, as optimum's and sentence-transformers' ONNX exports (and TensorRT engines built from
  them) declare them; or text in: one BYTES input (`text_input`, `TEXT`, ...);
- out: per-token hidden states (`last_hidden_state`, `token_embeddings`: [batch, tokens, hidden]),
  which the gateway pools, or one vector per input (`sentence_embedding`, `embeddings`, a
  classifier's `logits`: [batch, width]).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2

from gateway.config import ServedModel
from gateway.encoder import EncoderInfo, EncoderInput
from gateway.errors import EngineError, EngineUnavailableError, GatewayError, ServerConfigError
from gateway.routing.base import RouteRequest
from gateway.triton.connection import is_connection_failure, rpc_error
from gateway.triton.pool import Endpoint, TritonPool, read_model_config

logger = logging.getLogger(__name__)

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
TOKEN_TYPE_IDS = "token_type_ids"
# BERT's pooler (a dense layer and tanh over [CLS]) is what optimum exports beside the hidden
# states; it is not a sentence embedding, so the hidden states are pooled instead.
BERT_POOLER = "pooler_output"
# A model without batching (max_batch_size 0) whose batch dimension is free: inputs per request.
UNBATCHED_CHUNK = 32
_ID_TYPES = {mc.TYPE_INT32: np.int32, mc.TYPE_INT64: np.int64}
_OUT_TYPES = {"FP32": np.float32, "FP16": np.float16}


class EncoderContractError(ServerConfigError):
    """A Triton model that is no encoder layout the gateway knows."""


def _declares(config: mc.ModelConfig) -> str:
    backend = config.backend or config.platform or "?"
    inputs = ", ".join(f"{i.name} {mc.DataType.Name(i.data_type)}{list(i.dims)}" for i in config.input)
    outputs = ", ".join(f"{o.name} {mc.DataType.Name(o.data_type)}{list(o.dims)}" for o in config.output)
    return f"backend {backend}, max_batch_size {config.max_batch_size}, inputs {inputs}; outputs {outputs}"


def _unbatched(dims: Sequence[int], batched: bool) -> tuple[int, ...]:
    """A tensor's dims without the batch dimension (explicit in a model without batching)."""
    return tuple(dims) if batched else tuple(dims[1:])


def read_encoder_info(config: mc.ModelConfig, output: str | None = None) -> EncoderInfo:
    """The encoder layout a model config declares, or EncoderContractError naming what it declares.
    `output`: the output to read (default: the pooled one where there is one, else the per-token one)."""
    batched = config.max_batch_size > 0
    where = f"Triton model {config.name!r} ({_declares(config)})"
    if not batched and any(len(i.dims) == 0 for i in config.input):
        raise EncoderContractError(f"{where}: inputs without a batch dimension")
    inputs = {i.name: i for i in config.input}
    takes: str
    max_length = None
    token_types = False
    if INPUT_IDS in inputs:
        ids = inputs[INPUT_IDS]
        if ATTENTION_MASK not in inputs:
            raise EncoderContractError(f"{where}: input_ids without attention_mask")
        for name in (INPUT_IDS, ATTENTION_MASK, TOKEN_TYPE_IDS):
            if name in inputs and inputs[name].data_type not in _ID_TYPES:
                raise EncoderContractError(f"{where}: {name} must be INT32 or INT64")
        dims = _unbatched(ids.dims, batched)
        if len(dims) != 1:
            raise EncoderContractError(f"{where}: input_ids must be [batch, tokens]")
        max_length = dims[0] if dims[0] > 0 else None
        token_types = TOKEN_TYPE_IDS in inputs
        extra = set(inputs) - {INPUT_IDS, ATTENTION_MASK, TOKEN_TYPE_IDS}
        required = [n for n in extra if not inputs[n].optional]
        if required:
            raise EncoderContractError(
                f"{where}: inputs the gateway cannot fill: {', '.join(sorted(required))}"
            )
        takes, input_name = "ids", INPUT_IDS
    else:
        texts = [i for i in config.input if i.data_type == mc.TYPE_STRING]
        if len(config.input) != 1 or len(texts) != 1:
            raise EncoderContractError(
                f"{where}: an encoder takes input_ids and attention_mask (INT32 or INT64), "
                "or one BYTES text input"
            )
        takes, input_name = "text", texts[0].name
    floats = [o for o in config.output if mc.DataType.Name(o.data_type).removeprefix("TYPE_") in _OUT_TYPES]
    if output is not None:
        floats = [o for o in floats if o.name == output]
        if not floats:
            raise EncoderContractError(f"{where}: no FP32 or FP16 output named {output!r}")
    tokens = [o for o in floats if len(_unbatched(o.dims, batched)) == 2]
    pooled = [o for o in floats if len(_unbatched(o.dims, batched)) == 1]
    if tokens and output is None:
        pooled = [o for o in pooled if o.name != BERT_POOLER]
    if takes == "text":
        tokens = []  # the gateway's token count of a text input need not be the model's
    if len(pooled) > 1 or (not pooled and len(tokens) > 1):
        names = ", ".join(o.name for o in (pooled or tokens))
        raise EncoderContractError(f"{where}: several outputs could be the embedding ({names}); name one")
    chosen = pooled[0] if pooled else tokens[0] if tokens else None
    if chosen is None:
        raise EncoderContractError(
            f"{where}: no FP32 or FP16 output of shape [batch, width] or [batch, tokens, hidden]"
        )
    width = _unbatched(chosen.dims, batched)[-1]
    if batched:
        max_batch = config.max_batch_size
    else:
        first = config.input[0].dims[0]
        max_batch = first if first > 0 else UNBATCHED_CHUNK
    return EncoderInfo(
        model=config.name,
        takes=takes,  # type: ignore[arg-type]
        returns="pooled" if pooled else "tokens",
        max_batch_size=max_batch,
        width=width if width > 0 else None,
        max_length=max_length,
        token_types=token_types,
        inputs=frozenset(inputs),
        outputs=frozenset(o.name for o in config.output),
        input_name=input_name,
        output_name=chosen.name,
    )


def _append(request: service_pb2.ModelInferRequest, name: str, dtype: str, array: np.ndarray) -> None:
    request.inputs.append(
        service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype=dtype, shape=list(array.shape))
    )
    request.raw_input_contents.append(array.tobytes())


def _bytes_tensor(values: Sequence[str]) -> bytes:
    parts = []
    for value in values:
        encoded = value.encode("utf-8")
        parts.append(len(encoded).to_bytes(4, "little") + encoded)
    return b"".join(parts)


class TritonEncoder:
    """One served encoder model over the shared pool of Triton endpoints."""

    def __init__(self, pool: TritonPool, model: ServedModel) -> None:
        self._pool = pool
        self._model = model.triton_model
        self._output = model.encoder_output
        self._info: EncoderInfo | None = None
        self._dtypes: dict[str, str] = {}
        self._batched = True
        self._text_dims = 1
        self._lock = asyncio.Lock()

    @property
    def info(self) -> EncoderInfo:
        if self._info is None:
            raise EngineUnavailableError(f"Triton model {self._model!r} is not available yet")
        return self._info

    async def ensure_ready(self) -> None:
        if self._info is not None:
            return
        async with self._lock:
            if self._info is not None:
                return
            config = await read_model_config(self._pool, self._model)
            info = read_encoder_info(config, self._output)
            self._dtypes = {
                i.name: mc.DataType.Name(i.data_type).removeprefix("TYPE_").replace("STRING", "BYTES")
                for i in config.input
            }
            self._batched = config.max_batch_size > 0
            text = next((i for i in config.input if i.name == info.input_name), None)
            self._text_dims = len(text.dims) if text is not None else 1
            self._info = info

    async def is_ready(self) -> bool:
        try:
            await self.ensure_ready()
            endpoint = self._pool.pick()
            return await endpoint.connection.model_ready(self._model)
        except (GatewayError, grpc.aio.AioRpcError):
            return False

    def _request(self, batch: Sequence[EncoderInput]) -> tuple[service_pb2.ModelInferRequest, list[int]]:
        info = self.info
        request = service_pb2.ModelInferRequest(model_name=self._model)
        request.outputs.append(
            service_pb2.ModelInferRequest.InferRequestedOutputTensor(name=info.output_name)
        )
        if info.takes == "text":
            texts = [item.text or "" for item in batch]
            shape = [len(texts), 1] if (self._batched or self._text_dims == 2) else [len(texts)]
            request.inputs.append(
                service_pb2.ModelInferRequest.InferInputTensor(
                    name=info.input_name, datatype=self._dtypes[info.input_name], shape=shape
                )
            )
            request.raw_input_contents.append(_bytes_tensor(texts))
            return request, [1] * len(batch)
        lengths = [len(item.ids) for item in batch]
        width = info.max_length or max(lengths)
        ids = np.zeros((len(batch), width), dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.int64)
        types = np.zeros((len(batch), width), dtype=np.int64)
        for row, item in enumerate(batch):
            ids[row, : len(item.ids)] = item.ids
            mask[row, : len(item.ids)] = 1
            if item.type_ids is not None:
                types[row, : len(item.type_ids)] = item.type_ids
        tensors = [(INPUT_IDS, ids), (ATTENTION_MASK, mask)]
        if info.token_types:
            tensors.append((TOKEN_TYPE_IDS, types))
        for name, array in tensors:
            dtype = self._dtypes[name]
            _append(request, name, dtype, array.astype(np.int32 if dtype == "INT32" else np.int64))
        return request, lengths

    async def encode(self, inputs: Sequence[EncoderInput], *, affinity: str | None = None) -> list[Any]:
        await self.ensure_ready()
        size = self.info.max_batch_size
        chunks = [inputs[i : i + size] for i in range(0, len(inputs), size)]
        results = await asyncio.gather(*(self._infer(chunk, affinity) for chunk in chunks))
        return [vector for chunk in results for vector in chunk]

    async def _infer(self, batch: Sequence[EncoderInput], affinity: str | None) -> list[Any]:
        request, lengths = self._request(batch)
        route = RouteRequest(batch[0].ids, None, affinity, None)
        tried: list[Endpoint] = []
        while True:
            endpoint = self._pool.pick(tried, route)
            tried.append(endpoint)
            endpoint.begin()
            try:
                response = await endpoint.connection.stub.ModelInfer(request)
            except grpc.aio.AioRpcError as exc:
                if is_connection_failure(exc) and len(tried) < len(self._pool.endpoints):
                    self._pool.failed(endpoint, exc.details() or exc.code().name)
                    continue
                raise rpc_error(exc, self._model) from None
            finally:
                endpoint.end()
            self._pool.succeeded(endpoint)
            return self._vectors(response, lengths)

    def _vectors(self, response: service_pb2.ModelInferResponse, lengths: list[int]) -> list[Any]:
        info = self.info
        for index, tensor in enumerate(response.outputs):
            if tensor.name != info.output_name:
                continue
            dtype = _OUT_TYPES.get(tensor.datatype)
            if dtype is None or index >= len(response.raw_output_contents):
                break
            array = np.frombuffer(response.raw_output_contents[index], dtype=dtype).astype(np.float32)
            shape = tuple(tensor.shape)
            try:
                array = array.reshape(shape)
            except ValueError:
                break
            if info.returns == "pooled":
                array = array.reshape(len(lengths), -1)
                return [array[i] for i in range(len(lengths))]
            array = array.reshape(len(lengths), -1, shape[-1])
            return [array[i, : lengths[i]] for i in range(len(lengths))]
        raise EngineError(f"model {self._model!r} returned no readable {info.output_name!r} output")

    async def close(self) -> None:
        """The pool's connections are the app's to close."""
