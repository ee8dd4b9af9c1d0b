"""The priority scenario's figures: per-class TTFT and sheds, priority inversions, the checks."""

from __future__ import annotations

from loadtest.metrics import RequestRecord
from loadtest.priority import PriorityConfig, PriorityResult, _class_stats, inversions, markdown


def ok(start: float, first: float, end: float | None = None) -> RequestRecord:
    return RequestRecord(start=start, end=end if end is not None else first + 0.1, chunk_times=(first,))


def shed(start: float, end: float) -> RequestRecord:
    return RequestRecord(start=start, end=end, error="http_429")


def test_a_shed_high_request_is_an_inversion_only_if_a_low_one_already_waiting_is_admitted_after_it() -> None:
    high_shed = [shed(10.0, 10.01)]
    # Arrived before, first token long after: it was admitted after the refusal.
    assert inversions(high_shed, [ok(9.0, 11.0)]) == 1
    # Already running (first token before the refusal, or just after it, in flight).
    assert inversions(high_shed, [ok(8.0, 9.5), ok(9.9, 10.03)]) == 0
    # Arrived after the refusal: admitted later is no inversion.
    assert inversions(high_shed, [ok(10.5, 10.6)]) == 0
    # Refused low requests are never admitted.
    assert inversions(high_shed, [shed(9.0, 12.0)]) == 0


def test_class_stats_count_sheds_apart_from_other_errors_and_take_ttft_of_successes() -> None:
    records = [
        ok(0.0, 0.010),
        ok(0.0, 0.030),
        shed(0.0, 0.001),
        RequestRecord(start=0.0, end=1.0, error="http_500"),
    ]
    stats = _class_stats("high", -10, records)
    assert (stats.sent, stats.ok, stats.shed, stats.errors) == (4, 2, 1, {"http_500": 1})
    assert abs(stats.ttft_p50_ms - 20.0) < 1e-6


def test_the_checks_hold_the_issues_targets() -> None:
    high = _class_stats("high", -10, [ok(0.0, 0.010)] * 3)
    low = _class_stats("low", 10, [ok(0.0, 0.050)] * 3 + [shed(0.0, 0.1)])
    passing = PriorityResult(PriorityConfig(), high, low, 1.0)
    assert passing.ttft_ratio == 5.0
    assert all(good for good, _ in passing.checks())
    assert "| high | -10 | 3 | 3 | 0 | 0 | 10.0 |" in markdown(passing)
    close = _class_stats("low", 10, [ok(0.0, 0.020)] * 3 + [shed(0.0, 0.1)])
    assert not PriorityResult(PriorityConfig(), high, close, 1.0).checks()[0][0]
    not_overloaded = _class_stats("low", 10, [ok(0.0, 0.050)])
    assert not PriorityResult(PriorityConfig(), high, not_overloaded, 1.0).checks()[1][0]
    inverted = _class_stats("high", -10, [ok(0.0, 0.010), shed(0.0, 0.01)], inverted=1)
    assert not PriorityResult(PriorityConfig(), inverted, low, 1.0).checks()[2][0]
