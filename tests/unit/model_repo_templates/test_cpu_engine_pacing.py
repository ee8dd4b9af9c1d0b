"""The CPU engine's synthetic pacing: when the first token of a request comes."""

from __future__ import annotations

import threading
import time
from typing import Any

from tests.unit.model_repo_templates.test_cpu_engine_guided import engine

STEP_S = 0.2


class _Sink:
    """Records when the first response and the final one come."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.done = threading.Event()

    def is_cancelled(self) -> bool:
        return False

    def send(self, tensors: Any, *, final: bool, error: str | None = None) -> None:
        if self.first is None and tensors is not None:
            self.first = time.monotonic()
        if final:
            self.done.set()


def _request(loop: Any, tokens: int) -> _Sink:
    sink = _Sink()
    group = engine.RequestGroup(
        prompts=[[1, 2, 3]],
        params=[engine.SamplingParams(max_new_tokens=tokens)],
        options=engine.OutputOptions(streaming=True),
        sink=sink,
        declared_outputs=frozenset({"output_ids", "sequence_length"}),
    )
    loop.submit(group)
    return sink


def test_an_idle_engine_gives_the_first_token_one_step_after_the_request() -> None:
    loop = engine.Engine(runner=None, synthetic_candidates=[5, 6, 7], synthetic_step_s=STEP_S)
    loop.start()
    try:
        assert _request(loop, 2).done.wait(10)
        # Idle for longer than a step: the step interval of the request before must not carry on
        # (it used to, and this request's first token then came at once).
        time.sleep(STEP_S * 1.5)
        sent = time.monotonic()
        sink = _request(loop, 1)
        assert sink.done.wait(10)
        assert sink.first is not None
        assert sink.first - sent >= STEP_S * 0.9
    finally:
        loop.shutdown()
