"""Direct Triton gRPC streaming target: the floor any Python gateway can reach.

One `ModelStreamInfer` stream per request (so cancellation stays per request, as in the gateway),
`triton_enable_empty_final_response` on, and the stream is finished at the response that carries
`triton_final_response`. Only inputs the model declares are sent (read once from its metadata).

It uses tritonclient's generated gRPC stubs and protobufs on a grpc.aio channel rather than
`tritonclient.grpc.aio.InferenceServerClient.stream_infer`: that helper (2.73) rejects every
`triton_`-prefixed request parameter ("is a reserved parameter and cannot be specified"), so it cannot
ask for the empty final response. Building the request protobuf once and copying it per request is
also the leanest Python can do, which is what a floor should be.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from loadtest.metrics import RequestRecord
from loadtest.target import detail, error_kind
from loadtest.workload import Prompt, Workload

_FINAL = "triton_final_response"
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.max_receive_message_length", 2**31 - 1),
]
_PACK = {"INT32": "<i", "BOOL": "?", "FP32": "<f", "UINT64": "<Q"}


def _add_scalar(request: service_pb2.ModelInferRequest, name: str, dtype: str, value: object) -> None:
    tensor = request.inputs.add()
    tensor.name = name
    tensor.datatype = dtype
    tensor.shape.extend([1, 1])
    request.raw_input_contents.append(struct.pack(_PACK[dtype], value))


def _bytes_element(data: bytes) -> bytes:
    # BYTES tensors travel as a 4-byte little-endian length, then the bytes.
    return struct.pack("<I", len(data)) + data


class TritonGrpcTarget:
    def __init__(
        self,
        url: str,
        model: str,
        workload: Workload,
        *,
        timeout: float = 300.0,
        name: str = "triton-grpc",
    ) -> None:
        if not workload.stream:
            raise ValueError("the Triton gRPC target streams only (decoupled models need ModelStreamInfer)")
        self.name = name
        self._url = url
        self._model = model
        self._workload = workload
        self._timeout = timeout
        self._channel: grpc.aio.Channel | None = None
        self._stub: service_pb2_grpc.GRPCInferenceServiceStub | None = None
        self._inputs: set[str] = set()
        self._templates: dict[int, service_pb2.ModelInferRequest] = {}
        self._count_tokens = False

    async def open(self, max_concurrency: int) -> None:
        self._channel = grpc.aio.insecure_channel(self._url, options=_CHANNEL_OPTIONS)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        meta = await self._stub.ModelMetadata(service_pb2.ModelMetadataRequest(name=self._model))
        self._inputs = {i.name for i in meta.inputs}
        outputs = {o.name for o in meta.outputs}
        for required in ("text_input", "max_tokens"):
            if required not in self._inputs:
                raise ValueError(f"model {self._model!r} has no {required!r} input; is it the ensemble?")
        self._count_tokens = "return_num_output_tokens" in self._inputs and "num_output_tokens" in outputs

    async def aclose(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub = None

    def _template(self, max_tokens: int) -> service_pb2.ModelInferRequest:
        """Everything but the prompt, built once per max_tokens; text_input is input 0."""
        cached = self._templates.get(max_tokens)
        if cached is not None:
            return cached
        w = self._workload
        have = self._inputs
        req = service_pb2.ModelInferRequest(model_name=self._model)
        text = req.inputs.add()
        text.name = "text_input"
        text.datatype = "BYTES"
        text.shape.extend([1, 1])
        req.raw_input_contents.append(b"")
        _add_scalar(req, "max_tokens", "INT32", max_tokens)
        if "stream" in have:
            _add_scalar(req, "stream", "BOOL", True)
        if "exclude_input_in_output" in have:
            _add_scalar(req, "exclude_input_in_output", "BOOL", True)
        if self._count_tokens:
            _add_scalar(req, "return_num_output_tokens", "BOOL", True)
        if w.ignore_eos:
            # The ensemble has no ignore_eos: forcing the minimum length to the maximum is the equivalent.
            for name in ("min_tokens", "min_length"):
                if name in have:
                    _add_scalar(req, name, "INT32", max_tokens)
                    break
        if w.temperature is not None and "temperature" in have:
            _add_scalar(req, "temperature", "FP32", w.temperature)
        for out_name in ["text_output"] + (["num_output_tokens"] if self._count_tokens else []):
            req.outputs.add().name = out_name
        req.parameters["triton_enable_empty_final_response"].bool_param = True
        self._templates[max_tokens] = req
        return req

    async def send(self, prompt: Prompt) -> RequestRecord:
        stub = self._stub
        if stub is None:
            raise RuntimeError("TritonGrpcTarget.send before open()")
        request = service_pb2.ModelInferRequest()
        request.CopyFrom(self._template(self._workload.max_tokens_for(prompt)))
        request.raw_input_contents[0] = _bytes_element(prompt.text.encode())
        finished = asyncio.Event()

        async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
            yield request
            # Keep our half of the stream open until the final response, as a gateway would.
            await finished.wait()

        times: list[float] = []
        tokens = 0
        error: str | None = None
        error_msg: str | None = None
        count_tokens = self._count_tokens
        perf = time.perf_counter
        start = perf()
        end: float | None = None
        call = stub.ModelStreamInfer(requests(), timeout=self._timeout)
        try:
            async for message in call:
                now = perf()
                if message.error_message:
                    error, error_msg = "triton_error", detail(message.error_message)
                    break
                response = message.infer_response
                text_idx = ntok_idx = -1
                for i, out in enumerate(response.outputs):
                    if out.name == "text_output":
                        text_idx = i
                    elif out.name == "num_output_tokens":
                        ntok_idx = i
                # BYTES tensors are a 4-byte length then the bytes: anything longer carries text.
                if text_idx >= 0 and len(response.raw_output_contents[text_idx]) > 4:
                    times.append(now)
                if count_tokens and ntok_idx >= 0:
                    raw = response.raw_output_contents[ntok_idx]
                    tokens += int.from_bytes(raw[:4], "little", signed=True)
                params = response.parameters
                if _FINAL in params and params[_FINAL].bool_param:
                    end = now
                    break
            else:
                if error is None:
                    error, error_msg = "incomplete_stream", "the stream ended before triton_final_response"
        except Exception as exc:  # counted, never raised: see Target
            error, error_msg = error_kind(exc), detail(repr(exc))
        finally:
            finished.set()
        if end is None:
            end = perf()
        if error is None:
            # Read the stream's end (status OK) so the call completes instead of being left dangling.
            try:
                async for _ in call:
                    pass
            except Exception:  # the request already succeeded; a late stream status changes nothing
                pass
        else:
            call.cancel()
        return RequestRecord(
            start=start,
            end=end,
            chunk_times=tuple(times),
            output_tokens=tokens if count_tokens else len(times),
            prompt_tokens=prompt.prompt_tokens,
            usage_reported=count_tokens,
            streamed=True,
            error=error,
            error_detail=error_msg,
        )
