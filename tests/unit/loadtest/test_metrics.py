"""Metric computation from scripted request timelines."""

import math

import pytest

from loadtest.metrics import RequestRecord, summarize


def streamed(start, first, gap, chunks, tokens=None, error=None):
    times = tuple(first + i * gap for i in range(chunks))
    end = times[-1] if times else first
    return RequestRecord(
        start=start,
        end=end,
        chunk_times=times,
        output_tokens=chunks if tokens is None else tokens,
        usage_reported=tokens is not None,
        error=error,
    )


def test_ttft_itl_tpot_and_e2e_of_one_request():
    r = streamed(start=10.0, first=10.25, gap=0.05, chunks=5)
    assert r.ttft == pytest.approx(0.25)
    assert r.itls() == pytest.approx([0.05] * 4)
    assert r.e2e == pytest.approx(0.45)
    assert r.tpot == pytest.approx((0.45 - 0.25) / 4)


def test_tpot_uses_usage_tokens_when_chunks_carry_several():
    # 3 chunks carrying 9 tokens: TPOT divides by tokens, ITL stays per chunk.
    r = streamed(start=0.0, first=0.1, gap=0.3, chunks=3, tokens=9)
    assert r.tpot == pytest.approx(0.6 / 8)
    assert r.itls() == pytest.approx([0.3, 0.3])


def test_tpot_is_undefined_for_one_token_and_for_non_streamed_requests():
    assert streamed(0.0, 0.1, 0.1, chunks=1).tpot is None
    r = RequestRecord(start=0.0, end=1.0, chunk_times=(1.0,), output_tokens=20, streamed=False)
    assert r.tpot is None
    assert r.ttft == pytest.approx(1.0)


def test_summary_counts_tokens_rates_and_errors_by_kind():
    ok = [streamed(start=float(i), first=i + 0.1, gap=0.01, chunks=11) for i in range(4)]
    bad = [
        RequestRecord(start=1.0, end=1.5, error="http_500"),
        RequestRecord(start=2.0, end=2.5, error="stream_error"),
        RequestRecord(start=2.0, end=2.1, error="http_500"),
    ]
    s = summarize(ok + bad, label="x", mode="concurrency", load=4, duration_s=5.0)
    assert s.requests == 7
    assert s.successes == 4
    assert s.errors == {"http_500": 2, "stream_error": 1}
    assert s.output_tokens == 44
    assert s.output_tokens_per_s == pytest.approx(44 / 5.0)
    assert s.requests_per_s == pytest.approx(4 / 5.0)
    assert s.ttft.p50 == pytest.approx(0.1)
    assert s.itl.count == 40
    assert s.itl.p99 == pytest.approx(0.01)
    assert s.tpot.p50 == pytest.approx(0.01)
    assert s.e2e.p50 == pytest.approx(0.2)


def test_summary_duration_defaults_to_first_start_to_last_end():
    records = [
        streamed(start=1.0, first=1.5, gap=0.5, chunks=2),
        streamed(start=2.0, first=2.5, gap=0.5, chunks=3),
    ]
    s = summarize(records, label="x", mode="rate", load=1.0)
    assert s.duration_s == pytest.approx(3.5 - 1.0)
    assert s.output_tokens_per_s == pytest.approx(5 / 2.5)


def test_summary_of_only_failures_has_no_latencies_but_still_flattens():
    s = summarize([RequestRecord(start=0.0, end=1.0, error="timeout")], label="x", mode="concurrency", load=1)
    assert s.successes == 0
    assert math.isnan(s.ttft.p50)
    row = s.flat()
    assert row["ttft_p50_ms"] is None
    assert row["error_kinds"] == "timeout=1"
