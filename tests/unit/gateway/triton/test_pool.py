"""Routing over several Triton endpoints: least outstanding, backoff, recovery."""

from __future__ import annotations

import grpc
import pytest

from gateway.errors import EngineUnavailableError
from gateway.metrics import GatewayMetrics
from gateway.triton.pool import Endpoint, TritonPool, first_answer


@pytest.fixture
async def pool():
    p = TritonPool(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], timeout_s=0.1, backoff_s=10)
    yield p
    await p.close()


async def test_the_least_loaded_endpoint_is_picked(pool: TritonPool) -> None:
    a, b, c = pool.endpoints
    a.outstanding, b.outstanding, c.outstanding = 3, 1, 2
    assert pool.pick() is b
    assert pool.pick(exclude=[b]) is c


async def test_a_failed_endpoint_is_skipped_until_its_backoff_ends(pool: TritonPool) -> None:
    a, b, _ = pool.endpoints
    pool.failed(a, "test")
    assert all(pool.pick() is not a for _ in range(5))
    assert pool.healthy_count() == 2
    pool.failed(a, "again")
    assert a.retry_at - b.retry_at > 15  # the backoff doubled
    pool.succeeded(a)
    assert a.failures == 0 and pool.healthy_count() == 3


async def test_when_all_are_backing_off_the_first_to_return_is_tried(pool: TritonPool) -> None:
    for e in pool.endpoints:
        pool.failed(e, "down")
    pool.endpoints[1].retry_at -= 5
    assert pool.pick() is pool.endpoints[1]


async def test_running_out_of_endpoints_is_unavailable(pool: TritonPool) -> None:
    with pytest.raises(EngineUnavailableError):
        pool.pick(exclude=pool.endpoints)


async def test_each_endpoint_reports_requests_sent_and_in_flight_to_its_metrics() -> None:
    metrics = GatewayMetrics()
    pool = TritonPool(["a:1", "b:2"], timeout_s=1.0, series=metrics.endpoint)
    try:
        a, b = pool.endpoints
        a.begin()
        a.begin()
        b.begin()
        a.end()
        sample = metrics.registry.get_sample_value
        assert sample("gateway_triton_endpoint_requests_total", {"endpoint": "a:1"}) == 2
        assert sample("gateway_triton_endpoint_requests_total", {"endpoint": "b:2"}) == 1
        assert sample("gateway_triton_endpoint_in_flight", {"endpoint": "a:1"}) == 1
        assert sample("gateway_triton_endpoint_in_flight", {"endpoint": "b:2"}) == 1
        assert (a.outstanding, b.outstanding) == (1, 1)
    finally:
        await pool.close()


def _refused() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details="connection refused"
    )


async def test_introspection_asks_each_endpoint_once_until_one_answers(pool: TritonPool) -> None:
    asked: list[str] = []

    async def ask(endpoint: Endpoint) -> str:
        asked.append(endpoint.url)
        if len(asked) < 3:
            raise _refused()
        return f"config from {endpoint.url}"

    assert await first_answer(pool, "m", ask) == f"config from {asked[-1]}"
    assert sorted(asked) == sorted(e.url for e in pool.endpoints)


async def test_introspection_with_no_endpoint_answering_names_the_last_one(pool: TritonPool) -> None:
    asked: list[str] = []

    async def ask(endpoint: Endpoint) -> str:
        asked.append(endpoint.url)
        raise _refused()

    with pytest.raises(EngineUnavailableError) as caught:
        await first_answer(pool, "m", ask)
    assert len(asked) == 3 and asked[-1] in str(caught.value) and "connection refused" in str(caught.value)
