"""Small asyncio helpers shared by the serving layer and the Triton adapter."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TypeVar, cast

T = TypeVar("T")

_END = object()


def merge(streams: Sequence[AsyncIterator[T]]) -> AsyncIterator[T]:
    """Interleave several async iterators as their items arrive. Closing the merged iterator (or
    an error in one source) cancels every source, which is how engine requests get cancelled.

    A single stream is returned as it is: every wrapping generator costs each streamed token."""
    if len(streams) == 1:
        return streams[0]
    return _merge(streams)


async def _merge(streams: Sequence[AsyncIterator[T]]) -> AsyncIterator[T]:
    queue: asyncio.Queue[object] = asyncio.Queue()

    async def pump(stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                await queue.put(item)
        except Exception as exc:  # handed to the consumer, which re-raises it
            await queue.put(exc)
            return
        await queue.put(_END)

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    try:
        remaining = len(tasks)
        while remaining:
            got: object = await queue.get()
            if got is _END:
                remaining -= 1
            elif isinstance(got, Exception):
                raise got
            else:
                yield cast(T, got)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def until_deadline(stream: AsyncIterator[T], deadline: float | None) -> AsyncIterator[T]:
    """Iterate `stream` until the loop-time `deadline`, then raise TimeoutError.

    The timeout wraps only the wait for the next item, so it can only ever cancel the producer
    (whose cleanup cancels the engine request), never the consumer's own writes. Without a
    deadline the stream is returned as it is.
    """
    if deadline is None:
        return stream
    return _until_deadline(stream, deadline)


async def _until_deadline(stream: AsyncIterator[T], deadline: float) -> AsyncIterator[T]:
    iterator = aiter(stream)
    while True:
        try:
            async with asyncio.timeout_at(deadline):
                item = await anext(iterator)
        except StopAsyncIteration:
            return
        yield item
