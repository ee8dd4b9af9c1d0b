"""The A/B bench measures each gateway target right after its twin from the other checkout."""

from __future__ import annotations

from loadtest import bench
from loadtest.bench_against import _targets


def test_each_gateway_target_follows_its_base_twin_and_other_targets_stay_single() -> None:
    targets = _targets()
    keys = [t.key for t in targets]
    for t in bench.TARGETS:
        if t.kind == "gateway":
            at = keys.index(t.key)
            twin = targets[at - 1]
            assert twin.key == "base-" + t.key
            assert twin.label == t.label + " [base]"
            assert (twin.endpoint, twin.route, twin.transport) == (t.endpoint, t.route, t.transport)
        else:
            assert "base-" + t.key not in keys
