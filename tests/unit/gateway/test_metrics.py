"""The per-request histogram tally gives the histogram what observing each value would."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest, multiprocess
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import TOKEN_GAP_BUCKETS, GatewayMetrics, HistogramTally, RequestTimer

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _samples(registry: CollectorRegistry) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
        if not s.name.endswith("_created")
    }


def _gaps() -> list[float]:
    rng = random.Random(7)
    # Every bucket, both sides of each bound, the bounds themselves and past the last one.
    values = list(TOKEN_GAP_BUCKETS) + [b * 1.0001 for b in TOKEN_GAP_BUCKETS] + [0.0, 9.0]
    return values + [rng.uniform(0, 3) for _ in range(500)]


def _observed_and_tallied() -> tuple[Samples, Samples]:
    results = []
    for tallied in (False, True):
        registry = CollectorRegistry()
        series = Histogram("gap_seconds", "gaps", ["model"], buckets=TOKEN_GAP_BUCKETS, registry=registry)
        child = series.labels("m")
        tally = HistogramTally(child)
        for value in _gaps():
            if tallied:
                tally.add(value)
            else:
                child.observe(value)
        tally.flush()
        results.append(_samples(registry))
    return results[0], results[1]


def _assert_same(observed: Samples, tallied: Samples) -> None:
    assert observed.keys() == tallied.keys()
    for key, value in observed.items():
        if key[0].endswith("_sum"):
            assert tallied[key] == pytest.approx(value, rel=1e-12)
        else:
            assert tallied[key] == value, key


def test_a_flushed_tally_gives_the_histogram_of_each_value_observed() -> None:
    observed, tallied = _observed_and_tallied()
    _assert_same(observed, tallied)


def test_a_tally_flushed_twice_adds_nothing_the_second_time() -> None:
    registry = CollectorRegistry()
    child = Histogram("gap_seconds", "gaps", buckets=TOKEN_GAP_BUCKETS, registry=registry)
    tally = HistogramTally(child)
    tally.add(0.003)
    tally.flush()
    tally.flush()
    assert _samples(registry)[("gap_seconds_count", ())] == 1.0


def test_a_tally_in_multiprocess_mode_gives_what_observing_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = []
    for tallied in (False, True):
        directory = tmp_path / str(tallied)
        directory.mkdir()
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
        from prometheus_client import values

        values.ValueClass = values.get_value_class()
        try:
            child = Histogram("gap_seconds", "gaps", buckets=TOKEN_GAP_BUCKETS, registry=CollectorRegistry())
            tally = HistogramTally(child)
            for value in _gaps():
                if tallied:
                    tally.add(value)
                else:
                    child.observe(value)
            tally.flush()
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=str(directory))
            results.append(_samples(registry))
        finally:
            monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
            values.ValueClass = values.get_value_class()
    _assert_same(results[0], results[1])


def test_a_timer_puts_every_gap_in_the_histogram_when_the_request_ends() -> None:
    metrics = GatewayMetrics()
    timer = RequestTimer(metrics, "m")
    for _ in range(5):
        timer.text()
    samples = _samples(metrics.registry)
    assert samples[("gateway_inter_token_latency_seconds_count", (("model", "m"),))] == 0.0
    timer.close()
    samples = _samples(metrics.registry)
    # Five texts: the first is the time to first token, four gaps follow it.
    assert samples[("gateway_inter_token_latency_seconds_count", (("model", "m"),))] == 4.0
    assert samples[("gateway_time_to_first_token_seconds_count", (("model", "m"),))] == 1.0
