"""The load generator's percentile math agrees with numpy's default (linear) method."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadtest.stats import Distribution, percentile

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@given(st.lists(finite, min_size=1, max_size=200), st.floats(min_value=0, max_value=100))
def test_percentile_matches_numpy_linear(values, q):
    expected = float(np.percentile(np.array(values), q))
    assert percentile(values, q) == pytest.approx(expected, rel=1e-12, abs=1e-9)


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([5.0], 99, 5.0),
        ([1.0, 2.0], 50, 1.5),
        ([1.0, 2.0, 3.0, 4.0], 90, 3.7),
        ([10.0, 1.0, 7.0], 0, 1.0),
        ([10.0, 1.0, 7.0], 100, 10.0),
    ],
)
def test_percentile_known_values(values, q, expected):
    assert percentile(values, q) == pytest.approx(expected)


def test_percentile_of_nothing_is_nan():
    assert math.isnan(percentile([], 50))


@pytest.mark.parametrize("q", [-1, 100.5])
def test_percentile_out_of_range_is_rejected(q):
    with pytest.raises(ValueError):
        percentile([1.0], q)


def test_distribution_reports_the_numpy_percentiles():
    xs = [0.3, 0.1, 0.9, 0.5, 0.2, 0.8]
    d = Distribution.of(xs)
    assert d.count == 6
    assert d.p50 == pytest.approx(np.percentile(xs, 50))
    assert d.p90 == pytest.approx(np.percentile(xs, 90))
    assert d.p99 == pytest.approx(np.percentile(xs, 99))
    assert (d.min, d.max) == (0.1, 0.9)
    assert d.mean == pytest.approx(np.mean(xs))


def test_distribution_of_nothing_is_all_nan():
    d = Distribution.of([])
    assert d.count == 0
    assert all(math.isnan(v) for v in (d.mean, d.p50, d.p90, d.p99))
