"""Response helpers shared by the generation routers: SSE framing and disconnect handling."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from fastapi import Request
from sse_starlette import EventSourceResponse

from gateway.errors import InvalidRequestError

T = TypeVar("T")


def event_stream(request: Request, chunks: AsyncIterator[str]) -> EventSourceResponse:
    """sse-starlette frames each `data:` event; when the client goes away it cancels the task that
    iterates `chunks`, which closes the engine stream and so cancels the Triton request."""

    async def events() -> AsyncIterator[dict[str, str]]:
        async for data in chunks:
            yield {"data": data}

    ping = request.app.state.settings.sse_ping_s
    return EventSourceResponse(events(), sep="\n", ping=ping if ping > 0 else 0)


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Run a non-streaming generation, cancelling it (and its Triton request) if the client leaves."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                task.cancel()
                return

    watcher = asyncio.create_task(watch())
    try:
        return await task
    except asyncio.CancelledError:
        if watcher.done():
            # The client is gone; nobody reads this error, but the status is logged as 499-like.
            raise InvalidRequestError("client disconnected") from None
        raise
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
