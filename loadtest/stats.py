"""Percentiles and distribution summaries (numpy's default "linear" method, without numpy)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PERCENTILES = (50.0, 90.0, 99.0)


def percentile(values: Sequence[float], q: float, *, presorted: bool = False) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks.

    Same definition as `numpy.percentile(values, q)` (method="linear"): the rank is q/100 * (n - 1).
    NaN for an empty sequence, so a summary of a run with no successes stays well defined.
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    n = len(values)
    if n == 0:
        return math.nan
    xs = values if presorted else sorted(values)
    rank = q / 100.0 * (n - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, n - 1)
    frac = rank - lo
    if frac == 0.0 or xs[lo] == xs[hi]:
        return float(xs[lo])
    # numpy's _lerp form: exact at both ends and monotonic in frac.
    a, b = float(xs[lo]), float(xs[hi])
    diff = b - a
    return b - diff * (1.0 - frac) if frac >= 0.5 else a + diff * frac


@dataclass(frozen=True, slots=True)
class Distribution:
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Distribution:
        xs = sorted(values)
        if not xs:
            nan = math.nan
            return cls(0, nan, nan, nan, nan, nan, nan)
        return cls(
            count=len(xs),
            mean=math.fsum(xs) / len(xs),
            p50=percentile(xs, 50.0, presorted=True),
            p90=percentile(xs, 90.0, presorted=True),
            p99=percentile(xs, 99.0, presorted=True),
            min=xs[0],
            max=xs[-1],
        )
