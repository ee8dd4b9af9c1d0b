"""One Triton gRPC endpoint, and the mapping of its failures to the gateway's errors.

The gateway speaks Triton's gRPC service through tritonclient's generated stubs rather than its
client class: the client refuses the reserved `triton_enable_empty_final_response` parameter
that decoupled streaming relies on, and building the protobufs directly skips a copy per request.
The channel is created lazily inside the running event loop (a grpc.aio channel belongs to the
loop it was made on) and reconnects by itself after Triton restarts.
"""

from __future__ import annotations

import grpc
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from gateway.errors import DeadlineExceededError, EngineError, EngineUnavailableError, GatewayError

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


class TritonConnection:
    def __init__(self, url: str, *, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: service_pb2_grpc.GRPCInferenceServiceStub | None = None

    @property
    def stub(self) -> service_pb2_grpc.GRPCInferenceServiceStub:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(self.url, options=CHANNEL_OPTIONS)
            self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        return self._stub

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
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub = None


def is_connection_failure(exc: BaseException) -> bool:
    """Failures that say nothing about the request itself: another endpoint may serve it."""
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE


def rpc_error(exc: BaseException | str, model: str) -> GatewayError:
    """Map a gRPC failure, or an error message in a stream response, to the gateway's errors."""
    if isinstance(exc, grpc.aio.AioRpcError):
        code = exc.code()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
            return EngineUnavailableError(f"Triton is unavailable ({code.name.lower()})")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return DeadlineExceededError("the request timed out in Triton")
        if code == grpc.StatusCode.NOT_FOUND:
            return EngineUnavailableError(f"model {model!r} is not available in Triton: {exc.details()}")
        return EngineError(f"Triton failed the request: {exc.details()}")
    message = str(exc)
    lowered = message.lower()
    if "unknown model" in lowered or "not ready" in lowered or "unavailable" in lowered:
        return EngineUnavailableError(f"model {model!r} is not available in Triton: {message}")
    return EngineError(f"Triton failed the request: {message}")
