"""Per-request timelines and the run summary computed from them.

Every client records the same `RequestRecord` (absolute `time.perf_counter()` stamps), so the
numbers of different targets are computed by one piece of code and are comparable.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from loadtest.stats import Distribution


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request's timeline.

    `chunk_times` are the arrival times of the reads that carried non-empty output text (for a
    non-streaming request: the time the whole body arrived). `output_tokens` comes from the
    server's usage when it reported one, otherwise it is the number of content chunks.
    """

    start: float
    end: float
    chunk_times: tuple[float, ...] = ()
    output_tokens: int = 0
    prompt_tokens: int | None = None
    usage_reported: bool = False
    streamed: bool = True
    error: str | None = None
    error_detail: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.start if self.chunk_times else None

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (e2e - ttft) / (tokens - 1)."""
        ttft = self.ttft
        if not self.streamed or ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - ttft) / (self.output_tokens - 1)

    def itls(self) -> list[float]:
        """Gaps between consecutive content chunks (a chunk may carry several tokens)."""
        ts = self.chunk_times
        return [ts[i] - ts[i - 1] for i in range(1, len(ts))]


@dataclass(frozen=True, slots=True)
class RunSummary:
    label: str
    mode: str  # "concurrency" or "rate"
    load: float  # the concurrency, or the Poisson rate in requests/s
    duration_s: float
    requests: int
    successes: int
    errors: dict[str, int]
    output_tokens: int
    prompt_tokens: int
    output_tokens_per_s: float
    requests_per_s: float
    ttft: Distribution
    itl: Distribution
    tpot: Distribution
    e2e: Distribution
    tokens_per_request: Distribution
    extra: dict[str, float] = field(default_factory=dict)
    # The first error message of each kind (the server's own words for an HTTP error).
    error_details: dict[str, str] = field(default_factory=dict)

    def flat(self) -> dict[str, object]:
        """One CSV row: scalars, then `<metric>_<stat>` columns in milliseconds for latencies."""
        row: dict[str, object] = {
            "label": self.label,
            "mode": self.mode,
            "load": self.load,
            "duration_s": round(self.duration_s, 4),
            "requests": self.requests,
            "successes": self.successes,
            "errors": sum(self.errors.values()),
            "error_kinds": ";".join(f"{k}={v}" for k, v in sorted(self.errors.items())),
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens_per_s": round(self.output_tokens_per_s, 3),
            "requests_per_s": round(self.requests_per_s, 4),
        }
        for name in ("ttft", "itl", "tpot", "e2e"):
            dist: Distribution = getattr(self, name)
            for stat in ("mean", "p50", "p90", "p99"):
                row[f"{name}_{stat}_ms"] = _ms(getattr(dist, stat))
        row["tokens_per_request_mean"] = _round(self.tokens_per_request.mean, 3)
        for key, value in sorted(self.extra.items()):
            row[key] = _round(value, 6)
        return row


def summarize(
    records: Sequence[RequestRecord],
    *,
    label: str,
    mode: str,
    load: float,
    duration_s: float | None = None,
    extra: dict[str, float] | None = None,
) -> RunSummary:
    """Aggregate a run. Latency statistics use successful requests only; errors are counted by kind.

    The duration defaults to the span from the first request's start to the last one's end, so
    throughput is not diluted by set-up time before the first request.
    """
    ok = [r for r in records if r.ok]
    if duration_s is None:
        duration_s = (max(r.end for r in records) - min(r.start for r in records)) if records else 0.0
    out_tokens = sum(r.output_tokens for r in ok)
    itls: list[float] = []
    for r in ok:
        if r.streamed:
            itls.extend(r.itls())
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: math.nan)
    return RunSummary(
        label=label,
        mode=mode,
        load=load,
        duration_s=duration_s,
        requests=len(records),
        successes=len(ok),
        errors=dict(Counter(r.error for r in records if r.error is not None)),
        error_details=_first_details(records),
        output_tokens=out_tokens,
        prompt_tokens=sum(r.prompt_tokens or 0 for r in ok),
        output_tokens_per_s=per_s(out_tokens),
        requests_per_s=per_s(len(ok)),
        ttft=Distribution.of(t for r in ok if (t := r.ttft) is not None),
        itl=Distribution.of(itls),
        tpot=Distribution.of(t for r in ok if (t := r.tpot) is not None),
        e2e=Distribution.of(r.e2e for r in ok),
        tokens_per_request=Distribution.of(float(r.output_tokens) for r in ok),
        extra=dict(extra or {}),
    )


def _ms(seconds: float) -> float | None:
    return None if math.isnan(seconds) else round(seconds * 1000.0, 4)


def _round(value: float, digits: int) -> float | None:
    return None if isinstance(value, float) and math.isnan(value) else round(value, digits)


def _first_details(records: Sequence[RequestRecord]) -> dict[str, str]:
    details: dict[str, str] = {}
    for r in records:
        if r.error is not None and r.error_detail and r.error not in details:
            details[r.error] = r.error_detail
    return details
