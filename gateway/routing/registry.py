"""The routing policies by name: `--routing-policy` takes its allowed values from here."""

from __future__ import annotations

from collections.abc import Callable

from gateway.routing.base import RoutingPolicy, RoutingSettings
from gateway.routing.least_outstanding import LeastOutstanding
from gateway.routing.prefix import PrefixAware
from gateway.routing.round_robin import RoundRobin

POLICIES: dict[str, Callable[[RoutingSettings], RoutingPolicy]] = {
    "least_outstanding": LeastOutstanding,
    "round_robin": RoundRobin,
    "prefix": PrefixAware,
}
POLICY_NAMES = tuple(POLICIES)
DEFAULT_POLICY = "least_outstanding"


def make_policy(name: str, settings: RoutingSettings | None = None) -> RoutingPolicy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"routing policy must be one of {', '.join(POLICY_NAMES)}, not {name!r}") from None
    return factory(settings or RoutingSettings())
