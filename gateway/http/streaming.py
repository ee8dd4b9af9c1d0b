"""Response helpers every generation router uses: the SSE response, disconnect handling and the
client's deadline header."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from datetime import datetime, timezone
from typing import Any, TypeVar

import anyio
from fastapi import Request
from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette import sse as sse_internals
from sse_starlette.event import ensure_bytes
from sse_starlette.sse import AppStatus
from starlette.types import Message, Receive, Scope, Send

from gateway.asyncutil import Started, started
from gateway.config import Settings
from gateway.errors import ClientDisconnectedError, InvalidRequestError
from gateway.http.services import service

T = TypeVar("T")

logger = logging.getLogger(__name__)

TIMEOUT_HEADER = "x-request-timeout"


SESSION_HEADER = "X-Session-Id"


def session_id(request: Request) -> str | None:
    """The client's session (`X-Session-Id`): routing keeps a session on one engine replica."""
    value = request.headers.get(SESSION_HEADER)
    return value.strip() or None if value is not None else None


def client_timeout(request: Request) -> float | None:
    """The client's own deadline in seconds (`X-Request-Timeout`), if it sent a usable one."""
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InvalidRequestError(
            f"{TIMEOUT_HEADER} must be a number of seconds", param=TIMEOUT_HEADER
        ) from None
    if not value > 0:
        raise InvalidRequestError(f"{TIMEOUT_HEADER} must be positive", param=TIMEOUT_HEADER)
    return value


class _EventStream(EventSourceResponse):
    """sse-starlette's response over finished SSE events, with two changes.

    The first event (and so the Triton request) is started at once, so the engine works while the
    response's own set-up runs; the response closes the started events however it ends, so a
    client gone before the first byte still cancels Triton.

    sse-starlette wraps every send in an anyio cancel scope, even with no send timeout, and passes
    every event through its own type checks, a copy and a debug log call; at one event per token
    that is a measurable share of the gateway's CPU, so with no send timeout the events (finished
    bytes) are sent as they are (the pinned sse-starlette's `_send_with_timeout` and
    `_stream_response` contracts; the failure path is its own)."""

    def __init__(self, events: Started[bytes], **options: Any) -> None:
        self._events = events
        super().__init__(events, **options)

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        if self.send_timeout is None:
            await send(message)
        else:
            await super()._send_with_timeout(send, message)

    async def _stream_response(self, send: Send) -> None:
        if self.send_timeout is not None:
            await super()._stream_response(send)
            return
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for chunk in self._events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except BaseException:
            # As sse-starlette does: the events are closed (which cancels the Triton request)
            # before the error escapes, within its clean-up time.
            with anyio.move_on_after(self._cleanup_timeout, shield=True) as cleanup:
                try:
                    await self._events.aclose()
                except Exception:
                    logger.exception("closing the event stream after a failed send failed")
            if cleanup.cancel_called:
                logger.warning("event stream clean-up cut short after %s s", self._cleanup_timeout)
            raise
        async with self._send_lock:
            self.active = False
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if (
                self.send_timeout is not None
                or scope["type"] != "http"
                or scope["method"].upper() == "HEAD"
                or self.data_sender_callable is not None
                or self.client_close_handler_callable is not None
            ):
                await super().__call__(scope, receive, send)
            else:
                await self._serve(receive, send)
        finally:
            await self._events.aclose()

    async def _serve(self, receive: Receive, send: Send) -> None:
        """sse-starlette's `__call__` without its anyio task group of four tasks (the events, the
        pings, the shutdown signal, the client's disconnect), whose set-up and tear-down (cancel
        scopes, `current_task` and, on Python 3.11, a `getpid` call each) cost more per request
        than some of its tokens: the events are sent from this task, the disconnect is listened
        for in one task, and the pings and the shutdown signal are timers and callbacks. What each
        does is sse-starlette's: a disconnect or the end of the shutdown grace period cancels the
        events (which cancels Triton) and the response ends quietly; a ping goes out every
        `ping` seconds while the stream is open."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        stopped: list[BaseException | None] = []

        def stop(error: BaseException | None = None) -> None:
            if not stopped:
                stopped.append(error)
                task.cancel()

        async def listen() -> None:
            await self._listen_for_disconnect(receive)
            stop()

        listener = loop.create_task(listen())
        pinger: asyncio.Task[None] | None = None

        def ping_failed(done: asyncio.Task[None]) -> None:
            if not done.cancelled() and done.exception() is not None:
                stop(done.exception())

        def start_pings() -> None:
            nonlocal pinger
            if self.active:
                pinger = loop.create_task(self._pings(send))
                pinger.add_done_callback(ping_failed)

        ping_timer = loop.call_later(self._ping_interval, start_pings) if self._ping_interval > 0 else None
        grace_timer: asyncio.TimerHandle | None = None

        def on_shutdown() -> None:
            nonlocal grace_timer
            if self._shutdown_event:
                self._shutdown_event.set()
            if self._shutdown_grace_period > 0:
                grace_timer = loop.call_later(self._shutdown_grace_period, stop)
            else:
                stop()

        shutdown = _ShutdownListener(on_shutdown)
        state = sse_internals._get_shutdown_state()
        if AppStatus.should_exit:
            loop.call_soon(on_shutdown)
        else:
            sse_internals._ensure_watcher_started_on_this_loop()
            state.events.add(shutdown)  # type: ignore[arg-type]  # it only calls set()
        try:
            await self._stream_response(send)
        except asyncio.CancelledError:
            # Cancelled by a disconnect or the shutdown: the response ends quietly, as
            # sse-starlette's task group ends it; any other cancellation goes on.
            if not stopped or task.uncancel() > 0:
                raise
            if stopped[0] is not None:
                raise stopped[0] from None
        finally:
            state.events.discard(shutdown)
            listener.cancel()
            for timer in (ping_timer, grace_timer):
                if timer is not None:
                    timer.cancel()
            if pinger is not None:
                pinger.cancel()
        if self.background is not None:
            await self.background()

    async def _pings(self, send: Send) -> None:
        """A ping now (the first is due), then sse-starlette's own ping loop."""
        factory = self.ping_message_factory
        ping = (
            factory()
            if factory
            else ServerSentEvent(comment=f"ping - {datetime.now(timezone.utc)}", sep=self.sep)
        )
        async with self._send_lock:
            if self.active:
                await send(
                    {"type": "http.response.body", "body": ensure_bytes(ping, self.sep), "more_body": True}
                )
        await self._ping(send)


