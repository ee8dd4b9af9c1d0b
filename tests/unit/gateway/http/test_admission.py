"""The priority admission queue alone: ordering, shedding, timeouts and cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from gateway.http.admission import AdmissionQueue, Shed, priority_label


async def _waiting(queue: AdmissionQueue, count: int) -> None:
    # Let the tasks started so far run up to their wait (no fixed sleep: the queue says).
    for _ in range(100):
        if queue.queued == count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"expected {count} waiters, got {queue.queued}")


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(100):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


class Order:
    """Tasks that take a slot, note the order they got it in, and keep it until told."""

    def __init__(self, queue: AdmissionQueue) -> None:
        self.queue = queue
        self.admitted: list[str] = []
        self.shed: dict[str, str] = {}
        self.displaced: list[int] = []

    def start(self, name: str, priority: int) -> asyncio.Task[None]:
        async def run() -> None:
            try:
                await self.queue.acquire(priority, on_displaced=self.displaced.append)
            except Shed as exc:
                self.shed[name] = exc.reason
                return
            self.admitted.append(name)

        return asyncio.create_task(run())


async def test_a_freed_slot_goes_to_the_most_urgent_waiter_first_come_first_served_within_a_priority() -> (
    None
):
    queue = AdmissionQueue(max_running=1, max_queued=10, timeout_s=30)
    await queue.acquire(0)
    order = Order(queue)
    tasks = [
        order.start("low-1", 5),
        order.start("default-1", 0),
        order.start("high-1", -3),
        order.start("low-2", 5),
        order.start("high-2", -3),
        order.start("default-2", 0),
    ]
    await _waiting(queue, 6)
    for expected in range(1, 7):
        queue.release()
        await _until(lambda n=expected: len(order.admitted) == n)  # type: ignore[misc]
    await asyncio.gather(*tasks)
    assert order.admitted == ["high-1", "high-2", "default-1", "default-2", "low-1", "low-2"]
    assert queue.running == 1 and queue.queued == 0


async def test_free_slots_admit_at_once_and_a_newcomer_never_overtakes_the_queue() -> None:
    queue = AdmissionQueue(max_running=2, max_queued=4, timeout_s=30)
    await queue.acquire(10)
    await queue.acquire(10)
    assert queue.running == 2
    order = Order(queue)
    waiting = order.start("first", 3)
    await _waiting(queue, 1)
    queue.release()
    urgent = order.start("urgent-late", -100)
    await asyncio.gather(waiting)
    await _waiting(queue, 1)
    assert order.admitted == ["first"]
    queue.release()
    await urgent
    assert order.admitted == ["first", "urgent-late"]


async def test_a_full_queue_sheds_its_least_urgent_waiter_for_a_more_urgent_newcomer() -> None:
    queue = AdmissionQueue(max_running=1, max_queued=3, timeout_s=30)
    await queue.acquire(0)
    order = Order(queue)
    tasks = [order.start("low-old", 5), order.start("low-new", 5), order.start("default", 0)]
    await _waiting(queue, 3)
    tasks.append(order.start("high", -1))
    await tasks[1]
    # The newest of the least urgent waiters goes: it has waited least.
    assert order.shed == {"low-new": "displaced"}
    assert order.displaced == [5]
    assert queue.queued == 3
    for expected in range(1, 4):
        queue.release()
        await _until(lambda n=expected: len(order.admitted) == n)  # type: ignore[misc]
    await asyncio.gather(*tasks)
    assert order.admitted == ["high", "default", "low-old"]


@pytest.mark.parametrize("priority", [0, 5])
async def test_a_full_queue_sheds_a_newcomer_no_more_urgent_than_every_waiter(priority: int) -> None:
    queue = AdmissionQueue(max_running=1, max_queued=2, timeout_s=30)
    await queue.acquire(0)
    order = Order(queue)
    tasks = [order.start("a", 0), order.start("b", 0)]
    await _waiting(queue, 2)
    await order.start("late", priority)
    assert order.shed == {"late": "queue_full"}
    assert order.displaced == []
    queue.release()
    queue.release()
    await asyncio.gather(*tasks)
    assert order.admitted == ["a", "b"]


async def test_no_queue_sheds_every_request_beyond_the_running_ones_whatever_its_priority() -> None:
    queue = AdmissionQueue(max_running=1, max_queued=0, timeout_s=30)
    await queue.acquire(0)
    with pytest.raises(Shed) as caught:
        await queue.acquire(-1000)
    assert caught.value.reason == "queue_full"
    assert queue.running == 1


async def test_a_request_holding_a_slot_is_never_shed() -> None:
    queue = AdmissionQueue(max_running=2, max_queued=1, timeout_s=30)
    await queue.acquire(100)
    await queue.acquire(100)
    order = Order(queue)
    first = order.start("queued", 100)
    await _waiting(queue, 1)
    urgent = order.start("urgent", -100)
    await first
    # The queued low-priority waiter made room; both running ones are untouched.
    assert order.shed == {"queued": "displaced"}
    assert queue.running == 2 and queue.queued == 1
    queue.release()
    await urgent
    assert order.admitted == ["urgent"]


async def test_a_waiter_past_the_timeout_is_shed_and_leaves_the_queue() -> None:
    queue = AdmissionQueue(max_running=1, max_queued=4, timeout_s=0.01)
    await queue.acquire(0)
    with pytest.raises(Shed) as caught:
        await queue.acquire(0)
    assert caught.value.reason == "timeout"
    assert queue.queued == 0
    queue.release()
    assert queue.running == 0


async def test_a_cancelled_waiter_leaves_the_queue_and_the_slot_goes_to_the_next() -> None:
    queue = AdmissionQueue(max_running=1, max_queued=4, timeout_s=30)
    await queue.acquire(0)
    order = Order(queue)
    gone = order.start("gone", -5)
    stays = order.start("stays", 0)
    await _waiting(queue, 2)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    assert queue.queued == 1
    queue.release()
    await stays
    assert order.admitted == ["stays"]
    assert queue.running == 1


async def test_a_slot_handed_to_a_waiter_cancelled_before_it_ran_passes_on() -> None:
    queue = AdmissionQueue(max_running=1, max_queued=4, timeout_s=30)
    await queue.acquire(0)
    order = Order(queue)
    first = order.start("first", 0)
    second = order.start("second", 0)
    await _waiting(queue, 2)
    queue.release()  # handed to "first", whose task has not run since
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    await second
    assert order.admitted == ["second"]
    assert queue.running == 1 and queue.queued == 0


async def test_the_queue_length_is_reported_on_every_change() -> None:
    lengths: list[int] = []
    queue = AdmissionQueue(max_running=1, max_queued=4, timeout_s=30, on_length=lengths.append)
    await queue.acquire(0)
    order = Order(queue)
    tasks = [order.start("a", 0), order.start("b", 1)]
    await _waiting(queue, 2)
    queue.release()
    queue.release()
    await asyncio.gather(*tasks)
    assert lengths == [1, 2, 1, 0]


@pytest.mark.parametrize(
    ("priority", "label"),
    [(0, "0"), (-10, "-10"), (10, "10"), (-11, "<-10"), (2**31 - 1, ">10"), (7, "7")],
)
def test_priority_labels_are_bounded(priority: int, label: str) -> None:
    assert priority_label(priority) == label
