"""Many concurrent open streams through one server process, watching its resident memory.

`soak_open_streams` is what the benchmark's --soak runs and what a test can call directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from loadtest.metrics import RequestRecord
from loadtest.openai_client import OpenAITarget
from loadtest.procstat import rss_bytes
from loadtest.runner import LoadSpec, run_load
from loadtest.workload import Workload, synthetic_prompts

_MB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SoakResult:
    streams: int
    completed: int
    errors: dict[str, int]
    max_open: int  # most streams open at the same moment, from the request timelines
    rss_before_mb: float
    rss_peak_mb: float
    rss_after_mb: float
    duration_s: float
    output_tokens: int
    samples: tuple[tuple[float, float], ...] = field(default=())  # (seconds, RSS MB)

    @property
    def rss_growth_mb(self) -> float:
        """Peak minus the idle baseline: the cost of holding the streams open."""
        return self.rss_peak_mb - self.rss_before_mb

    @property
    def ok(self) -> bool:
        return not self.errors and self.completed == self.streams


def max_overlap(records: list[RequestRecord] | tuple[RequestRecord, ...]) -> int:
    """The largest number of requests in flight at one instant."""
    edges = sorted(
        [(r.start, 1) for r in records] + [(r.end, -1) for r in records], key=lambda e: (e[0], e[1])
    )
    best = cur = 0
    for _, delta in edges:
        cur += delta
        best = max(best, cur)
    return best


async def soak_open_streams(
    base_url: str,
    model: str,
    pid: int,
    *,
    streams: int = 1000,
    max_tokens: int = 64,
    prompt_tokens: int = 16,
    include_children: bool = True,
    timeout: float = 600.0,
    sample_interval_s: float = 0.25,
) -> SoakResult:
    """Open `streams` streaming completions at once against base_url (with /v1), all in flight together.

    RSS is read from /proc for `pid` (and its workers) before, every `sample_interval_s` during,
    and after the run. The streams must outlast their start-up for them all to be open at once:
    choose max_tokens and the engine's step interval accordingly (max_open reports what happened).
    """
    workload = Workload(max_tokens=max_tokens, ignore_eos=True, stream=True, include_usage=True)
    target = OpenAITarget(base_url, model, workload, timeout=timeout, name="soak")
    prompts = synthetic_prompts(streams, prompt_tokens, seed=7)
    samples: list[tuple[float, float]] = []
    before = rss_bytes(pid, include_children=include_children) / _MB
    t0 = time.perf_counter()

    async def sample() -> None:
        while True:
            samples.append(
                (time.perf_counter() - t0, rss_bytes(pid, include_children=include_children) / _MB)
            )
            await asyncio.sleep(sample_interval_s)

    await target.open(streams)
    sampler = asyncio.create_task(sample())
    try:
        result = await run_load(
            target, prompts, LoadSpec(concurrency=streams, requests=streams), progress=False
        )
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        await target.aclose()
    # Let the server drop per-request state before the "after" reading.
    await asyncio.sleep(1.0)
    after = rss_bytes(pid, include_children=include_children) / _MB
    peak = max([before, after, *(mb for _, mb in samples)])
    s = result.summary
    return SoakResult(
        streams=streams,
        completed=s.successes,
        errors=dict(s.errors),
        max_open=max_overlap(result.records),
        rss_before_mb=round(before, 2),
        rss_peak_mb=round(peak, 2),
        rss_after_mb=round(after, 2),
        duration_s=round(s.duration_s, 3),
        output_tokens=s.output_tokens,
        samples=tuple((round(t, 3), round(mb, 2)) for t, mb in samples),
    )