class _ShutdownListener:
    """Stands in sse-starlette's set of shutdown events: its watcher calls `set()` on each."""

    __slots__ = ("_callback",)

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback = callback

    def set(self) -> None:
        self._callback()


async def event_stream(
    request: Request,
    events: AsyncGenerator[bytes, None],
    *,
    ping: Callable[[], ServerSentEvent] | None = None,
) -> EventSourceResponse:
    """Streams finished SSE events (each API's own frames); sse-starlette adds the keep-alive
    pings (an SSE comment, or the API's own `ping` event), and when the client goes away it
    cancels the task that iterates `events`, which closes the engine stream and so cancels the
    Triton request."""
    first = started(events)
    # One turn of the event loop: the task started for the first event runs until it waits,
    # which is after it has handed the Triton request to gRPC. The response's own set-up (making
    # it here, sse-starlette's task group later) then overlaps with the engine's work instead of
    # delaying the request.
    await asyncio.sleep(0)
    settings = service(request, Settings)
    return _EventStream(
        first,
        sep="\n",
        ping=settings.sse_ping_s,
        ping_message_factory=ping,
        # On SIGTERM open streams may finish for this long before they are cancelled
        # (cancelling them cancels their Triton requests).
        shutdown_grace_period=settings.shutdown_grace_s,
    )


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
            # The client is gone; nobody reads this answer, but its status (499) is what the
            # access log, the metrics and the trace record.
            raise ClientDisconnectedError("The client closed the connection before the response.") from None
        raise
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
