"""The SSE response sends each finished event as it is, and closes the events however it ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import pytest
from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.event import ensure_bytes
from sse_starlette.sse import AppStatus

from gateway.asyncutil import started
from gateway.http.streaming import _EventStream

SCOPE = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
EVENTS = [b"data: one\n\n", b'data: {"two":2}\n\n', b"data: [DONE]\n\n"]


def _events(closed: list[str]) -> AsyncGenerator[bytes, None]:
    async def gen() -> AsyncGenerator[bytes, None]:
        try:
            for event in EVENTS:
                yield event
        finally:
            closed.append("closed")

    return gen()


async def _receive() -> dict[str, Any]:
    # The client never leaves: the stream ends when the events do.
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def _messages(response: EventSourceResponse) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await response(SCOPE, _receive, send)
    return sent


@pytest.fixture(autouse=True)
def _not_exiting() -> Iterator[None]:
    AppStatus.should_exit = False
    yield
    AppStatus.should_exit = False


async def test_the_events_are_sent_as_sse_starlette_sends_them() -> None:
    closed: list[str] = []
    ours = await _messages(_EventStream(started(_events(closed)), sep="\n", ping=0))
    theirs = await _messages(EventSourceResponse(_events([]), sep="\n", ping=0))
    assert ours == theirs
    assert [m.get("body") for m in ours[1:]] == [*EVENTS, b""]
    assert closed == ["closed"]


async def test_a_failed_send_closes_the_events_and_the_error_escapes() -> None:
    closed: list[str] = []
    sent: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and sent:
            raise OSError("connection reset")
        sent.append(message.get("body", b""))

    response = _EventStream(started(_events(closed)), sep="\n", ping=0)
    with pytest.raises(OSError, match="connection reset"):
        await response(SCOPE, _receive, send)
    assert closed == ["closed"]


def _endless(closed: list[str], produced: asyncio.Event | None = None) -> AsyncGenerator[bytes, None]:
    async def gen() -> AsyncGenerator[bytes, None]:
        try:
            yield b"data: first\n\n"
            if produced is not None:
                produced.set()
            await asyncio.Event().wait()  # an engine that never answers again
            yield b"data: never\n\n"
        finally:
            closed.append("closed")

    return gen()


async def test_a_disconnect_closes_the_events_and_the_response_ends_quietly() -> None:
    closed: list[str] = []
    gone = asyncio.Event()
    sent: list[bytes] = []

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])
            gone.set()  # the client leaves after the first event

    response = _EventStream(started(_endless(closed)), sep="\n", ping=0)
    await asyncio.wait_for(response(SCOPE, receive, send), 10)
    assert sent == [b"data: first\n\n"]
    assert closed == ["closed"]


async def test_pings_go_out_while_the_stream_is_open() -> None:
    closed: list[str] = []
    pinged = asyncio.Event()
    bodies: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            bodies.append(message["body"])
            if sum(b.startswith(b": ping") for b in bodies) == 2:
                pinged.set()

    response = _EventStream(started(_endless(closed)), sep="\n", ping=0.01)  # type: ignore[arg-type]
    task = asyncio.create_task(response(SCOPE, _receive, send))
    await asyncio.wait_for(pinged.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert bodies[0] == b"data: first\n\n"
    assert all(b.startswith(b": ping - ") and b.endswith(b"\n\n") for b in bodies[1:3])
    assert closed == ["closed"]


async def test_a_ping_event_of_the_api_is_sent_as_it_is() -> None:
    pinged = asyncio.Event()
    bodies: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            bodies.append(message["body"])
            if len(bodies) == 2:
                pinged.set()

    def ping() -> ServerSentEvent:
        return ServerSentEvent(data='{"type": "ping"}', event="ping")

    response = _EventStream(started(_endless([])), sep="\n", ping=0.01, ping_message_factory=ping)  # type: ignore[arg-type]
    task = asyncio.create_task(response(SCOPE, _receive, send))
    await asyncio.wait_for(pinged.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert bodies[1] == ensure_bytes(ping(), "\n")


async def test_the_shutdown_ends_an_open_stream_after_its_grace_period() -> None:
    closed: list[str] = []
    produced = asyncio.Event()
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    response = _EventStream(started(_endless(closed, produced)), sep="\n", ping=0, shutdown_grace_period=0.01)
    task = asyncio.create_task(response(SCOPE, _receive, send))
    await asyncio.wait_for(produced.wait(), 10)
    AppStatus.should_exit = True  # what uvicorn's SIGTERM handler sets; sse-starlette's watcher polls it
    await asyncio.wait_for(task, 10)
    assert closed == ["closed"]
    assert [m.get("body") for m in sent[1:]] == [b"data: first\n\n"]


async def test_a_stream_started_during_the_shutdown_ends_at_once() -> None:
    closed: list[str] = []
    AppStatus.should_exit = True
    response = _EventStream(started(_endless(closed)), sep="\n", ping=0, shutdown_grace_period=0)
    await asyncio.wait_for(response(SCOPE, _receive, _ignore), 10)
    assert closed == ["closed"]


async def test_a_cancellation_from_outside_still_cancels_the_response() -> None:
    closed: list[str] = []
    produced = asyncio.Event()
    response = _EventStream(started(_endless(closed, produced)), sep="\n", ping=0)
    task = asyncio.create_task(response(SCOPE, _receive, _ignore))
    await asyncio.wait_for(produced.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert closed == ["closed"]


async def _ignore(message: dict[str, Any]) -> None:
    return None
