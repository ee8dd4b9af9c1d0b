"""One Triton gRPC endpoint, and the mapping of its failures to the gateway's errors.

The gateway speaks Triton's gRPC service through tritonclient's generated stubs rather than its
client class: the client refuses the reserved `triton_enable_empty_final_response` parameter
that decoupled streaming relies on, and building the protobufs directly skips a copy per request.
The channel is created lazily inside the running event loop (a grpc.aio channel belongs to the
loop it was made on) and reconnects by itself after Triton restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import TypeAlias

import grpc
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from gateway.errors import (
    ContextLengthExceededError,
    DeadlineExceededError,
    EngineError,
    EngineUnavailableError,
    GatewayError,
)

# Keepalive pings within what Triton's gRPC server accepts by default: it takes at most one ping per
# 5 minutes while it sends no data (--grpc-http2-min-recv-ping-interval-without-data=300000), none
# without a call (--grpc-keepalive-permit-without-calls=false), and after two strikes it closes the
# connection with GOAWAY "too_many_pings", failing every stream on it. Pinging an idle channel every
# 30 s did exactly that every 90 s; a stream queued for minutes could have been cut the same way.
# Hung calls are bounded by the request deadline instead.
KEEPALIVE_TIME_MS = 300_000
# Triton answers with large configs and tensors; gRPC's 4 MB default is too small for logits.
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 0),
    # After Triton restarts, reconnect within seconds rather than gRPC's default of up to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
]

# How long an opened, unused ModelStreamInfer call is kept for the next request. Well under the
# keepalive time: an open call makes the channel ping, and an idle gateway should not.
SPARE_STREAM_MAX_AGE_S = 30.0

Stream: TypeAlias = (
    "grpc.aio.StreamStreamCall[service_pb2.ModelInferRequest, service_pb2.ModelStreamInferResponse]"
)


class TritonConnection:
    def __init__(self, url: str, *, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: service_pb2_grpc.GRPCInferenceServiceStub | None = None
        self._spare: Stream | None = None
        # Cancels the open call if no request takes it in time (cancelled when one does).
        self._spare_expiry: asyncio.TimerHandle | None = None
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def stub(self) -> service_pb2_grpc.GRPCInferenceServiceStub:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(self.url, options=CHANNEL_OPTIONS)
            self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        return self._stub

    def open_stream(self, metadata: tuple[tuple[str, str], ...] | None = None) -> Stream:
        """A ModelStreamInfer call for one request, written with `write` (no request iterator).

        A new call sends its headers first and may only write the request once gRPC reports
        them sent: a task and a round trip through gRPC's completion queue, a large share of the
        gateway's time to first token at low load. So a call is opened ahead of need: a request
        takes the open one and the next is opened behind it, after this request's write has
        started. A call with its own metadata (trace context) is opened when asked for.
        """
        if metadata is not None:
            return self.stub.ModelStreamInfer(metadata=metadata)
        spare = self._take_spare()
        # Requests arriving in the same loop turn each schedule this; the first one opens the call.
        asyncio.get_running_loop().call_soon(self._replenish)
        if spare is not None and not spare.done():
            return spare
        return self.stub.ModelStreamInfer()

    def _take_spare(self) -> Stream | None:
        spare, self._spare = self._spare, None
        if self._spare_expiry is not None:
            self._spare_expiry.cancel()
            self._spare_expiry = None
        return spare

    def _replenish(self) -> None:
        if self._spare is not None or self._channel is None:
            return
        self._spare = self.stub.ModelStreamInfer()
        self._spare_expiry = asyncio.get_running_loop().call_later(SPARE_STREAM_MAX_AGE_S, self._retire)

    def _retire(self) -> None:
        spare = self._take_spare()
        if spare is not None:
            # Nothing was written on it: cancelling ends it without a request inside Triton.
            spare.cancel()

    def end_stream(self, call: Stream) -> None:
        """Half-close a call whose request has its final response, as a request iterator's end
        would; in the background, so the end of the client's stream does not wait for it."""
        if call.done():
            return
        task = asyncio.ensure_future(_half_close(call))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def server_ready(self) -> bool:
        response = await self.stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=self.timeout_s)
        return bool(response.ready)

    async def model_ready(self, model: str) -> bool:
        response = await self.stub.ModelReady(
            service_pb2.ModelReadyRequest(name=model), timeout=self.timeout_s
        )
        return bool(response.ready)

    async def model_config(self, model: str) -> model_config_pb2.ModelConfig:
        response = await self.stub.ModelConfig(
            service_pb2.ModelConfigRequest(name=model), timeout=self.timeout_s
        )
        return response.config

    async def close(self) -> None:
        self._retire()
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub = None


async def _half_close(call: Stream) -> None:
    # The call may end (or be cancelled) meanwhile; its outcome was already read.
    with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
        await call.done_writing()


def is_connection_failure(exc: BaseException) -> bool:
    """Failures that say nothing about the request itself: another endpoint may serve it."""
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE


# How engines word a prompt longer than the model takes, where the gateway's own check did not know
# the engine's limit: TensorRT-LLM's LLM API (PyTorch and TensorRT backends), and the C++ backend's
# "input length N + request_output_len M exceeds ... maximum sequence length".
TOO_LONG = re.compile(
    r"(prompt|input)[^.]*(length|tokens?)[^.]*(exceed|greater than|longer than|too long)"
    r"|exceeds? (the )?max_(seq_len|num_tokens|input_len)",
    re.IGNORECASE,
)


def too_long_error(detail: str) -> ContextLengthExceededError:
    # The engine does not know which field held the prompt (messages, prompt, input).
    return ContextLengthExceededError(f"The prompt is longer than this model accepts: {detail}")


def rpc_error(exc: BaseException | str, model: str, url: str | None = None) -> GatewayError:
    """Map a gRPC failure, or an error message in a stream response, to the gateway's errors.
    With `url` (operators' messages, not clients'), an unreachable Triton is named with gRPC's reason."""
    if isinstance(exc, grpc.aio.AioRpcError):
        code = exc.code()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
            if url is not None:
                return EngineUnavailableError(f"Triton at {url} is unavailable: {unavailable_reason(exc)}")
            return EngineUnavailableError(f"Triton is unavailable ({code.name.lower()})")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return DeadlineExceededError("the request timed out in Triton")
        if code == grpc.StatusCode.NOT_FOUND:
            return EngineUnavailableError(f"model {model!r} is not available in Triton: {exc.details()}")
        if TOO_LONG.search(exc.details() or ""):
            return too_long_error(exc.details() or "")
        return EngineError(f"Triton failed the request: {exc.details()}")
    message = str(exc)
    lowered = message.lower()
    if "unknown model" in lowered or "not ready" in lowered or "unavailable" in lowered:
        return EngineUnavailableError(f"model {model!r} is not available in Triton: {message}")
    if TOO_LONG.search(message):
        return too_long_error(message)
    return EngineError(f"Triton failed the request: {message}")


def unavailable_reason(exc: grpc.aio.AioRpcError) -> str:
    """gRPC's own words for why a channel is down (refused, DNS, not a gRPC server), plus a hint
    for the mistake behind the last: Triton's HTTP port given for its gRPC port."""
    details = (exc.details() or exc.code().name.lower()).strip()
    lowered = details.lower()
    if "parsing http/2" in lowered or "http/1" in lowered:
        details += " (is this Triton's HTTP port? The gateway speaks gRPC: 8001 by default)"
    return details
