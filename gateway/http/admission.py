"""Priority admission for generation requests: a bounded number run at once, the others wait in a
bounded queue, most urgent first, first come first served within a priority; a full queue sheds
its least urgent waiter when a more urgent request arrives.

Priorities follow vLLM's convention: an integer, lower is more urgent, 0 by default. The queue
itself (`AdmissionQueue`) is pure asyncio; `Ticket` is what the admission middleware hands the
route, which knows the priority only once it has parsed the body.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final, Literal

from starlette.requests import HTTPConnection

from gateway.errors import OverloadedError
from gateway.logs import current_request
from gateway.modelserver import LoadKey, ModelLoad

# Why a request was refused: the queue was full of requests at least as urgent, a more urgent
# request took its place in the queue, or it waited longer than the queue timeout.
ShedReason = Literal["queue_full", "displaced", "timeout"]

# Where the admission middleware leaves the request's ticket in the ASGI scope.
TICKET_KEY: Final = "gateway.admission"

# Priorities are the clients' integers; metric labels keep them bounded: each value in
# [-LABEL_RANGE, LABEL_RANGE] is its own label, the rest share one label per side.
LABEL_RANGE: Final = 10


def priority_label(priority: int) -> str:
    if priority < -LABEL_RANGE:
        return f"<-{LABEL_RANGE}"
    if priority > LABEL_RANGE:
        return f">{LABEL_RANGE}"
    return str(priority)


class Shed(Exception):
    """The request was not admitted."""

    def __init__(self, reason: ShedReason) -> None:
        super().__init__(reason)
        self.reason: ShedReason = reason


class _Waiter:
    __slots__ = ("future", "priority")

    def __init__(self, priority: int, future: asyncio.Future[None]) -> None:
        self.priority = priority
        self.future = future


class AdmissionQueue:
    """At most `max_running` holders at once; at most `max_queued` waiting.

    A freed slot goes straight to the most urgent waiter (the oldest among equals), so a newcomer
    never overtakes the queue. When the queue is full, a newcomer more urgent than the least
    urgent waiter takes that waiter's place (the newest of the least urgent is shed, as it has
    waited least); otherwise the newcomer is shed. Nobody holding a slot is ever shed.
    """

    def __init__(
        self,
        *,
        max_running: int,
        max_queued: int,
        timeout_s: float,
        on_length: Callable[[int], None] | None = None,
    ) -> None:
        self._max_running = max_running
        self._on_length = on_length
        self._max_queued = max_queued
        self._timeout_s = timeout_s
        self._running = 0
        self._queued = 0
        # Waiters by priority, each level first come first served; `_levels` is sorted.
        self._by_level: dict[int, deque[_Waiter]] = {}
        self._levels: list[int] = []

    @property
    def running(self) -> int:
        return self._running

    @property
    def queued(self) -> int:
        return self._queued

    async def acquire(self, priority: int, *, on_displaced: Callable[[int], None] | None = None) -> None:
        """Take a slot, waiting if need be; `Shed` if refused. `on_displaced(priority)` is told of
        a waiter this request pushed out of a full queue."""
        if self._running < self._max_running and self._queued == 0:
            self._running += 1
            return
        if self._queued >= self._max_queued:
            if not self._levels or self._levels[-1] <= priority:
                raise Shed("queue_full")
            victim = self._pop(self._levels[-1], newest=True)
            if not victim.future.done():
                victim.future.set_exception(Shed("displaced"))
                if on_displaced is not None:
                    on_displaced(victim.priority)
        waiter = _Waiter(priority, asyncio.get_running_loop().create_future())
        self._push(waiter)
        try:
            async with asyncio.timeout(self._timeout_s):
                await waiter.future
        except TimeoutError:
            if self._granted(waiter):
                return  # the slot came as the time ran out: take it
            self._remove(waiter)
            raise Shed("timeout") from None
        except BaseException:
            # Cancelled (the client went away) or displaced: give back a slot handed over meanwhile.
            if self._granted(waiter):
                self.release()
            else:
                self._remove(waiter)
            raise

    def release(self) -> None:
        """Give a slot back: to the most urgent waiter, else to the pool."""
        while self._levels:
            waiter = self._pop(self._levels[0], newest=False)
            # A waiter cancelled this very moment is still queued until its task runs again.
            if not waiter.future.done():
                waiter.future.set_result(None)
                return
        self._running -= 1

    @staticmethod
    def _granted(waiter: _Waiter) -> bool:
        future = waiter.future
        return future.done() and not future.cancelled() and future.exception() is None

    def _push(self, waiter: _Waiter) -> None:
        level = self._by_level.get(waiter.priority)
        if level is None:
            level = self._by_level[waiter.priority] = deque()
            bisect.insort(self._levels, waiter.priority)
        level.append(waiter)
        self._queued += 1
        self._length_changed()

    def _pop(self, priority: int, *, newest: bool) -> _Waiter:
        level = self._by_level[priority]
        waiter = level.pop() if newest else level.popleft()
        if not level:
            self._drop_level(priority)
        self._queued -= 1
        self._length_changed()
        return waiter

    def _remove(self, waiter: _Waiter) -> None:
        level = self._by_level.get(waiter.priority)
        if level is None or waiter not in level:
            return
        level.remove(waiter)
        if not level:
            self._drop_level(waiter.priority)
        self._queued -= 1
        self._length_changed()

    def _length_changed(self) -> None:
        if self._on_length is not None:
            self._on_length(self._queued)

    def _drop_level(self, priority: int) -> None:
        del self._by_level[priority]
        del self._levels[bisect.bisect_left(self._levels, priority)]


class AdmissionEvents:
    """What admission reports (metrics), by priority; the app gives one over its metrics."""

    def admitted(self, priority: int, waited_s: float) -> None: ...

    def shed(self, priority: int, reason: ShedReason) -> None: ...

    def queue_length(self, waiting: int) -> None: ...


class Ticket:
    """One generation request's admission, made by the middleware before the body is read and
    used by the route once it knows the priority. The middleware releases it when the response
    (the whole stream) is done."""

    __slots__ = ("_events", "_key", "_load", "_queue", "_retry_after", "default_priority", "held", "priority")

    def __init__(
        self,
        queue: AdmissionQueue,
        *,
        default_priority: int,
        retry_after_s: int,
        events: AdmissionEvents,
        load: ModelLoad | None = None,
    ) -> None:
        self._queue = queue
        self._events = events
        self._retry_after = retry_after_s
        # Requests per served model (the model-server metrics): counted while waiting and held.
        self._load = load
        self._key: LoadKey | None = None
        self.default_priority = default_priority
        self.priority: int | None = None
        self.held = False

    async def admit(self, body: Any) -> None:
        """Wait for a slot at the body's priority (its `admission_priority(default)`, where the
        API has one; else the key's default), or raise OverloadedError (429, Retry-After)."""
        resolve = getattr(body, "admission_priority", None)
        priority = resolve(self.default_priority) if resolve is not None else self.default_priority
        self.priority = priority
        record = current_request.get()
        if record is not None:
            record.priority = priority
        load = self._load
        key = load.key(getattr(body, "model", None)) if load is not None else None
        start = time.perf_counter()
        if load is not None and key is not None:
            load.queued(key, 1)
        try:
            await self._queue.acquire(priority, on_displaced=self._displaced)
        except Shed as exc:
            if exc.reason != "displaced":  # a displaced waiter was counted by its displacer
                self._events.shed(priority, exc.reason)
            raise self.overloaded() from None
        finally:
            if load is not None and key is not None:
                load.queued(key, -1)
        self.held = True
        if load is not None and key is not None:
            self._key = key
            load.running(key, 1)
        self._events.admitted(priority, time.perf_counter() - start)

    def _displaced(self, priority: int) -> None:
        self._events.shed(priority, "displaced")

    def release(self) -> None:
        if self.held:
            self.held = False
            self._queue.release()
            if self._key is not None and self._load is not None:
                self._load.running(self._key, -1)
                self._key = None

    def overloaded(self) -> OverloadedError:
        return OverloadedError(
            "The server is overloaded; retry after a short wait.",
            headers={"Retry-After": str(self._retry_after)},
        )


def retry_after_s(queue_timeout_s: float) -> int:
    return max(1, math.ceil(min(queue_timeout_s, 5.0)))


async def admit(request: HTTPConnection, body: Any) -> None:
    """Called by the generation routes once the body is parsed: wait for admission (a no-op in an
    app without the admission middleware)."""
    ticket: Ticket | None = request.scope.get(TICKET_KEY)
    if ticket is not None:
        await ticket.admit(body)


def admitted_priority(request: HTTPConnection) -> int:
    """The priority the request was admitted at (0 without admission), for the engine request."""
    ticket: Ticket | None = request.scope.get(TICKET_KEY)
    if ticket is None or ticket.priority is None:
        return 0
    return ticket.priority
