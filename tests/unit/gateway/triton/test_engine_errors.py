"""An engine's own refusal of a prompt longer than it takes is the client's 400, on every contract:
the gateway's check ahead of the engine may not know the engine's limit."""

from __future__ import annotations

import grpc
import pytest

from gateway.errors import ContextLengthExceededError, EngineError
from gateway.triton.connection import rpc_error

# The C++ backend's (and the CPU engine's) words, and the LLM API's.
TOO_LONG = [
    "in ensemble 'ensemble', input length 7605 + request_output_len 7000 exceeds the model's maximum "
    "sequence length 8192",
    "The sum of prompt length (9000) and query length (0) should not exceed max_num_tokens (8192)",
]


class _RpcError(grpc.aio.AioRpcError):
    def __init__(self, details: str) -> None:
        super().__init__(grpc.StatusCode.INVALID_ARGUMENT, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


@pytest.mark.parametrize("message", TOO_LONG)
def test_a_too_long_prompt_the_engine_refuses_is_a_400_in_a_stream_and_as_an_rpc_error(message: str) -> None:
    for error in (rpc_error(message, "m"), rpc_error(_RpcError(message), "m")):
        assert isinstance(error, ContextLengthExceededError) and error.status_code == 400
        assert error.code == "context_length_exceeded" and message in error.message


def test_other_engine_failures_stay_engine_errors() -> None:
    error = rpc_error("in ensemble 'ensemble', CUDA out of memory", "m")
    assert type(error) is EngineError and error.status_code >= 500
