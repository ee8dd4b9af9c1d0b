"""Several Triton endpoints serving the same models: health, routing, backoff.

A request goes to the healthy endpoint the routing policy chooses (gateway/routing/: the fewest requests
in flight by default). An endpoint that fails is skipped for a backoff period that doubles with
each consecutive failure; a background probe (and any later success) brings it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Protocol, TypeVar

import grpc
from tritonclient.grpc import model_config_pb2

from gateway.errors import EngineUnavailableError, GatewayError
from gateway.routing.base import RouteRequest, RoutingPolicy
from gateway.routing.registry import make_policy
from gateway.triton.connection import TritonConnection, rpc_error
from gateway.triton.http import TritonHttp

logger = logging.getLogger(__name__)
_NO_ROUTE = RouteRequest()
_T = TypeVar("_T")


class EndpointSeries(Protocol):
    """An endpoint's metrics: requests sent to it, and those in flight there."""

    def sent(self) -> None: ...

    def in_flight(self, delta: int) -> None: ...


class Endpoint:
    __slots__ = ("connection", "failures", "http", "outstanding", "retry_at", "series")

    def __init__(
        self,
        connection: TritonConnection,
        series: EndpointSeries | None = None,
        http: TritonHttp | None = None,
    ) -> None:
        self.connection = connection
        # The same Triton's HTTP endpoint, when configured: generation streams over it.
        self.http = http
        self.outstanding = 0
        self.failures = 0
        self.retry_at = 0.0
        self.series = series

    def begin(self) -> None:
        """A request was sent here (each attempt of a request counts)."""
        self.outstanding += 1
        if self.series is not None:
            self.series.sent()
            self.series.in_flight(1)

    def end(self) -> None:
        self.outstanding -= 1
        if self.series is not None:
            self.series.in_flight(-1)

    @property
    def url(self) -> str:
        return self.connection.url

    def available(self, now: float) -> bool:
        return self.failures == 0 or now >= self.retry_at


class TritonPool:
    def __init__(
        self,
        urls: Iterable[str],
        *,
        timeout_s: float,
        http_urls: Sequence[str] = (),
        stream_idle_s: float | None = None,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        probe_interval_s: float = 2.0,
        on_health: Callable[[str, bool], None] | None = None,
        policy: RoutingPolicy | None = None,
        series: Callable[[str], EndpointSeries] | None = None,
    ) -> None:
        self.endpoints = [
            Endpoint(TritonConnection(u, timeout_s=timeout_s), series(u) if series is not None else None)
            for u in urls
        ]
        if not self.endpoints:
            raise ValueError("at least one Triton URL is needed")
        if http_urls:
            if len(http_urls) != len(self.endpoints):
                raise ValueError("one Triton HTTP URL per gRPC URL is needed")
            for endpoint, url in zip(self.endpoints, http_urls, strict=True):
                endpoint.http = TritonHttp(url, timeout_s=timeout_s, stream_idle_s=stream_idle_s)
        # How long a started stream may stay silent (None: no bound of its own).
        self.stream_idle_s = stream_idle_s
        self._backoff = backoff_s
        self._max_backoff = max_backoff_s
        self._probe_interval = probe_interval_s
        self._probe: asyncio.Task[None] | None = None
        self._on_health = on_health
        self.policy = policy if policy is not None else make_policy("least_outstanding")
        for endpoint in self.endpoints:
            self._report(endpoint)

    def _report(self, endpoint: Endpoint) -> None:
        if self._on_health is not None:
            self._on_health(endpoint.url, endpoint.failures == 0)

    def pick(self, exclude: Iterable[Endpoint] = (), route: RouteRequest | None = None) -> Endpoint:
        """The policy's choice among the available endpoints not yet tried; if all are backing
        off, the one that comes back first (a request is better tried than refused outright)."""
        skip = set(map(id, exclude))
        candidates = [e for e in self.endpoints if id(e) not in skip]
        if not candidates:
            raise EngineUnavailableError("no Triton endpoint is available")
        now = time.monotonic()
        ready = [e for e in candidates if e.available(now)]
        if ready:
            return self.policy.choose(ready, route or _NO_ROUTE)
        return min(candidates, key=lambda e: e.retry_at)

    def failed(self, endpoint: Endpoint, reason: str) -> None:
        endpoint.failures += 1
        delay = min(self._backoff * 2 ** (endpoint.failures - 1), self._max_backoff)
        endpoint.retry_at = time.monotonic() + delay
        logger.warning("Triton %s failed (%s); backing off %.1f s", endpoint.url, reason, delay)
        self._report(endpoint)

    def succeeded(self, endpoint: Endpoint) -> None:
        if endpoint.failures:
            logger.info("Triton %s is back", endpoint.url)
        was_failing = endpoint.failures > 0
        endpoint.failures = 0
        endpoint.retry_at = 0.0
        if was_failing:
            self._report(endpoint)

    def healthy_count(self) -> int:
        now = time.monotonic()
        return sum(1 for e in self.endpoints if e.available(now))

    async def _probe_once(self) -> None:
        for endpoint in self.endpoints:
            if endpoint.failures == 0:
                continue
            try:
                ok = await endpoint.connection.server_ready()
            except grpc.aio.AioRpcError:
                ok = False
            if ok:
                self.succeeded(endpoint)

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self._probe_interval)
            await self._probe_once()

    def start(self) -> None:
        if self._probe is None and len(self.endpoints) > 1:
            self._probe = asyncio.create_task(self._probe_loop())

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        for endpoint in self.endpoints:
            await endpoint.connection.close()
            if endpoint.http is not None:
                await endpoint.http.close()


async def first_answer(pool: TritonPool, model: str, ask: Callable[[Endpoint], Awaitable[_T]]) -> _T:
    """`ask` the endpoints one after another (the pool's choice each time, none twice) until one
    answers: what start-up introspection reads (a model's config) any Triton that is up can tell.
    When none answers, the last endpoint's gRPC error as the gateway's error for `model`."""
    last: GatewayError = EngineUnavailableError("no Triton endpoint is available")
    tried: list[Endpoint] = []
    for _ in pool.endpoints:
        endpoint = pool.pick(tried)
        tried.append(endpoint)
        try:
            return await ask(endpoint)
        except grpc.aio.AioRpcError as exc:
            last = rpc_error(exc, model, url=endpoint.url)
    raise last


async def read_model_config(pool: TritonPool, model: str) -> model_config_pb2.ModelConfig:
    """`model`'s config from the first endpoint that answers (see `first_answer`)."""
    return await first_answer(pool, model, lambda endpoint: endpoint.connection.model_config(model))
