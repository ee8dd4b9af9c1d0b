"""One Triton gRPC endpoint and the mapping of its failures to the gateway's errors."""

from __future__ import annotations

import grpc
import tritonclient.grpc.aio as grpc_aio
from tritonclient.utils import InferenceServerException

from gateway.errors import DeadlineExceededError, EngineError, EngineUnavailableError, GatewayError


class TritonConnection:
    """One Triton gRPC endpoint. The channel reconnects by itself after Triton restarts."""

    def __init__(self, url: str, *, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.client = grpc_aio.InferenceServerClient(url)

    async def close(self) -> None:
        await self.client.close()


def is_connection_failure(exc: BaseException) -> bool:
    """Failures that say nothing about the request itself: another endpoint may serve it."""
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE


def rpc_error(exc: BaseException, model: str) -> GatewayError:
    """Map a gRPC or Triton failure to the gateway's errors (the one mapping lives in errors.py)."""
    if isinstance(exc, grpc.aio.AioRpcError):
        code = exc.code()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
            return EngineUnavailableError(f"Triton is unavailable ({code.name.lower()})")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return DeadlineExceededError("the request timed out in Triton")
        return EngineError(f"Triton failed the request: {exc.details()}")
    message = exc.message() if isinstance(exc, InferenceServerException) else str(exc)
    lowered = (message or "").lower()
    if "unknown model" in lowered or "not ready" in lowered or "unavailable" in lowered:
        return EngineUnavailableError(f"model {model!r} is not available in Triton: {message}")
    return EngineError(f"Triton failed the request: {message}")
