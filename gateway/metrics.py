"""The gateway's own Prometheus metrics, on a registry per app so several apps (tests) coexist."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.logs import current_request

# Explicit buckets: the defaults stop at 10 s and start at 5 ms, wrong for both token gaps and long streams.
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gateway_requests", "HTTP requests by route and status.", ["route", "status"], registry=r
        )
        self.in_flight = Gauge("gateway_requests_in_flight", "Requests being served now.", registry=r)
        self.queued = Gauge("gateway_requests_queued", "Generation requests waiting for a slot.", registry=r)
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Time from request to the first generated text.",
            ["model"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "gateway_time_per_output_token_seconds",
            "Mean time per output token after the first, per request.",
            ["model"],
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "gateway_prompt_tokens", "Prompt tokens processed.", ["model"], registry=r
        )
        self.generation_tokens = Counter(
            "gateway_generation_tokens", "Tokens generated.", ["model"], registry=r
        )


class RequestTimer:
    """Times one generation request: TTFT at the first text, TPOT over the rest."""

    __slots__ = ("_first", "_metrics", "_model", "_start")

    def __init__(self, metrics: GatewayMetrics | None, model: str) -> None:
        self._metrics = metrics
        self._model = model
        self._start = time.perf_counter()
        self._first: float | None = None

    def first_text(self) -> None:
        if self._first is None:
            self._first = time.perf_counter()
            if self._metrics is not None:
                self._metrics.ttft.labels(self._model).observe(self._first - self._start)

    def done(self, prompt_tokens: int, completion_tokens: int) -> None:
        record = current_request.get()
        if record is not None:
            record.model = self._model
            record.prompt_tokens = prompt_tokens
            record.completion_tokens = completion_tokens
            record.ttft_s = None if self._first is None else self._first - self._start
        m = self._metrics
        if m is None:
            return
        m.prompt_tokens.labels(self._model).inc(prompt_tokens)
        m.generation_tokens.labels(self._model).inc(completion_tokens)
        if self._first is not None and completion_tokens > 1:
            m.tpot.labels(self._model).observe((time.perf_counter() - self._first) / (completion_tokens - 1))
