"""Small asyncio helpers shared by the core, the Triton adapter and the load generator."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Generic, TypeVar, cast

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


def started(stream: AsyncGenerator[T, None]) -> Started[T]:
    """Start producing `stream`'s first item now, in a task, instead of when the consumer first
    asks for it: a streamed response then sends its Triton request while the HTTP response (its
    headers, sse-starlette's task group) is still being set up, which is time to first token.

    Cancelling the task that waits for an item cancels the producer (and so the engine request).
    `aclose()` stops it too, even if nobody ever iterated: the owner must call it when done.
    """

    async def first_item() -> T:
        return await anext(stream)

    return Started(stream, asyncio.ensure_future(first_item()))


class Started(Generic[T]):
    __slots__ = ("_first", "_stream")

    def __init__(self, stream: AsyncGenerator[T, None], first: asyncio.Future[T]) -> None:
        self._stream = stream
        self._first: asyncio.Future[T] | None = first

    def __aiter__(self) -> Started[T]:
        return self

    async def __anext__(self) -> T:
        first = self._first
        if first is not None:
            self._first = None
            return await first  # cancelling this wait cancels `first` too
        return await anext(self._stream)

    async def aclose(self) -> None:
        first, self._first = self._first, None
        if first is not None and not first.done():
            first.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await first
        await self._stream.aclose()


class IdleWatch:
    """Calls `on_idle` once `idle_s` pass with nothing done: one timer, re-armed each period while
    `took_activity()` reports activity since its last call (and clears the mark), not a timer per
    read, which would cost every streamed token. Cancel it when the watched work ends."""

    def __init__(self, idle_s: float, took_activity: Callable[[], bool], on_idle: Callable[[], None]) -> None:
        self._idle_s = idle_s
        self._took_activity = took_activity
        self._on_idle = on_idle
        self._loop = asyncio.get_running_loop()
        took_activity()  # what came before the watch started does not count
        self._handle = self._loop.call_later(idle_s, self._check)

    def _check(self) -> None:
        if self._took_activity():
            self._handle = self._loop.call_later(self._idle_s, self._check)
        else:
            self._on_idle()

    def cancel(self) -> None:
        self._handle.cancel()


async def watch_loop_lag(observe: Callable[[float], None], interval_s: float = 0.05) -> None:
    """Observe, every `interval_s`, how late the event loop woke this task: the time it spent in
    something that did not yield (a long encode on the loop shows as lag of about its length)."""
    loop = asyncio.get_running_loop()
    while True:
        start = loop.time()
        await asyncio.sleep(interval_s)
        observe(max(0.0, loop.time() - start - interval_s))
