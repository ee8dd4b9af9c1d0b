"""The model-server protocol on /metrics (fake engine, a fake Triton metrics port), read by the port of
the endpoint picker's extractor in tests/support/epp_metrics: waiting and running follow the
admission queue and Triton's queue, adapters are named, Triton's KV blocks become a usage in
[0, 1], and a metric nobody knows is absent."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import MakeClient
from tests.support import epp_metrics
from tests.support.lora import write_numpy_adapter
from tests.support.waiting import wait_until

TIGHT = {"max_concurrent_requests": 2, "max_queued_requests": 8, "queue_timeout_s": 30}

# What the C++ TensorRT-LLM backend exports for its model `tensorrt_llm` (labels as Triton adds them).
TRITON_TEXT = """\
# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} {waiting}
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 3
# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 400
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} {used}
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="tensorrt_llm",version="1"} 300
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 32
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"} 0.25
"""


class FakeTritonMetrics:
    """Triton's metrics port: the text above, with its waiting count and used blocks settable."""

    def __init__(self) -> None:
        self.waiting = 0
        self.used = 100
        self.reads = 0
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
            pass
        self.reads += 1
        body = TRITON_TEXT.replace("{waiting}", str(self.waiting)).replace("{used}", str(self.used)).encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/metrics"


@pytest.fixture
async def triton_metrics() -> AsyncIterator[FakeTritonMetrics]:
    fake = FakeTritonMetrics()
    fake.server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    yield fake
    fake.server.close()
    await fake.server.wait_closed()


async def _read(client: httpx.AsyncClient) -> epp_metrics.EndpointMetrics:
    response = await client.get("/metrics")
    assert response.status_code == 200
    return epp_metrics.extract(response.text)


async def _read_until(
    client: httpx.AsyncClient, condition: Callable[[epp_metrics.EndpointMetrics], bool]
) -> epp_metrics.EndpointMetrics:
    deadline = time.monotonic() + 10.0
    while True:
        found = await _read(client)
        if condition(found):
            return found
        assert time.monotonic() < deadline, f"not reached; last read: {found}"
        await asyncio.sleep(0.01)


def _body(model: str) -> dict:
    return {"model": model, "prompt": "hi", "max_tokens": 3}


async def test_waiting_running_and_adapters_follow_admission_and_triton_queue(
    make_client: MakeClient, tmp_path: Path, triton_metrics: FakeTritonMetrics
) -> None:
    adapters = [write_numpy_adapter(tmp_path / name) for name in ("a1", "a2")]
    settings = {
        **TIGHT,
        "lora_modules": [f"a1={adapters[0]}", f"a2={adapters[1]}"],
        "triton_metrics_url": [triton_metrics.url],
        "triton_metrics_cache_s": 0.05,
        "lora_max_running": 4,
    }
    gate = asyncio.Event()
    client, engine = await make_client(settings=settings, gate=gate)
    idle = await _read(client)
    assert idle.errors == []
    assert (idle.waiting_queue_size, idle.running_requests_size) == (0, 0)
    assert idle.active_models == set() and idle.waiting_models == set() and idle.max_active_models == 4
    assert idle.kv_cache_usage_percent == pytest.approx(0.25)
    assert (idle.cache_block_size, idle.cache_num_blocks) == (32, 400)

    # Two run (one per adapter), two wait behind them: one for a1, one for the base model.
    running = [asyncio.create_task(client.post("/v1/completions", json=_body(m))) for m in ("a1", "tiny:a2")]
    await wait_until(lambda: len(engine.active) == 2)
    waiting = [asyncio.create_task(client.post("/v1/completions", json=_body(m))) for m in ("a1", "tiny")]
    triton_metrics.waiting, triton_metrics.used = 1, 300
    seen = await _read_until(client, lambda m: m.waiting_queue_size == 3)
    # One of the two admitted requests waits in Triton's queue: it is waiting, not running.
    assert seen.running_requests_size == 1
    assert seen.active_models == {"a1", "a2"} and seen.waiting_models == set()
    assert seen.kv_cache_usage_percent == pytest.approx(0.75)

    triton_metrics.waiting = 0
    gate.set()
    for task in running + waiting:
        assert (await task).status_code == 200

    seen = await _read_until(client, lambda m: m.waiting_queue_size == 0 and m.running_requests_size == 0)
    assert seen.active_models == set()


