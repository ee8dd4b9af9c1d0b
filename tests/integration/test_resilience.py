"""Faults against the real stack: Triton killed and restarted, clients vanishing, a dead endpoint."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.devstack import TritonServer
from deploy.model_repo import render_repository
from tests.integration.conftest import TritonStack
from tests.support import http_client
from tests.support.gateway_process import GatewayProcess
from tests.support.waiting import wait_until

# How long state may take to settle after the clients go (returns as soon as it has): generous, so
# that a loaded machine slows the test without failing it.
SETTLE_S = 60.0

pytestmark = pytest.mark.integration

PREFIX = "bpe_synthetic_"  # the session stack's synthetic repository; extra servers reuse its names


def synthetic_repository(root: Path, tokenizer_dir: Path) -> Path:
    variables = {
        "tokenizer_dir": tokenizer_dir,
        "engine_mode": "synthetic",
        "synthetic_step_ms": 20,
        "name_prefix": PREFIX,
    }
    return render_repository(root, backend="cpu", variant="current", variables=variables)


def gateway_args(*tritons: TritonServer | TritonStack | tuple[str, str], tokenizer_dir: Path) -> list[str]:
    """Each Triton by its gRPC and HTTP endpoints: generation streams over HTTP, as `make bench`
    and `gateway dev` set it up (the gRPC-only transport is what the other integration tests use)."""
    args = [
        "--log-level",
        "warning",
        "--model",
        f"name=syn,tokenizer={tokenizer_dir},triton_model={PREFIX}ensemble,route=ensemble",
    ]
    for triton in tritons:
        grpc_url, http_url = triton if isinstance(triton, tuple) else (triton.grpc_url, triton.http_url)
        args += ["--triton-url", grpc_url]
        if http_url:  # "": gRPC only
            args += ["--triton-http-url", http_url]
    return args


async def read_stream(
    client: httpx.AsyncClient, url: str, body: dict, started: asyncio.Event | None
) -> list[str]:
    events: list[str] = []
    async with client.stream("POST", url, json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
                if started is not None and len(events) >= 2:
                    started.set()
    return events


# 480 steps of 20 ms: streams stay open for ~10 s, far longer than any test needs them.
STREAM = {"model": "syn", "prompt": "go", "max_tokens": 480, "stream": True, "ignore_eos": True}


@pytest.fixture
def private_triton(tmp_path: Path, triton_stack: TritonStack) -> Iterator[tuple[TritonServer, Path]]:
    tokenizer_dir = triton_stack.models["bpe_synthetic"].tokenizer_dir
    repo = synthetic_repository(tmp_path / "repo", tokenizer_dir)
    server = TritonServer([repo], work_dir=tmp_path / "server")
    server.start()
    try:
        server.wait_ready(300)
        yield server, repo
    finally:
        server.stop()


async def test_killing_triton_ends_every_open_stream_with_an_error_and_the_gateway_recovers(
    private_triton: tuple[TritonServer, Path], triton_stack: TritonStack, tmp_path: Path
) -> None:
    server, repo = private_triton
    tokenizer_dir = triton_stack.models["bpe_synthetic"].tokenizer_dir
    ports = (server.grpc_port, server.http_port, server.metrics_port)
    with GatewayProcess(gateway_args(server, tokenizer_dir=tokenizer_dir)) as gw:
        url = gw.base_url + "/v1/completions"
        async with httpx.AsyncClient(timeout=60) as client:
            started = [asyncio.Event() for _ in range(20)]
            tasks = [asyncio.create_task(read_stream(client, url, STREAM, ev)) for ev in started]
            await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in started)), 60)
            assert server.pid is not None
            os.killpg(server.pid, signal.SIGKILL)  # no goodbye: the way a crash looks
            results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
            for events in results:
                assert events[-1] == "[DONE]"
                error = json.loads(events[-2])["error"]
                assert error["code"] in ("engine_unavailable", "engine_error")
            assert gw.alive()
            assert (await client.get(gw.base_url + "/health")).status_code == 200
            # Readiness answers are cached for a second; it turns 503 right after.
            for _ in range(50):
                r = await client.get(gw.base_url + "/health/ready")
                if r.status_code == 503:
                    break
                await asyncio.sleep(0.1)
            assert r.status_code == 503
            r = await client.post(url, json={**STREAM, "stream": False, "max_tokens": 3})
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"

            restarted = TritonServer(
                [repo],
                grpc_port=ports[0],
                http_port=ports[1],
                metrics_port=ports[2],
                work_dir=tmp_path / "again",
            )
            restarted.start()
            try:
                restarted.wait_ready(300)
                ok = False
                for _ in range(100):
                    r = await client.post(url, json={**STREAM, "stream": False, "max_tokens": 3})
                    if r.status_code == 200:
                        ok = True
                        break
                    await asyncio.sleep(0.2)
                assert ok, r.text
                assert r.json()["usage"]["completion_tokens"] == 3
                assert gw.alive()
            finally:
                restarted.stop()


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_two_hundred_dropped_streams_leave_nothing_running(
    triton_stack: TritonStack, transport: str
) -> None:
    model = triton_stack.models["bpe_synthetic"]
    labels = {"request_type": "active", "model": model.engine, "version": "1"}
    triton = triton_stack if transport == "http" else (triton_stack.grpc_url, "")
    args = gateway_args(triton, tokenizer_dir=model.tokenizer_dir)
    with GatewayProcess(args) as gw:
        url = gw.base_url + "/v1/completions"
        limits = httpx.Limits(max_connections=300)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            started = [asyncio.Event() for _ in range(200)]
            tasks = [asyncio.create_task(read_stream(client, url, STREAM, ev)) for ev in started]
            await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in started)), 120)
            # The engine publishes its gauges after the step that sent the first tokens.
            await wait_until(
                lambda: triton_stack.metric("nv_trt_llm_request_metrics", **labels) >= 150,
                timeout=SETTLE_S,
                interval=0.05,
            )
            for task in tasks:
                task.cancel()  # the client goes away mid-stream
            await asyncio.gather(*tasks, return_exceptions=True)
        # Waited on, not timed: on a loaded machine the engine's cancellations take their time.
        await wait_until(
            lambda: triton_stack.metric("nv_trt_llm_request_metrics", **labels) == 0,
            timeout=SETTLE_S,
            interval=0.05,
        )
        scraped: list[str] = []

        def settled() -> bool:
            # The scrape itself is the one request in flight.
            scraped[:] = [http_client.get(gw.base_url + "/metrics", timeout=10).text]
            return "gateway_requests_in_flight 1.0" in scraped[0]

        await wait_until(settled, timeout=SETTLE_S, interval=0.05)
        text = scraped[0]
        assert 'gateway_cancellations_total{reason="client_disconnect"} 200.0' in text


async def test_with_two_tritons_and_one_stopped_every_request_succeeds(
    private_triton: tuple[TritonServer, Path], triton_stack: TritonStack
) -> None:
    second, _ = private_triton
    tokenizer_dir = triton_stack.models["bpe_synthetic"].tokenizer_dir
    with GatewayProcess(gateway_args(second, triton_stack, tokenizer_dir=tokenizer_dir)) as gw:
        second.stop()
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"model": "syn", "prompt": "hi", "max_tokens": 4, "ignore_eos": True}
            results = await asyncio.gather(
                *(client.post(gw.base_url + "/v1/completions", json=body) for _ in range(30))
            )
            assert [r.status_code for r in results] == [200] * 30
            streams = await asyncio.gather(
                *(
                    read_stream(client, gw.base_url + "/v1/completions", {**body, "stream": True}, None)
                    for _ in range(10)
                )
            )
            assert all(s[-1] == "[DONE]" and "error" not in s[-2] for s in streams)
            metrics = (await client.get(gw.base_url + "/metrics")).text
        assert f'gateway_triton_endpoint_healthy{{endpoint="{second.grpc_url}"}} 0.0' in metrics


async def test_sigterm_lets_short_streams_finish_and_cancels_long_ones_after_the_grace(
    triton_stack: TritonStack,
) -> None:
    model = triton_stack.models["bpe_synthetic"]
    engine = {"model": model.engine, "version": "1"}

    def active() -> float:
        return triton_stack.metric("nv_trt_llm_request_metrics", request_type="active", **engine)

    def total(name: str) -> float:
        return triton_stack.metric(f"trtllm_cpu_engine_{name}_total", **engine)

    def counts() -> tuple[float, float]:
        ended = total("completed_requests") + total("cancelled_requests")
        return ended, total("generated_tokens")

    # The engine's own counts tell a request ended early from one that ran to its end, whatever the
    # machine's load: no timing bound decides it. An earlier test's request would blur them.
    await wait_until(lambda: active() == 0, timeout=60.0)
    ended, generated = counts()
    args = [
        *gateway_args(triton_stack, tokenizer_dir=model.tokenizer_dir),
        "--shutdown-grace-s",
        "2",
    ]
    gw = GatewayProcess(args).start()
    try:
        url = gw.base_url + "/v1/completions"
        async with httpx.AsyncClient(timeout=60) as client:
            short_started, long_started = asyncio.Event(), asyncio.Event()
            short = asyncio.create_task(read_stream(client, url, {**STREAM, "max_tokens": 60}, short_started))
            long = asyncio.create_task(read_stream(client, url, STREAM, long_started))
            await asyncio.wait_for(asyncio.gather(short_started.wait(), long_started.wait()), 30)
            gw.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            short_events = await asyncio.wait_for(short, 30)
            assert short_events[-1] == "[DONE]" and "error" not in short_events[-2]
            with pytest.raises(httpx.HTTPError):
                await asyncio.wait_for(long, 30)  # cut when the grace period ends
        # uvicorn re-raises the signal once it has shut down, so the exit status says SIGTERM.
        assert gw.process.wait(timeout=30) in (0, -signal.SIGTERM)  # type: ignore[union-attr]
        # Both requests ended in the engine: the short one with its 60 tokens, the long one (480
        # steps of 20 ms, about 2 s of them done when the grace ends) stopped there (the gateway
        # stops or cancels it), not left to run to its end.
        await wait_until(lambda: active() == 0, timeout=60.0)
        ended_after, generated_after = counts()
        assert ended_after - ended == 2
        assert 60 < generated_after - generated < 60 + 480
    finally:
        gw.stop()


async def test_several_workers_share_the_port_and_one_metrics_view(triton_stack: TritonStack) -> None:
    model = triton_stack.models["bpe_synthetic"]
    args = [*gateway_args(triton_stack, tokenizer_dir=model.tokenizer_dir), "--workers", "2"]
    with GatewayProcess(args) as gw:
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"model": "syn", "prompt": "hi", "max_tokens": 3, "ignore_eos": True}
            results = await asyncio.gather(
                *(client.post(gw.base_url + "/v1/completions", json=body) for _ in range(20))
            )
            assert [r.status_code for r in results] == [200] * 20
            text = (await client.get(gw.base_url + "/metrics")).text
    total = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("gateway_requests_total{") and 'route="/v1/completions"' in line
    )
    assert total == 20  # counted across both workers, whichever answered the scrape


async def test_with_triton_down_at_start_up_the_gateway_starts_and_answers_503(tmp_path: Path) -> None:
    from deploy.tiny_model import build_tiny_model
    from tests.support.gateway_process import free_port

    port = free_port()  # nothing listens there
    dead = (f"127.0.0.1:{port}", f"http://127.0.0.1:{port}")
    gw = GatewayProcess(gateway_args(dead, tokenizer_dir=build_tiny_model("bpe"))).start(wait="/health")
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            assert (await client.get(gw.base_url + "/health")).status_code == 200
            ready = await client.get(gw.base_url + "/health/ready")
            assert ready.status_code == 503 and ready.json()["models"] == {"syn": False}
            body = {"model": "syn", "prompt": "x", "max_tokens": 2}
            r = await client.post(gw.base_url + "/v1/completions", json=body)
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
            r = await client.post(gw.base_url + "/v1/completions", json={**STREAM, "max_tokens": 2})
            assert r.status_code == 503  # refused before the stream starts
        assert gw.alive()
    finally:
        gw.stop()
