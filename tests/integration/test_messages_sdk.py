"""The Messages API against the real CPU Triton, with the official `anthropic` SDK: create, stream
helpers, count_tokens, tool use with a tool_result round trip, and the SDK's own exceptions; on the
C++ repository's routes and on the CPU stand-in of TensorRT-LLM's llmapi model (where a forced tool
choice, which needs guided decoding, is a 400 naming it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests.integration.conftest import TritonStack, llmapi_model_spec
from tests.support import http_client
from tests.support.anthropic_errors import assert_error
from tests.support.gateway_process import GatewayProcess
from tests.support.refusals import anthropic_refusal

pytestmark = pytest.mark.integration

KEY = "sk-messages-test"
WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
        "required": ["city"],
    },
}
USER: list[Any] = [{"role": "user", "content": "Say something about the weather."}]
GREEDY = {"temperature": 0}
# The same tiny model as `tiny`, behind the llmapi model's contract.
LLMAPI = "tiny-llmapi"


def prompt_tokens(usage: anthropic.types.Usage) -> int:
    """The whole prompt: Anthropic counts tokens read from a cache (the engine's KV cache reuse,
    on in this stack) apart from input_tokens."""
    return (
        usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    )


@pytest.fixture(scope="module")
def gateway(triton_stack: TritonStack) -> Iterator[GatewayProcess]:
    m = triton_stack.models["bpe_current"]
    slow = triton_stack.models["bpe_synthetic"]
    specs = [
        f"name=tiny,tokenizer={m.tokenizer_dir},triton_model={m.ensemble},engine_model={m.engine},tool_parser=hermes",
        f"name=tiny-engine,tokenizer={m.tokenizer_dir},route=engine,engine_model={m.engine},tool_parser=hermes",
        f"name=tiny-slow,tokenizer={slow.tokenizer_dir},triton_model={slow.ensemble},engine_model={slow.engine}",
        llmapi_model_spec(triton_stack, LLMAPI, tool_parser="hermes"),
    ]
    # One generation at a time and no queue, so that the rate-limit test can fill the gateway.
    args = ["--triton-url", triton_stack.grpc_url, "--log-level", "warning", "--api-keys", KEY]
    args += ["--max-concurrent-requests", "1", "--max-queued-requests", "0"]
    for spec in specs:
        args += ["--model", spec]
    with GatewayProcess(args) as process:
        yield process


@pytest.fixture
def client(gateway: GatewayProcess) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gateway.base_url, api_key=KEY, max_retries=0) as sdk:
        yield sdk


@pytest.mark.parametrize("model", ["tiny", "tiny-engine", LLMAPI])
def test_create_answers_with_text_usage_and_a_stop_reason(client: anthropic.Anthropic, model: str) -> None:
    message = client.messages.create(
        model=model, max_tokens=24, system="You are terse.", messages=USER, extra_body=GREEDY
    )
    assert message.id.startswith("msg_") and message.model == model and message.role == "assistant"
    assert [b.type for b in message.content] == ["text"]
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= 24
    counted = client.messages.count_tokens(model=model, system="You are terse.", messages=USER)
    assert counted.input_tokens == prompt_tokens(message.usage)


def test_both_routes_and_the_llmapi_model_give_the_same_greedy_message(client: anthropic.Anthropic) -> None:
    texts = [
        client.messages.create(model=m, max_tokens=24, messages=USER, extra_body=GREEDY).content
        for m in ("tiny", "tiny-engine", LLMAPI)
    ]
    assert texts[0] == texts[1] == texts[2]


@pytest.mark.parametrize("model", ["tiny", LLMAPI])
def test_a_stop_sequence_cuts_the_text_and_is_named(client: anthropic.Anthropic, model: str) -> None:
    full = client.messages.create(model=model, max_tokens=40, messages=USER, extra_body=GREEDY)
    text = full.content[0].text  # type: ignore[union-attr]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), text
    cut = client.messages.create(
        model=model, max_tokens=40, messages=USER, stop_sequences=[stop], extra_body=GREEDY
    )
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[: text.index(stop)]  # type: ignore[union-attr]


@pytest.mark.parametrize("model", ["tiny", LLMAPI])
def test_the_stream_helpers_reach_the_same_message_as_create(client: anthropic.Anthropic, model: str) -> None:
    fields: dict[str, Any] = {"model": model, "max_tokens": 32, "messages": USER, "extra_body": GREEDY}
    whole = client.messages.create(**fields)
    with client.messages.stream(**fields) as stream:
        streamed_text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed_text == whole.content[0].text  # type: ignore[union-attr]
    assert final.model_dump(exclude={"id"}) == whole.model_dump(exclude={"id"})


@pytest.mark.parametrize("model", ["tiny", LLMAPI])
def test_tool_use_streams_the_same_input_and_a_tool_result_round_trip_completes(
    client: anthropic.Anthropic, model: str
) -> None:
    question: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    fields: dict[str, Any] = {
        "model": model,
        "max_tokens": 60,
        "messages": question,
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "extra_body": GREEDY,
    }
    if model == LLMAPI:
        # Only guided decoding makes a reply a call, and the llmapi model has none: the round trip
        # goes on from a call written here.
        with anthropic_refusal("tool_choice"):
            client.messages.create(**fields)
        with anthropic_refusal("tool_choice"), client.messages.stream(**fields):
            pass
        content: Any = [
            {"type": "tool_use", "id": "toolu_weather", "name": "get_weather", "input": {"city": "Paris"}}
        ]
        call_id = "toolu_weather"
    else:
        whole = client.messages.create(**fields)
        assert whole.stop_reason == "tool_use"
        (call,) = [b for b in whole.content if b.type == "tool_use"]
        assert call.id.startswith("toolu_") and call.name == "get_weather"
        assert call.input in ({"city": "Paris"}, {"city": "Tokyo"})
        with client.messages.stream(**fields) as stream:
            final = stream.get_final_message()
        (streamed,) = [b for b in final.content if b.type == "tool_use"]
        assert (streamed.name, streamed.input) == (call.name, call.input)
        assert final.stop_reason == "tool_use"
        content, call_id = whole.content, call.id

    answer = client.messages.create(
        model=model,
        max_tokens=16,
        tools=[WEATHER],
        messages=[
            *question,
            {"role": "assistant", "content": content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "22 C and sunny"}],
            },
        ],
        extra_body=GREEDY,
    )
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    asked = client.messages.count_tokens(model=model, messages=question, tools=[WEATHER])
    assert prompt_tokens(answer.usage) > asked.input_tokens


@pytest.mark.parametrize("model", ["tiny", LLMAPI])
def test_errors_raise_the_sdks_own_exceptions(
    client: anthropic.Anthropic, gateway: GatewayProcess, model: str
) -> None:
    with pytest.raises(anthropic.NotFoundError) as not_found:
        client.messages.create(model="claude-unknown", max_tokens=8, messages=USER)
    assert not_found.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError, match="tool_use_id"):
        client.messages.create(
            model=model,
            max_tokens=8,
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "x"}],
                }
            ],
        )
    with pytest.raises(anthropic.BadRequestError, match="image"):
        client.messages.create(
            model=model,
            max_tokens=8,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                        }
                    ],
                }
            ],
        )
    wrong = anthropic.Anthropic(base_url=gateway.base_url, api_key="wrong", max_retries=0)
    with wrong, pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model=model, max_tokens=8, messages=USER)


def test_a_full_gateway_raises_rate_limit_error(client: anthropic.Anthropic) -> None:
    # The synthetic engine takes 20 ms a token: this stream holds the only slot for seconds.
    with client.messages.stream(
        model="tiny-slow", max_tokens=300, messages=USER, extra_body={"temperature": 0}
    ) as busy:
        next(iter(busy.text_stream))
        with pytest.raises(anthropic.RateLimitError) as limited:
            client.messages.create(model="tiny", max_tokens=8, messages=USER)
        assert int(limited.value.response.headers["retry-after"]) >= 1
        busy.close()


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"model": "tiny", "messages": USER}, "max_tokens: Field required"),
        (
            {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "clip"}]}]},
            "clip",
        ),
        ({"model": "tiny", "max_tokens": "eight", "messages": USER}, "max_tokens"),
        ({"model": "tiny", "max_tokens": 8, "messages": {"role": "user"}}, "messages"),
        ({"model": "tiny", "max_tokens": 8, "messages": USER, "system": 3}, "system"),
    ],
)
def test_bad_input_is_an_anthropic_400_never_a_500(
    gateway: GatewayProcess, payload: dict, message: str
) -> None:
    r = http_client.post(
        gateway.base_url + "/v1/messages", json=payload, headers={"x-api-key": KEY}, timeout=30
    )
    assert_error(r, 400, "invalid_request_error", message=message)
