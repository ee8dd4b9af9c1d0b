"""KV cache reuse on the real CPU Triton: the engine's reuse figures reach usage.cached_tokens."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from deploy.devstack import DEV_TOKENS_PER_BLOCK
from tests.integration.conftest import TritonStack
from tests.support.gateway_process import GatewayProcess

pytestmark = pytest.mark.integration

# served name -> (stack key, route)
SERVED = {
    "tiny": ("bpe_current", "ensemble"),
    "tiny-engine": ("bpe_current", "engine"),
    "tiny-legacy": ("bpe_legacy", "ensemble"),
}


@pytest.fixture(scope="module")
def gateway(triton_stack: TritonStack) -> Iterator[GatewayProcess]:
    args = ["--triton-url", triton_stack.grpc_url, "--log-level", "warning"]
    for name, (key, route) in SERVED.items():
        m = triton_stack.models[key]
        spec = f"name={name},tokenizer={m.tokenizer_dir},route={route}"
        spec += f",triton_model={m.ensemble},engine_model={m.engine}"
        args += ["--model", spec]
    with GatewayProcess(args) as process:
        yield process


def _chat(gateway: GatewayProcess, model: str, content: str, *, stream: bool = False) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        "temperature": 0,
        # A sequence that ends at once sends no token, and so no perf metrics: make it generate.
        "ignore_eos": True,
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    r = httpx.post(f"{gateway.base_url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()["usage"]
    events = [e.removeprefix("data: ") for e in r.text.split("\n\n") if e]
    return httpx.Response(200, content=events[-2]).json()["usage"]


def _whole_blocks(prompt_tokens: int) -> int:
    # The last prompt token is always computed; only whole blocks before it are reused.
    return (prompt_tokens - 1) // DEV_TOKENS_PER_BLOCK * DEV_TOKENS_PER_BLOCK


@pytest.mark.parametrize("model", ["tiny", "tiny-engine"])
def test_a_repeated_prompt_reports_its_reused_whole_blocks_as_cached_tokens(
    gateway: GatewayProcess, triton_stack: TritonStack, model: str
) -> None:
    # A prompt no other test sends, long enough for several blocks.
    content = f"{uuid.uuid4().hex} tell me about the sea and the mountains and the rivers"
    first = _chat(gateway, model, content)
    assert first["prompt_tokens"] > 2 * DEV_TOKENS_PER_BLOCK
    assert first.get("prompt_tokens_details") == {"cached_tokens": 0}, first
    second = _chat(gateway, model, content, stream=True)
    assert second["prompt_tokens"] == first["prompt_tokens"]
    assert second["prompt_tokens_details"] == {"cached_tokens": _whole_blocks(first["prompt_tokens"])}
    engine = triton_stack.models["bpe_current"].engine
    assert triton_stack.metric(
        "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="tokens_per", model=engine
    ) == float(DEV_TOKENS_PER_BLOCK)
    assert (
        triton_stack.metric("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="reused", model=engine)
        > 0
    )


def test_a_contract_without_perf_metrics_leaves_cached_tokens_out(gateway: GatewayProcess) -> None:
    content = f"{uuid.uuid4().hex} the same words twice over and over again for the cache"
    _chat(gateway, "tiny-legacy", content)
    usage = _chat(gateway, "tiny-legacy", content)
    assert "prompt_tokens_details" not in usage
