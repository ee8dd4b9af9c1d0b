"""The CPU engine's waiting queue: by TensorRT-LLM's executor priority, first come first served
within one."""

from __future__ import annotations

import threading
from typing import Any

from tests.unit.model_repo_templates.test_cpu_engine_guided import engine


class _Sink:
    def __init__(self, name: str, order: list[str], lock: threading.Lock) -> None:
        self.name = name
        self.order = order
        self.lock = lock
        self.done = threading.Event()

    def is_cancelled(self) -> bool:
        return False

    def send(self, tensors: Any, *, final: bool, error: str | None = None) -> None:
        assert error is None
        if final:
            with self.lock:
                self.order.append(self.name)
            self.done.set()


def test_waiting_requests_start_most_urgent_first_and_in_arrival_order_within_a_priority() -> None:
    loop = engine.Engine(runner=None, synthetic_candidates=[5, 6, 7], max_active=1)
    order: list[str] = []
    lock = threading.Lock()
    sinks = []
    # Submitted before the loop starts, so all of them wait and only the order decides.
    arrivals = [("low", 0.1), ("default-1", 0.5), ("high", 0.9), ("default-2", 0.5), ("plain", None)]
    for name, priority in arrivals:
        sink = _Sink(name, order, lock)
        sinks.append(sink)
        extra = {} if priority is None else {"priority": priority}
        loop.submit(
            engine.RequestGroup(
                prompts=[[100, 101, 102]],
                params=[engine.SamplingParams(max_new_tokens=2)],
                options=engine.OutputOptions(exclude_input=True),
                sink=sink,
                declared_outputs=frozenset({"output_ids"}),
                **extra,
            )
        )
    loop.start()
    try:
        for sink in sinks:
            assert sink.done.wait(30)
    finally:
        loop.shutdown()
    assert order == ["high", "default-1", "default-2", "plain", "low"]
