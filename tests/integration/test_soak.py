"""The soak (`make soak`): 1,000 concurrent streams through one gateway process on the synthetic
engine, zero errors and bounded memory. Marked `soak`: minutes, so not part of `make test`."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.devstack import TritonServer
from deploy.model_repo import render_repository
from deploy.tiny_model import build_tiny_model
from loadtest.soak import soak_open_streams
from tests.support.gateway_process import GatewayProcess

pytestmark = [pytest.mark.soak, pytest.mark.integration]

STREAMS = 1000
RSS_GROWTH_LIMIT_MB = 150


async def test_a_thousand_concurrent_streams_with_no_errors_and_bounded_memory(tmp_path: Path) -> None:
    tokenizer_dir = build_tiny_model("bpe")
    # Steps of 50 ms for 200 tokens: each stream lasts ~10 s, so all 1,000 are open together.
    variables = {
        "tokenizer_dir": tokenizer_dir,
        "engine_mode": "synthetic",
        "synthetic_step_ms": 50,
        "max_active_requests": 2048,
        "max_batch_size": 2048,
    }
    repo = render_repository(tmp_path / "repo", backend="cpu", variant="current", variables=variables)
    with TritonServer([repo], work_dir=tmp_path / "server") as server:
        server.wait_ready(300)
        args = [
            "--triton-url",
            server.grpc_url,
            "--log-level",
            "warning",
            "--model",
            f"name=syn,tokenizer={tokenizer_dir},triton_model=ensemble,route=ensemble",
        ]
        with GatewayProcess(args) as gw:
            result = await soak_open_streams(
                gw.base_url + "/v1", "syn", gw.pid, streams=STREAMS, max_tokens=200
            )
    print(
        f"\nsoak: {result.completed}/{result.streams} streams, errors {result.errors}, "
        f"max open {result.max_open}, "
        f"RSS {result.rss_before_mb:.0f} -> peak {result.rss_peak_mb:.0f} -> {result.rss_after_mb:.0f} MB "
        f"(growth {result.rss_growth_mb:.0f} MB), {result.output_tokens} tokens in {result.duration_s:.1f} s"
    )
    assert result.errors == {}
    assert result.completed == STREAMS
    assert result.max_open >= 0.9 * STREAMS
    assert result.rss_growth_mb < RSS_GROWTH_LIMIT_MB
