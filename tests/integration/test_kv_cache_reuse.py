"""KV cache reuse on the real CPU Triton: the engine's reuse figures reach the cached tokens of every
API's usage (chat and completions, the Responses API through the openai SDK, the Messages API through
the anthropic SDK)."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from deploy.devstack import DEV_TOKENS_PER_BLOCK
from tests.integration.conftest import TritonStack
from tests.support import http_client
from tests.support.gateway_process import GatewayProcess

pytestmark = pytest.mark.integration

# A chat prompt's first KV block (DEV_TOKENS_PER_BLOCK tokens) holds the template's prefix and the
# first two characters of the content (this tiny tokenizer spells letters one token each), and the
# engine is shared by the whole session: content starting with a uuid's hex would share that block
# with another request's one time in 256. Each prompt here starts with its own pair of uppercase
# letters (no hex digit, seldom how text starts), so its first block is its own.
_PAIRS = ("".join(pair) for pair in itertools.product("QRSTUVWXYZ", repeat=2))


def fresh(words: str) -> str:
    """Content no earlier request of the session began with."""
    return f"{next(_PAIRS)}{uuid.uuid4().hex} {words}"


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
    r = http_client.post(f"{gateway.base_url}/v1/chat/completions", json=body, timeout=60)
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
    content = fresh("tell me about the sea and the mountains and the rivers")
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
    content = fresh("the same words twice over and over again for the cache")
    _chat(gateway, "tiny-legacy", content)
    usage = _chat(gateway, "tiny-legacy", content)
    assert "prompt_tokens_details" not in usage


# ignore_eos: a sequence that ends at once sends no token, and so no perf metrics.
RESPONSE_ARGS: dict = {
    "max_output_tokens": 16,
    "temperature": 0,
    "store": False,
    "extra_body": {"ignore_eos": True},
}
MESSAGE_ARGS: dict = {"max_tokens": 4, "extra_body": {"ignore_eos": True, "temperature": 0}}


@pytest.fixture(scope="module")
def openai_sdk(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0) as sdk:
        yield sdk


@pytest.fixture(scope="module")
def anthropic_sdk(gateway: GatewayProcess) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gateway.base_url, api_key="unused", max_retries=0) as sdk:
        yield sdk


@pytest.mark.parametrize("model", ["tiny", "tiny-engine"])
def test_a_repeated_responses_prompt_reports_its_cached_tokens_through_the_openai_sdk(
    openai_sdk: openai.OpenAI, model: str
) -> None:
    content = fresh("tell me about the lakes and the forests and the valleys")
    first = openai_sdk.responses.create(model=model, input=content, **RESPONSE_ARGS)
    assert first.usage is not None
    assert first.usage.input_tokens > 2 * DEV_TOKENS_PER_BLOCK
    assert first.usage.input_tokens_details.cached_tokens == 0
    # Cut by max_output_tokens, the stream ends with response.incomplete (the SDK's stream helper
    # wants response.completed): its last event carries the whole response.
    events = list(openai_sdk.responses.create(model=model, input=content, stream=True, **RESPONSE_ARGS))
    assert events[-1].type in ("response.completed", "response.incomplete")
    second = events[-1].response
    assert second.usage is not None
    assert second.usage.input_tokens == first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens == _whole_blocks(first.usage.input_tokens)
    third = openai_sdk.responses.create(model=model, input=content, **RESPONSE_ARGS)
    assert third.usage is not None
    assert third.usage.input_tokens_details.cached_tokens == _whole_blocks(first.usage.input_tokens)


@pytest.mark.parametrize("model", ["tiny", "tiny-engine"])
def test_a_repeated_messages_prompt_reports_its_cache_reads_through_the_anthropic_sdk(
    anthropic_sdk: anthropic.Anthropic, model: str
) -> None:
    messages: list = [{"role": "user", "content": fresh("the hills and the roads and the towns")}]
    prompt = anthropic_sdk.messages.count_tokens(model=model, messages=messages).input_tokens
    assert prompt > 2 * DEV_TOKENS_PER_BLOCK
    first = anthropic_sdk.messages.create(model=model, messages=messages, **MESSAGE_ARGS)
    assert (first.usage.input_tokens, first.usage.cache_read_input_tokens) == (prompt, 0)
    assert first.usage.cache_creation_input_tokens == 0
    reused = _whole_blocks(prompt)
    # Anthropic counts the cache reads apart: input_tokens is what the engine computed.
    with anthropic_sdk.messages.stream(model=model, messages=messages, **MESSAGE_ARGS) as stream:
        start = next(e for e in stream if e.type == "message_start")
        assert (start.message.usage.input_tokens, start.message.usage.cache_read_input_tokens) == (
            prompt - reused,
            reused,
        )
        second = stream.get_final_message()
    assert (second.usage.input_tokens, second.usage.cache_read_input_tokens) == (prompt - reused, reused)
    third = anthropic_sdk.messages.create(model=model, messages=messages, **MESSAGE_ARGS)
    assert (third.usage.input_tokens, third.usage.cache_read_input_tokens) == (prompt - reused, reused)


def test_a_contract_without_perf_metrics_gives_zero_in_responses_and_null_in_messages(
    openai_sdk: openai.OpenAI, anthropic_sdk: anthropic.Anthropic
) -> None:
    content = fresh("the same words again and again for the cache to keep")
    for _ in range(2):
        response = openai_sdk.responses.create(model="tiny-legacy", input=content, **RESPONSE_ARGS)
        # OpenAI's schema requires the field: 0, the engine saying nothing of its reuse.
        assert response.usage is not None and response.usage.input_tokens_details.cached_tokens == 0
        message = anthropic_sdk.messages.create(
            model="tiny-legacy", messages=[{"role": "user", "content": content}], **MESSAGE_ARGS
        )
        assert message.usage.cache_read_input_tokens is None
        assert message.usage.cache_creation_input_tokens is None
    assert (
        message.usage.input_tokens
        == anthropic_sdk.messages.count_tokens(
            model="tiny-legacy", messages=[{"role": "user", "content": content}]
        ).input_tokens
    )