async def test_an_adapter_only_waiting_is_listed_as_waiting(make_client: MakeClient, tmp_path: Path) -> None:
    adapter = write_numpy_adapter(tmp_path / "a1")
    settings = {"max_concurrent_requests": 1, "max_queued_requests": 4, "lora_modules": [f"a1={adapter}"]}
    gate = asyncio.Event()
    client, engine = await make_client(settings=settings, gate=gate)
    first = asyncio.create_task(client.post("/v1/completions", json=_body("tiny")))
    await wait_until(lambda: bool(engine.active))
    second = asyncio.create_task(client.post("/v1/completions", json=_body("a1")))
    seen = await _read_until(client, lambda m: m.waiting_queue_size == 1)
    assert seen.running_requests_size == 1
    assert seen.active_models == set() and seen.waiting_models == {"a1"}
    gate.set()
    assert (await first).status_code == 200 and (await second).status_code == 200


async def test_without_triton_metrics_kv_and_cache_are_absent_and_the_epp_says_so(
    make_client: MakeClient, triton_metrics: FakeTritonMetrics
) -> None:
    client, _ = await make_client(lora=False)
    text = (await client.get("/metrics")).text
    found = epp_metrics.extract(text)
    assert (found.waiting_queue_size, found.running_requests_size) == (0, 0)
    assert found.kv_cache_usage_percent is None and found.cache_block_size is None
    # An engine that takes no adapters: no LoRA series, which the EPP takes without an error.
    assert found.active_models is None
    assert sorted(found.errors) == [
        "metric family 'vllm:cache_config_info' not found",
        "metric family 'vllm:kv_cache_usage_perc' not found",
    ]
    assert 'vllm:num_requests_waiting{model_name="tiny"} 0.0' in text


async def test_an_engine_that_takes_adapters_has_the_lora_series_before_any_is_served(
    make_client: MakeClient,
) -> None:
    client, _ = await make_client(settings={"lora_max_running": 3})
    await client.post("/v1/completions", json=_body("tiny"))  # the engine is introspected by now
    found = await _read(client)
    assert found.active_models == set() and found.waiting_models == set() and found.max_active_models == 3


async def test_triton_is_read_at_most_once_per_cache_period(
    make_client: MakeClient, triton_metrics: FakeTritonMetrics
) -> None:
    settings = {"triton_metrics_url": [triton_metrics.url], "triton_metrics_cache_s": 60}
    client, _ = await make_client(settings=settings)
    results = await asyncio.gather(*(client.get("/metrics") for _ in range(5)))
    assert all(r.status_code == 200 for r in results)
    assert triton_metrics.reads == 1


async def test_an_unreachable_triton_leaves_the_gateways_own_figures(make_client: MakeClient) -> None:
    settings = {"triton_metrics_url": ["http://127.0.0.1:9/metrics"], "triton_metrics_cache_s": 0.01}
    client, _ = await make_client(settings=settings)
    found = await _read(client)
    assert (found.waiting_queue_size, found.running_requests_size) == (0, 0)
    assert found.kv_cache_usage_percent is None


async def test_an_inference_objective_header_sets_the_priority_unless_the_body_does(
    make_client: MakeClient,
) -> None:
    settings = {"objective_priorities": "critical=10,batch=-5"}
    client, engine = await make_client(settings=settings)
    for headers, fields, expected in (
        ({"x-llm-d-inference-objective": "critical"}, {}, -10),
        ({"x-gateway-inference-objective": "batch"}, {}, 5),
        ({"x-llm-d-inference-objective": "unknown"}, {}, 0),
        ({"x-llm-d-inference-objective": "critical"}, {"priority": 3}, 3),
    ):
        r = await client.post("/v1/completions", json={**_body("tiny"), **fields}, headers=headers)
        assert r.status_code == 200, r.text
        assert engine.requests[-1].priority == expected, headers
