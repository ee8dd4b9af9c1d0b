"""`least_outstanding`: the endpoint with the fewest requests in flight from this gateway."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.routing.base import E, RouteRequest, RoutingSettings, least_loaded


class LeastOutstanding:
    needs_prompt_ids = False

    def __init__(self, settings: RoutingSettings) -> None:
        del settings

    def choose(self, endpoints: Sequence[E], request: RouteRequest) -> E:
        return least_loaded(endpoints)
