"""gateway.asyncutil: the stream helpers the core builds on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from gateway.asyncutil import merge, started, until_deadline


class Producer:
    """An async generator that records when it started, what it yielded and how it ended."""

    def __init__(self, items: list[int], *, gate: asyncio.Event | None = None) -> None:
        self.items = items
        self.gate = gate
        self.began = asyncio.Event()
        self.closed = False
        self.cancelled = False

    async def run(self) -> AsyncGenerator[int, None]:
        self.began.set()
        try:
            for item in self.items:
                if self.gate is not None:
                    await self.gate.wait()
                yield item
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        finally:
            self.closed = True


async def test_started_begins_the_first_item_before_anyone_iterates() -> None:
    producer = Producer([1, 2, 3])
    stream = started(producer.run())
    await asyncio.wait_for(producer.began.wait(), 1)
    assert [item async for item in stream] == [1, 2, 3]
    assert producer.closed


async def test_started_on_an_empty_stream_ends_cleanly() -> None:
    producer = Producer([])
    assert [item async for item in started(producer.run())] == []
    assert producer.closed


async def test_cancelling_the_consumer_before_the_first_item_cancels_the_producer() -> None:
    gate = asyncio.Event()  # never set: the first item never comes
    producer = Producer([1], gate=gate)
    stream = started(producer.run())

    async def consume() -> list[int]:
        return [item async for item in stream]

    task = asyncio.create_task(consume())
    await asyncio.wait_for(producer.began.wait(), 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert producer.cancelled and producer.closed


async def test_closing_after_the_first_item_closes_the_producer() -> None:
    producer = Producer([1, 2, 3])
    stream = started(producer.run())
    assert await anext(stream) == 1
    await stream.aclose()
    assert producer.closed


async def test_closing_before_iterating_cancels_the_pending_first_item() -> None:
    gate = asyncio.Event()  # never set
    producer = Producer([1], gate=gate)
    stream = started(producer.run())
    await asyncio.wait_for(producer.began.wait(), 1)
    # Nobody iterated: aclose must still stop the task producing the first item.
    await stream.aclose()
    assert producer.cancelled and producer.closed


async def test_merge_interleaves_and_passes_a_single_stream_through() -> None:
    single = Producer([1, 2]).run()
    assert merge([single]) is single
    merged = merge([Producer([1, 2]).run(), Producer([3]).run()])
    assert sorted([item async for item in merged]) == [1, 2, 3]


async def test_until_deadline_raises_timeout_and_closes_the_source() -> None:
    gate = asyncio.Event()
    producer = Producer([1], gate=gate)
    loop = asyncio.get_running_loop()
    stream = until_deadline(producer.run(), loop.time() + 0.05)
    with pytest.raises(TimeoutError):
        async for _ in stream:
            pass
    assert producer.cancelled and producer.closed
    source = Producer([1]).run()
    assert until_deadline(source, None) is source  # no deadline: no wrapper on the hot path
