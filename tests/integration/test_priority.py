"""Priority on the real CPU Triton: the gateway's admission queue sheds and orders by priority, and
the priority reaches the engine, whose waiting requests start most urgent first."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.devstack import TritonServer, prepare_dev_repository
from tests.support import anthropic_errors, http_client
from tests.support.gateway_process import GatewayProcess

pytestmark = pytest.mark.integration

# One request at a time in the engine, so that the others wait in its queue; tokens at a fixed
# step, so that a long request holds the engine for a known while.
STEP_MS = 5
LONG_TOKENS = 300  # 1.5 s of the engine


class Stack:
    def __init__(self, server: TritonServer, model: str) -> None:
        self.server = server
        self.model = model

    def waiting(self) -> float:
        # The engine's own gauge, as the TensorRT-LLM backend names it.
        pattern = re.compile(
            r'^nv_trt_llm_request_metrics\{(?=[^}]*request_type="waiting")(?=[^}]*model="'
            + re.escape(self.model)
            + r'")[^}]*\}\s+(\S+)$',
            re.M,
        )
        match = pattern.search(self.server.metrics_text())
        return float(match.group(1)) if match else 0.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Path]]:
    root = tmp_path_factory.mktemp("priority")
    repo = prepare_dev_repository(
        root / "repo",
        engine_mode="synthetic",
        variables={"synthetic_step_ms": STEP_MS, "max_active_requests": 1, "name_prefix": "prio_"},
    )
    with TritonServer([repo.path], work_dir=root / "server") as server:
        yield Stack(server, "prio_tensorrt_llm"), repo.model_dir


def _gateway(stack: tuple[Stack, Path], *extra: str) -> GatewayProcess:
    triton, model_dir = stack
    spec = f"name=tiny,tokenizer={model_dir},triton_model=prio_ensemble,engine_model=prio_tensorrt_llm"
    args = ["--triton-url", triton.server.grpc_url, "--model", spec, "--log-level", "warning", *extra]
    return GatewayProcess(args)


def _chat(priority: int, tokens: int, *, stream: bool = False) -> dict:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": f"priority {priority}"}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "priority": priority,
    }
    return body | {"stream": True} if stream else body


async def _until(condition, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


async def _first_chunk(client: httpx.AsyncClient, url: str, body: dict, started: asyncio.Event) -> int:
    async with client.stream("POST", url, json=body) as r:
        async for _ in r.aiter_bytes():
            started.set()
        return r.status_code


async def test_waiting_requests_start_in_the_engine_most_urgent_first(stack: tuple[Stack, Path]) -> None:
    triton, _ = stack
    with _gateway(stack) as gateway:
        url = f"{gateway.base_url}/v1/chat/completions"
        async with httpx.AsyncClient(timeout=60) as client:
            started = asyncio.Event()
            occupant = asyncio.create_task(
                _first_chunk(client, url, _chat(10, LONG_TOKENS, stream=True), started)
            )
            await asyncio.wait_for(started.wait(), 20)
            done: list[str] = []

            async def run(name: str, priority: int) -> None:
                r = await client.post(url, json=_chat(priority, 4))
                assert r.status_code == 200, r.text
                done.append(name)

            low = asyncio.create_task(run("low", 10))
            await _until(lambda: triton.waiting() >= 1)
            high = asyncio.create_task(run("high", -10))
            await _until(lambda: triton.waiting() >= 2)
            assert not occupant.done(), "the occupant must still hold the engine"
            await asyncio.gather(low, high)
            assert await occupant == 200
    # Arrived second, started first: the gateway sent each request's priority and the engine
    # ordered its queue by it.
    assert done == ["high", "low"]


async def test_a_full_gateway_queue_sheds_the_least_urgent_with_429_in_each_apis_shape(
    stack: tuple[Stack, Path],
) -> None:
    tight = ("--max-concurrent-requests", "1", "--max-queued-requests", "1", "--queue-timeout-s", "30")
    with _gateway(stack, *tight) as gateway:
        url = f"{gateway.base_url}/v1/chat/completions"

        def queued() -> bool:
            return "gateway_requests_queued 1.0" in http_client.get(f"{gateway.base_url}/metrics").text

        async with httpx.AsyncClient(timeout=60) as client:
            started = asyncio.Event()
            occupant = asyncio.create_task(
                _first_chunk(client, url, _chat(0, LONG_TOKENS, stream=True), started)
            )
            await asyncio.wait_for(started.wait(), 20)
            low = asyncio.create_task(client.post(url, json=_chat(5, 4)))
            await _until(queued)
            high = asyncio.create_task(client.post(url, json=_chat(-5, 4)))
            shed = await low
            assert shed.status_code == 429, shed.text
            assert shed.json()["error"]["type"] == "rate_limit_error"
            assert int(shed.headers["retry-after"]) >= 1
            # The queue now holds the urgent request: an equal or less urgent newcomer is refused,
            # on /v1/messages in Anthropic's shape.
            message = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
            refused = await client.post(f"{gateway.base_url}/v1/messages", json=message)
            anthropic_errors.assert_error(refused, 429, "rate_limit_error")
            assert "retry-after" in refused.headers
            assert not high.done()
            assert await occupant == 200
            assert (await high).status_code == 200
            metrics = (await client.get(f"{gateway.base_url}/metrics")).text
    assert 'gateway_shed_requests_total{priority="5",reason="displaced"} 1.0' in metrics
    assert 'gateway_shed_requests_total{priority="0",reason="queue_full"} 1.0' in metrics
    assert 'gateway_admitted_requests_total{priority="-5"} 1.0' in metrics
