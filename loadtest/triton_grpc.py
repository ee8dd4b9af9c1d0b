"""Direct Triton gRPC streaming target: the floor any Python gateway can reach.

One `ModelStreamInfer` stream per request (so cancellation stays per request, as in the gateway),
`triton_enable_empty_final_response` on, and the stream is finished at the response that carries
`triton_final_response`. Only inputs the model declares are sent (read once from its metadata).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcclient

from loadtest.metrics import RequestRecord
from loadtest.target import detail, error_kind
from loadtest.workload import Prompt, Workload

_FINAL = "triton_final_response"


def _scalar(name: str, dtype: str, value: Any) -> grpcclient.InferInput:
    np_dtype = {"INT32": np.int32, "BOOL": np.bool_, "FP32": np.float32, "UINT64": np.uint64}[dtype]
    tensor = grpcclient.InferInput(name, [1, 1], dtype)
    tensor.set_data_from_numpy(np.array([[value]], dtype=np_dtype))
    return tensor


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
        self._client: grpcclient.InferenceServerClient | None = None
        self._inputs: set[str] = set()
        self._fixed: dict[int, list[grpcclient.InferInput]] = {}
        self._outputs: list[grpcclient.InferRequestedOutput] = []
        self._count_tokens = False

    async def open(self, max_concurrency: int) -> None:
        self._client = grpcclient.InferenceServerClient(self._url)
        meta = await self._client.get_model_metadata(self._model, as_json=True)
        self._inputs = {i["name"] for i in meta.get("inputs", [])}
        outputs = {o["name"] for o in meta.get("outputs", [])}
        for required in ("text_input", "max_tokens"):
            if required not in self._inputs:
                raise ValueError(f"model {self._model!r} has no {required!r} input; is it the ensemble?")
        self._count_tokens = "return_num_output_tokens" in self._inputs and "num_output_tokens" in outputs
        wanted = ["text_output"] + (["num_output_tokens"] if self._count_tokens else [])
        self._outputs = [grpcclient.InferRequestedOutput(n) for n in wanted]

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def _fixed_inputs(self, max_tokens: int) -> list[grpcclient.InferInput]:
        # The non-text tensors depend only on max_tokens; serialise them once, not per request.
        cached = self._fixed.get(max_tokens)
        if cached is not None:
            return cached
        w = self._workload
        have = self._inputs
        tensors = [_scalar("max_tokens", "INT32", max_tokens)]
        if "stream" in have:
            tensors.append(_scalar("stream", "BOOL", True))
        if "exclude_input_in_output" in have:
            tensors.append(_scalar("exclude_input_in_output", "BOOL", True))
        if self._count_tokens:
            tensors.append(_scalar("return_num_output_tokens", "BOOL", True))
        if w.ignore_eos:
            # The ensemble has no ignore_eos: forcing the minimum length to the maximum is the equivalent.
            for name in ("min_tokens", "min_length"):
                if name in have:
                    tensors.append(_scalar(name, "INT32", max_tokens))
                    break
        if w.temperature is not None and "temperature" in have:
            tensors.append(_scalar("temperature", "FP32", w.temperature))
        self._fixed[max_tokens] = tensors
        return tensors

    async def send(self, prompt: Prompt) -> RequestRecord:
        client = self._client
        if client is None:
            raise RuntimeError("TritonGrpcTarget.send before open()")
        text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[prompt.text.encode()]], dtype=np.object_))
        request = {
            "model_name": self._model,
            "inputs": [text, *self._fixed_inputs(self._workload.max_tokens_for(prompt))],
            "outputs": self._outputs,
            "parameters": {"triton_enable_empty_final_response": True},
        }
        finished = asyncio.Event()

        async def requests() -> AsyncIterator[dict[str, Any]]:
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
        call = client.stream_infer(requests(), stream_timeout=self._timeout)
        try:
            async for result, err in call:
                now = perf()
                if err is not None:
                    error, error_msg = "triton_error", detail(err.message())
                    break
                response = result.get_response()
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
                final = response.parameters.get(_FINAL)
                if final is not None and final.bool_param:
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
