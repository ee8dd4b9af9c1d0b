"""The interface every measured client implements, and the shared error vocabulary."""

from __future__ import annotations

from typing import Protocol

from loadtest.metrics import RequestRecord
from loadtest.workload import Prompt

_DETAIL_LIMIT = 300


class Target(Protocol):
    """One way of reaching the model (OpenAI HTTP, Triton gRPC, Triton HTTP generate_stream).

    `send` never raises for a failed request: the failure is the record's `error` kind, so one bad
    request cannot abort a run and every failure is counted.
    """

    name: str

    async def open(self, max_concurrency: int) -> None: ...

    async def send(self, prompt: Prompt) -> RequestRecord: ...

    async def aclose(self) -> None: ...


def error_kind(exc: BaseException) -> str:
    """A short, bounded label for an exception (the error-count key)."""
    code = getattr(exc, "code", None)
    if callable(code):  # grpc.aio.AioRpcError
        try:
            status = code()
            return f"grpc_{getattr(status, 'name', status)}".lower()
        except Exception:  # a broken status object must not hide the original failure
            pass
    name = type(exc).__name__
    return {
        "ConnectError": "connect_error",
        "ConnectTimeout": "timeout",
        "ReadTimeout": "timeout",
        "WriteTimeout": "timeout",
        "PoolTimeout": "timeout",
        "TimeoutError": "timeout",
        "RemoteProtocolError": "connection_closed",
        "ReadError": "connection_closed",
        "WriteError": "connection_closed",
        "JSONDecodeError": "bad_json",
    }.get(name, name)


def detail(text: object) -> str:
    s = str(text)
    return s if len(s) <= _DETAIL_LIMIT else s[:_DETAIL_LIMIT] + "..."
