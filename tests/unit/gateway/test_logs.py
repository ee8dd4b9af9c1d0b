"""Log helpers: how often a repeating condition is reported."""

from __future__ import annotations

from gateway.logs import Repeating


def test_a_repeating_failure_is_logged_at_a_falling_rate_and_at_once_when_it_changes() -> None:
    repeat = Repeating(first_interval_s=1.0, max_interval_s=8.0)
    logged = [t for t in range(40) if repeat.should_log("refused", now=float(t))]
    assert logged == [0, 1, 3, 7, 15, 23, 31, 39]  # 1, 2, 4, 8 s apart, then every 8 s
    assert repeat.take_suppressed() == 40 - len(logged)
    assert repeat.should_log("DNS resolution failed", now=39.5)
