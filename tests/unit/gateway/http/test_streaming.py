"""The SSE response sends each finished event as it is, and closes the events however it ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from sse_starlette import EventSourceResponse
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
def _not_exiting() -> None:
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
