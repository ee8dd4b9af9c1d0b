"""`LlmapiAdapter`: the Engine protocol over TensorRT-LLM's `llmapi` model, one gRPC stream per
request (n is n requests, each with its own seed).

Cumulative text becomes exact deltas (gateway.text.cumulative); stop strings are the gateway's
(the core cancels the request by closing its stream, which the model notices within its 100 ms
cancellation period). Every request is bounded: the newest model.py answers nothing at all for
some errors (logged in Triton only), so a stream that stays silent for the pool's stream idle
timeout fails with a timeout (504) and is cancelled, rather than waiting forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator

import grpc

from gateway import tracing
from gateway.asyncutil import merge
from gateway.engine import EngineInfo, GenerationDelta, GenerationRequest
from gateway.errors import DeadlineExceededError, EngineError, EngineUnavailableError
from gateway.routing.base import RouteRequest
from gateway.text.cumulative import CumulativeText, NotCumulativeError
from gateway.triton.connection import is_connection_failure, rpc_error
from gateway.triton.llmapi import (
    LlmapiContract,
    build_llmapi_request,
    llmapi_error,
    parse_llmapi_response,
    read_llmapi_contract,
)
from gateway.triton.pool import Endpoint, TritonPool, read_model_config

logger = logging.getLogger(__name__)

# Without a configured stream idle timeout, still no request waits forever for a model that
# dropped it.
DEFAULT_SILENCE_S = 600.0


class LlmapiAdapter:
    def __init__(self, pool: TritonPool, model: str, *, vision: bool = False) -> None:
        """`vision`: the checkpoint has a vision tower. The model's config declares `image_url`
        whether or not its model.yaml turns multimodal on; a text-only checkpoint takes no images."""
        self._pool = pool
        self._model = model
        self._vision = vision
        self._contract: LlmapiContract | None = None
        self._info: EngineInfo | None = None
        self._lock = asyncio.Lock()
        self.unready_reason: str | None = None

    @property
    def contract(self) -> LlmapiContract:
        if self._contract is None:
            raise EngineUnavailableError(f"Triton model {self._model!r} is not available yet")
        return self._contract

    @property
    def info(self) -> EngineInfo:
        if self._info is None:
            self._info = self.contract.capabilities(vision=self._vision)
        return self._info

    async def introspect(self) -> LlmapiContract:
        async with self._lock:
            if self._contract is not None:
                return self._contract
            self._contract = read_llmapi_contract(await read_model_config(self._pool, self._model))
            logger.info(
                "model %s: llmapi contract, decoupled=%s, LoRA inputs=%s, images=%s",
                self._model,
                self._contract.decoupled,
                self._contract.lora,
                self._contract.images,
            )
            return self._contract

    async def ensure_ready(self) -> None:
        if self._contract is None:
            await self.introspect()

    async def is_ready(self) -> bool:
        reasons = []
        for endpoint in self._pool.endpoints:
            try:
                ready = await endpoint.connection.model_ready(self._model)
            except grpc.aio.AioRpcError as exc:
                reasons.append(rpc_error(exc, self._model, url=endpoint.url).message)
                continue
            if ready:
                self.unready_reason = None
                return True
            reasons.append(f"Triton at {endpoint.url} has no model {self._model!r} ready")
        self.unready_reason = "; ".join(reasons) or None
        return False

    async def close(self) -> None:
        return None

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        contract = self.contract
        seed = request.params.seed
        if request.num_sequences == 1:
            return self._stream(contract, request, seed=seed, index=0)
        # The model has no `n`: one request per choice, each with its own seed so that sampled
        # choices differ (and stay reproducible for a given request seed).
        return merge(
            [
                self._stream(contract, request, seed=None if seed is None else (seed + i) % 2**64, index=i)
                for i in range(request.num_sequences)
            ]
        )

    async def _stream(
        self, contract: LlmapiContract, request: GenerationRequest, *, seed: int | None, index: int
    ) -> AsyncIterator[GenerationDelta]:
        request_id = str(random.getrandbits(63))
        infer = build_llmapi_request(contract, request, request_id=request_id, seed=seed)
        single = not contract.decoupled
        silence = self._pool.stream_idle_s or DEFAULT_SILENCE_S
        # The prefix policy keys blocks by adapter and prefers endpoints that hold it.
        adapter = request.lora.task_id if request.lora is not None and contract.lora else None
        route = RouteRequest(request.prompt_ids, None, request.affinity, adapter)
        tried: list[Endpoint] = []
        while True:
            endpoint = self._pool.pick(tried, route)
            tried.append(endpoint)
            endpoint.begin()
            span = tracing.start_span(
                "triton.infer", model=self._model, endpoint=endpoint.url, request_id=request_id
            )
            connection = endpoint.connection
            call = connection.open_stream(span.grpc_metadata())
            text = CumulativeText()
            started = finished = False
            try:
                with contextlib.suppress(asyncio.InvalidStateError):
                    await call.write(infer)
                while True:
                    try:
                        response = await asyncio.wait_for(call.read(), silence)
                    except asyncio.TimeoutError:
                        # Not finished: the call is cancelled below, so a model that is only slow
                        # stops generating and Triton lets go of a request the model dropped.
                        raise DeadlineExceededError(
                            f"Triton sent nothing for {silence:g} s on this request; the model may have "
                            "dropped it (see Triton's log)"
                        ) from None
                    if response is grpc.aio.EOF:
                        finished = True
                        if not started:
                            raise EngineError("Triton ended the request without an answer")
                        break
                    if response.error_message:
                        finished = True
                        raise llmapi_error(response.error_message, self._model)
                    if not started:
                        self._pool.succeeded(endpoint)
                        started = True
                    parsed = parse_llmapi_response(response.infer_response)
                    delta = b""
                    if parsed.text is not None:
                        try:
                            delta = text.push(parsed.text)
                        except NotCumulativeError as exc:
                            finished = True
                            raise EngineError(f"model {self._model!r}: {exc}") from None
                    last = parsed.final or single
                    if last:
                        delta += text.finish()
                    cached = None
                    if parsed.reused_blocks is not None and contract.tokens_per_block is not None:
                        cached = parsed.reused_blocks * contract.tokens_per_block
                    if delta or parsed.finish_reason is not None or cached is not None:
                        yield GenerationDelta(
                            index=index, text=delta, finish_reason=parsed.finish_reason, cached_tokens=cached
                        )
                    if last:
                        finished = True
                        break
                return
            except grpc.aio.AioRpcError as exc:
                finished = True
                span.error(exc)
                if not started and is_connection_failure(exc) and len(tried) < len(self._pool.endpoints):
                    self._pool.failed(endpoint, exc.details() or exc.code().name)
                    continue
                raise rpc_error(exc, self._model) from None
            finally:
                if finished:
                    connection.end_stream(call)
                else:
                    # Closed early (a stop string, a client gone, a deadline): cancelling the call
                    # cancels the request in Triton, which the model polls for.
                    call.cancel()
                endpoint.end()
                span.end()
