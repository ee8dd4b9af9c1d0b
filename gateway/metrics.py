"""The gateway's own Prometheus metrics.

One registry per app, so several apps (tests) coexist. With several worker processes
(`PROMETHEUS_MULTIPROC_DIR` set before start), values live in shared files and `/metrics`
aggregates every worker through prometheus_client's multiprocess collector.
"""

from __future__ import annotations

import bisect
import os
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

from gateway.logs import current_request

# Explicit buckets: the defaults stop at 10 s and start at 5 ms, wrong for token gaps and long streams.
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_GAP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
QUEUE_BUCKETS = (0.0001, 0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
E2E_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


@dataclass(frozen=True, slots=True)
class ModelSeries:
    """One served model's labelled series, resolved once: `labels()` takes a lock and a dict
    lookup on every call, which every request would otherwise pay six times."""

    ttft: Any
    itl: Any
    tpot: Any
    e2e: Any
    prompt_tokens: Any
    generation_tokens: Any


class EndpointSeries:
    """One Triton endpoint's labelled series, resolved once (gateway.triton.pool.EndpointSeries)."""

    __slots__ = ("_in_flight", "_sent")

    def __init__(self, sent: Any, in_flight: Any) -> None:
        self._sent = sent
        self._in_flight = in_flight

    def sent(self) -> None:
        self._sent.inc()

    def in_flight(self, delta: int) -> None:
        self._in_flight.inc(delta)


class GatewayMetrics:
    def __init__(self) -> None:
        # Keyed by served model name (only configured models reach a timer, so this stays small).
        self._models: dict[str, ModelSeries] = {}
        # Collectors computed at each scrape (the model-server metrics), in every exposition.
        self._collectors: list[Any] = []
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gateway_requests",
            "HTTP requests by route, model and status.",
            ["route", "model", "status"],
            registry=r,
        )
        self.skipped_tools = Counter(
            "gateway_responses_skipped_tools",
            "Responses API tools left out of the prompt because the gateway cannot run them, by type.",
            ["type"],
            registry=r,
        )
        self.in_flight = Gauge(
            "gateway_requests_in_flight",
            "Requests being served now.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.queued = Gauge(
            "gateway_requests_queued",
            "Generation requests waiting for a slot.",
            registry=r,
            multiprocess_mode="livesum",
        )
        # By priority (gateway.http.admission.priority_label: at most 23 values) and, for
        # refusals, why: queue_full, displaced (a more urgent request took its place), timeout.
        self.admitted = Counter(
            "gateway_admitted_requests",
            "Generation requests admitted to run, by priority.",
            ["priority"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "gateway_queue_wait_seconds",
            "Time an admitted generation request waited for its slot, by priority.",
            ["priority"],
            buckets=QUEUE_BUCKETS,
            registry=r,
        )
        self.shed = Counter(
            "gateway_shed_requests",
            "Generation requests refused by admission (429), by priority and reason.",
            ["priority", "reason"],
            registry=r,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Time from request to the first generated text.",
            ["model"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "gateway_inter_token_latency_seconds",
            "Time between consecutive streamed text deltas.",
            ["model"],
            buckets=TOKEN_GAP_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "gateway_time_per_output_token_seconds",
            "Mean time per output token after the first, per request.",
            ["model"],
            buckets=TOKEN_GAP_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "gateway_e2e_request_latency_seconds",
            "Time from request to the last generated token.",
            ["model"],
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.loop_lag = Histogram(
            "gateway_event_loop_lag_seconds",
            "How late the worker's event loop ran a timer set 50 ms ahead: time it spent on work that "
            "did not yield to other streams.",
            buckets=TOKEN_GAP_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "gateway_prompt_tokens", "Prompt tokens processed.", ["model"], registry=r
        )
        self.generation_tokens = Counter(
            "gateway_generation_tokens", "Tokens generated.", ["model"], registry=r
        )
        self.triton_errors = Counter(
            "gateway_triton_errors", "Failed Triton calls by error code.", ["code"], registry=r
        )
        self.cancellations = Counter(
            "gateway_cancellations",
            "Triton requests cancelled by the gateway, by reason.",
            ["reason"],
            registry=r,
        )
        self.lora_cache_misses = Counter(
            "gateway_lora_cache_misses",
            "Requests whose LoRA adapter the engine no longer held (evicted, or a restarted Triton): "
            "the gateway sent its weights again, by adapter.",
            ["model"],
            registry=r,
        )
        self.lora_loads = Counter(
            "gateway_lora_loads",
            "LoRA adapters read from their files (first use, or again after the gateway's memory "
            "bound dropped them), by adapter.",
            ["model"],
            registry=r,
        )
        self.endpoint_healthy = Gauge(
            "gateway_triton_endpoint_healthy",
            "1 while a Triton endpoint is taking requests, 0 while it is backed off.",
            ["endpoint"],
            registry=r,
            multiprocess_mode="liveall",
        )
        # Per endpoint, how the routing policy spreads the load (a retry on another endpoint counts
        # there too).
        self.endpoint_requests = Counter(
            "gateway_triton_endpoint_requests",
            "Requests sent to each Triton endpoint.",
            ["endpoint"],
            registry=r,
        )
        self.endpoint_in_flight = Gauge(
            "gateway_triton_endpoint_in_flight",
            "Requests in flight at each Triton endpoint from this gateway.",
            ["endpoint"],
            registry=r,
            multiprocess_mode="livesum",
        )

    def endpoint(self, url: str) -> EndpointSeries:
        return EndpointSeries(self.endpoint_requests.labels(url), self.endpoint_in_flight.labels(url))

    def model(self, name: str) -> ModelSeries:
        series = self._models.get(name)
        if series is None:
            series = ModelSeries(
                ttft=self.ttft.labels(name),
                itl=self.itl.labels(name),
                tpot=self.tpot.labels(name),
                e2e=self.e2e.labels(name),
                prompt_tokens=self.prompt_tokens.labels(name),
                generation_tokens=self.generation_tokens.labels(name),
            )
            self._models[name] = series
        return series

    def add_collector(self, collector: Any) -> None:
        self._collectors.append(collector)
        self.registry.register(collector)

    def exposition(self) -> bytes:
        if multiprocess_dir():
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            # What a collector computes is this worker's (docs/deploy/inference-gateway.md).
            for collector in self._collectors:
                registry.register(collector)
            return generate_latest(registry)
        return generate_latest(self.registry)


class HistogramTally:
    """Observations of one histogram series, counted in the request and added to the series in
    one step (`flush`). A histogram's `observe` takes two locks and walks its buckets; once per
    streamed token that was the largest cost of the gateway's own per-token path, and a tally's
    `add` is one bisect. Bucket counts come out exactly as from `observe`; the sum can differ in
    its last bits (floats added in another order).

    Reads prometheus_client's histogram child (`_upper_bounds`, `_buckets`, `_sum`: the pinned
    version's layout, the same in its multiprocess mode); a child without them gets each value
    through `observe` at the flush."""

    __slots__ = ("_counts", "_series", "_sum", "_values")

    def __init__(self, series: Any) -> None:
        self._series = series
        self._sum = 0.0
        self._values: list[float] | None = None
        bounds = getattr(series, "_upper_bounds", None)
        if bounds is None or not hasattr(series, "_buckets") or not hasattr(series, "_sum"):
            self._values = []
            self._counts: list[int] = []
        else:
            self._counts = [0] * len(bounds)

    def add(self, value: float) -> None:
        if self._values is not None:
            self._values.append(value)
            return
        # observe() puts a value in the first bucket whose bound is >= it: bisect_left's index.
        self._counts[bisect.bisect_left(self._series._upper_bounds, value)] += 1
        self._sum += value

    def flush(self) -> None:
        series = self._series
        if self._values is not None:
            for value in self._values:
                series.observe(value)
            self._values.clear()
            return
        counts = self._counts
        if not any(counts):
            return
        series._sum.inc(self._sum)
        for i, n in enumerate(counts):
            if n:
                series._buckets[i].inc(n)
                counts[i] = 0
        self._sum = 0.0


class RequestTimer:
    """Times one generation request: TTFT at the first text, gaps between texts, TPOT, end to end.

    The gaps are tallied in the request and flushed into the histogram at most every
    FLUSH_S seconds and when the request ends (`close`), so a scrape sees them that late at most."""

    FLUSH_S = 1.0

    __slots__ = ("_first", "_flushed", "_itl", "_last", "_model", "_series", "_start")

    def __init__(self, metrics: GatewayMetrics | None, model: str) -> None:
        self._model = model
        self._series = metrics.model(model) if metrics is not None else None
        self._itl = HistogramTally(self._series.itl) if self._series is not None else None
        self._start = time.perf_counter()
        self._first: float | None = None
        self._last = 0.0
        self._flushed = self._start

    def text(self) -> None:
        now = time.perf_counter()
        if self._first is None:
            self._first = now
            if self._series is not None:
                self._series.ttft.observe(now - self._start)
        elif self._itl is not None:
            self._itl.add(now - self._last)
            if now - self._flushed >= self.FLUSH_S:
                self._flushed = now
                self._itl.flush()
        self._last = now

    def close(self) -> None:
        """The request ended, however it did: the gaps still tallied go to the histogram."""
        if self._itl is not None:
            self._itl.flush()

    def done(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.close()
        record = current_request.get()
        if record is not None:
            record.model = self._model
            record.prompt_tokens = prompt_tokens
            record.completion_tokens = completion_tokens
            record.ttft_s = None if self._first is None else self._first - self._start
        series = self._series
        if series is None:
            return
        end = time.perf_counter()
        series.prompt_tokens.inc(prompt_tokens)
        series.generation_tokens.inc(completion_tokens)
        series.e2e.observe(end - self._start)
        if self._first is not None and completion_tokens > 1:
            series.tpot.observe((end - self._first) / (completion_tokens - 1))
