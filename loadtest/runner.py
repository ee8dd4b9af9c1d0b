"""Drives a target: closed-loop concurrency or open-loop Poisson arrivals, bounded in count and time."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from loadtest.metrics import RequestRecord, RunSummary, summarize
from loadtest.target import Target
from loadtest.workload import Prompt, cycle


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """How much load. Exactly one of concurrency/rate; the run stops at `requests` or `duration_s`."""

    concurrency: int | None = None
    rate: float | None = None  # mean requests/s of a Poisson process
    requests: int = 100
    duration_s: float | None = None
    warmup: int = 0  # requests sent first and left out of the results (connections, caches)
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of concurrency and rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.rate is not None and self.rate <= 0:
            raise ValueError("rate must be > 0")
        if self.requests < 1:
            raise ValueError("requests must be >= 1")

    @property
    def mode(self) -> str:
        return "concurrency" if self.concurrency is not None else "rate"

    @property
    def load(self) -> float:
        return float(self.concurrency if self.concurrency is not None else self.rate or 0.0)

    @property
    def max_in_flight(self) -> int:
        """Connection-pool size: an open loop may pile up requests beyond its rate."""
        if self.concurrency is not None:
            return self.concurrency
        return max(16, min(self.requests, 4096))


@dataclass(frozen=True, slots=True)
class RunResult:
    summary: RunSummary
    records: tuple[RequestRecord, ...]


class _Progress:
    """Per-request (not per-token) updates, so the bar costs nothing measurable on the hot path."""

    def __init__(self, enabled: bool, label: str, total: int) -> None:
        self._progress: Progress | None = None
        self.tokens = 0
        self.errors = 0
        self._started = time.perf_counter()
        if enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]:>9.1f} tok/s  errors {task.fields[errors]}"),
                TimeElapsedColumn(),
                refresh_per_second=4,
                transient=False,
            )
            self._task = self._progress.add_task(label, total=total, rate=0.0, errors=0)

    def __enter__(self) -> _Progress:
        if self._progress is not None:
            self._progress.start()
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def advance(self, record: RequestRecord) -> None:
        if record.ok:
            self.tokens += record.output_tokens
        else:
            self.errors += 1
        if self._progress is not None:
            elapsed = max(time.perf_counter() - self._started, 1e-9)
            self._progress.update(self._task, advance=1, rate=self.tokens / elapsed, errors=self.errors)


async def run_load(
    target: Target,
    prompts: Sequence[Prompt],
    spec: LoadSpec,
    *,
    label: str | None = None,
    progress: bool = True,
    on_window: Callable[[str], None] | None = None,
) -> RunResult:
    """Run the load against an opened target; `on_window("start"/"end")` brackets the measured part.

    The bracket lets a caller read CPU counters exactly around the measured requests (the benchmark
    reads /proc there), leaving out warm-up and start-up.
    """
    if not prompts:
        raise ValueError("no prompts")
    label = label or f"{target.name} {'c' if spec.mode == 'concurrency' else 'rate'}={spec.load:g}"
    if spec.warmup:
        warm = LoadSpec(concurrency=spec.concurrency or 1, requests=spec.warmup)
        await _closed_loop(target, prompts, warm, None, offset=0)
    # The load generator is a client being measured too (the direct gRPC target charges this very
    # process): keep full collections from re-scanning its set-up heap (transformers, and torch
    # where installed, for exact prompt lengths), as the gateway does for its own.
    gc.collect()
    gc.freeze()
    try:
        if on_window is not None:
            on_window("start")
        t0 = time.perf_counter()
        with _Progress(progress, label, spec.requests) as bar:
            if spec.concurrency is not None:
                records = await _closed_loop(target, prompts, spec, bar, offset=spec.warmup)
            else:
                records = await _open_loop(target, prompts, spec, bar, offset=spec.warmup)
        t1 = time.perf_counter()
        if on_window is not None:
            on_window("end")
    finally:
        # Frozen objects are never collected, not even at exit (extension modules then report leaks).
        gc.unfreeze()
    summary = summarize(records, label=label, mode=spec.mode, load=spec.load, duration_s=t1 - t0)
    return RunResult(summary=summary, records=tuple(records))


async def _closed_loop(
    target: Target, prompts: Sequence[Prompt], spec: LoadSpec, bar: _Progress | None, *, offset: int
) -> list[RequestRecord]:
    assert spec.concurrency is not None
    deadline = None if spec.duration_s is None else time.perf_counter() + spec.duration_s
    counter: Iterator[int] = iter(range(spec.requests))
    records: list[RequestRecord] = []

    async def worker() -> None:
        # A shared iterator hands out request numbers, so N workers never exceed spec.requests.
        for i in counter:
            if deadline is not None and time.perf_counter() >= deadline:
                return
            record = await target.send(cycle(prompts, offset + i))
            records.append(record)
            if bar is not None:
                bar.advance(record)

    await asyncio.gather(*(worker() for _ in range(min(spec.concurrency, spec.requests))))
    return records


async def _open_loop(
    target: Target, prompts: Sequence[Prompt], spec: LoadSpec, bar: _Progress | None, *, offset: int
) -> list[RequestRecord]:
    assert spec.rate is not None
    rng = random.Random(spec.seed)
    records: list[RequestRecord] = []
    tasks: set[asyncio.Task[None]] = set()
    start = time.perf_counter()
    deadline = None if spec.duration_s is None else start + spec.duration_s

    async def one(i: int) -> None:
        record = await target.send(cycle(prompts, offset + i))
        records.append(record)
        if bar is not None:
            bar.advance(record)

    next_at = start
    try:
        for i in range(spec.requests):
            # Arrivals are scheduled on an absolute clock, so a slow iteration does not lower the rate.
            next_at += rng.expovariate(spec.rate)
            if deadline is not None and next_at >= deadline:
                break
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(one(i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
    return records
