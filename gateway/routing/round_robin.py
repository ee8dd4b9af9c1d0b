"""`round_robin`: each request to the next endpoint in turn, whatever its load."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.routing.base import E, RouteRequest, RoutingSettings


class RoundRobin:
    needs_prompt_ids = False

    def __init__(self, settings: RoutingSettings) -> None:
        del settings
        self._turn = 0

    def choose(self, endpoints: Sequence[E], request: RouteRequest) -> E:
        endpoint = endpoints[self._turn % len(endpoints)]
        self._turn += 1
        return endpoint
