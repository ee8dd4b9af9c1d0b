"""The gateway as an Inference Gateway model server, on the dev stack (`make run`: the CPU engine): its
/metrics read under load by the port of the endpoint picker's extractor (tests/support/epp_metrics,
the `vllm` engine type). Two adapters run while two more requests wait in the admission queue:
waiting counts the queue, running what is in flight, the KV usage follows the CPU engine's blocks
and the running adapters are named. Readiness waits only; the streams are cut once seen."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from gateway.devserver import DEV_LORA_CACHE_ADAPTERS
from tests.support import epp_metrics
from tests.support.gateway_process import GatewayProcess
from tests.support.lora import write_numpy_adapter

BASE = "tiny"
ADAPTERS = ("ig-a1", "ig-a2")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """`gateway dev` as `make run` starts it (the CPU engine on the tiny model), with two adapters and
    two generation slots; Triton's metrics read at most every 50 ms."""
    root = tmp_path_factory.mktemp("ig-lora")
    args = ["--max-concurrent-requests", "2", "--triton-metrics-cache-s", "0.05", "--log-level", "warning"]
    for seed, name in enumerate(ADAPTERS):
        args += ["--lora", f"{name}={write_numpy_adapter(root / name, seed=seed)}"]
    process = GatewayProcess(args, command="dev").start(timeout=600)
    try:
        yield process
    finally:
        process.stop()


async def _read_until(
    client: httpx.AsyncClient, condition: Callable[[epp_metrics.EndpointMetrics], bool], timeout: float = 60.0
) -> epp_metrics.EndpointMetrics:
    deadline = time.monotonic() + timeout
    while True:
        found = epp_metrics.extract((await client.get("/metrics")).text)
        if condition(found):
            return found
        assert time.monotonic() < deadline, f"not reached; last read: {found}"
        await asyncio.sleep(0.02)


async def _stream(client: httpx.AsyncClient, model: str, started: asyncio.Event, stop: asyncio.Event) -> None:
    """A long completion (EOS ignored, the dev default's 16k tokens) held until `stop`, then cut."""
    body = {"model": model, "prompt": "Once upon a time", "stream": True, "ignore_eos": True}
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for _ in response.aiter_raw():
            started.set()
            if stop.is_set():
                return
        started.set()


async def test_the_epp_reads_waiting_running_kv_and_adapters_under_load(gateway: GatewayProcess) -> None:
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=120) as client:
        # On the fresh stack, before any request, every metric the vllm engine type reads is there
        # (the EPP would log no error).
        idle = epp_metrics.extract((await client.get("/metrics")).text)
        assert idle.errors == [] and idle.running_requests_size == 0
        assert idle.waiting_queue_size == 0
        assert idle.active_models == set() and idle.max_active_models == DEV_LORA_CACHE_ADAPTERS
        assert idle.cache_block_size and idle.cache_num_blocks
        assert idle.kv_cache_usage_percent is not None and 0 <= idle.kv_cache_usage_percent < 1

        stop = asyncio.Event()
        started = {name: asyncio.Event() for name in (*ADAPTERS, BASE, f"{BASE}-2")}
        tasks = [asyncio.create_task(_stream(client, name, started[name], stop)) for name in ADAPTERS]
        await asyncio.wait_for(asyncio.gather(*(started[n].wait() for n in ADAPTERS)), 60)
        # Both slots are taken: two more requests for the base model wait in the admission queue.
        tasks += [
            asyncio.create_task(_stream(client, BASE, started[key], stop)) for key in (BASE, f"{BASE}-2")
        ]
        try:
            loaded = await _read_until(client, lambda m: m.waiting_queue_size == 2)
            assert loaded.running_requests_size == 2
            assert loaded.active_models == set(ADAPTERS) and loaded.waiting_models == set()
            # The engine's KV gauges reach Triton's metrics port from the Python model's own process,
            # a moment after its blocks are taken (longer on a busy machine): the EPP sees them on a
            # later scrape, as here.
            used = await _read_until(
                client, lambda m: (m.kv_cache_usage_percent or 0.0) > (idle.kv_cache_usage_percent or 0.0)
            )
            assert used.running_requests_size == 2 and used.waiting_queue_size == 2
            assert not any(started[k].is_set() for k in (BASE, f"{BASE}-2"))
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 120)
        after = await _read_until(client, lambda m: m.waiting_queue_size == m.running_requests_size == 0)
        assert after.active_models == set()


def test_the_reader_runs_against_a_url(gateway: GatewayProcess, capsys: pytest.CaptureFixture[str]) -> None:
    assert epp_metrics.main([gateway.base_url + "/metrics"]) == 0
    assert f'"max_active_models": {DEV_LORA_CACHE_ADAPTERS}' in capsys.readouterr().out
