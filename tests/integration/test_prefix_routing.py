"""`prefix` routing over two real CPU Tritons: a repeated prefix goes to the replica holding its KV
cache blocks, as the engines' own reuse figures show, even when that replica is the busier one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.devstack import DEV_TOKENS_PER_BLOCK, TritonServer
from deploy.model_repo import render_repository
from deploy.tiny_model import build_tiny_model
from tests.integration.conftest import STARTUP_TIMEOUT_S, SYNTHETIC_STEP_MS, TritonStack
from tests.support.gateway_process import GatewayProcess

pytestmark = pytest.mark.integration

KEY = "bpe_synthetic"


@pytest.fixture(scope="module")
def replica(triton_stack: TritonStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """A second Triton serving the session stack's synthetic repository under the same names."""
    root = tmp_path_factory.mktemp("replica")
    model = triton_stack.models[KEY]
    repo = render_repository(
        root / KEY,
        backend="cpu",
        variant=model.variant,
        variables={
            "tokenizer_dir": build_tiny_model(model.tokenizer_kind),
            "engine_mode": "synthetic",
            "synthetic_step_ms": SYNTHETIC_STEP_MS,
            "name_prefix": f"{KEY}_",
            "ensemble_output_ids": model.output_ids,
            "enable_kv_cache_reuse": True,
            "tokens_per_block": DEV_TOKENS_PER_BLOCK,
        },
    )
    server = TritonServer([Path(repo)], work_dir=root / "server")
    server.start()
    try:
        server.wait_ready(STARTUP_TIMEOUT_S)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def gateway(triton_stack: TritonStack, replica: TritonServer) -> Iterator[GatewayProcess]:
    model = triton_stack.models[KEY]
    spec = (
        f"name=tiny,tokenizer={model.tokenizer_dir},triton_model={model.ensemble},engine_model={model.engine}"
    )
    # The replica first: with nothing to go by (no match, equal load), a request goes to it.
    args = ["--triton-url", replica.grpc_url, "--triton-url", triton_stack.grpc_url, "--model", spec]
    args += ["--routing-policy", "prefix", "--log-level", "warning"]
    with GatewayProcess(args) as process:
        yield process


def _reused_blocks(server: TritonServer, engine: str) -> float:
    for line in server.metrics_text().splitlines():
        wanted = ("nv_trt_llm_kv_cache_block_metrics{", 'kv_cache_block_type="reused"', f'model="{engine}"')
        if line.startswith(wanted[0]) and all(part in line for part in wanted[1:]):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _chat(client: httpx.Client, content: str, **extra: object) -> dict:
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 2, **extra}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def test_a_repeated_prefix_goes_to_the_replica_that_holds_it_though_it_is_busier(
    gateway: GatewayProcess, replica: TritonServer, triton_stack: TritonStack
) -> None:
    engine = triton_stack.models[KEY].engine
    document = f"{uuid.uuid4().hex} " + "a long shared document about rivers and mountains " * 3
    with httpx.Client(base_url=gateway.base_url, timeout=60) as client:
        first = _chat(client, document)
        assert first["prompt_tokens_details"] == {"cached_tokens": 0}
        replica_reused = _reused_blocks(replica, engine)
        # Keep a request in flight on the replica (it shares the prefix, so it goes there too):
        # the other endpoint is now the less loaded one, where least_outstanding would send the next.
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": document + " and more"}],
            # 300 synthetic steps of 20 ms: in flight for the whole of the next request.
            "max_tokens": 300,
            "stream": True,
        }
        with client.stream("POST", "/v1/chat/completions", json=body) as busy:
            assert busy.status_code == 200
            # The role chunk comes before the engine request is sent; a token comes after.
            lines = (line for line in busy.iter_lines() if line.startswith("data: "))
            next(lines)
            next(lines)
            again = _chat(client, document)
        blocks = (first["prompt_tokens"] - 1) // DEV_TOKENS_PER_BLOCK
        assert blocks >= 3
        assert again["prompt_tokens_details"] == {"cached_tokens": blocks * DEV_TOKENS_PER_BLOCK}
    # The replica's engine did the reusing: all of the repeat's blocks, and the busy request's
    # (all but the last, where the chat template's end of turn follows different text).
    assert _reused_blocks(replica, engine) > replica_reused + blocks
