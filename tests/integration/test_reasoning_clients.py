"""A reasoning model against the real CPU Triton through the `openai` SDK: chat completions'
`reasoning_content` (whole and streamed, equal) and the Responses API's reasoning item with its
`reasoning_text` events and `reasoning_tokens`.

The agent tiny model is random, so every request steers it: greedy, guided by a JSON schema, and
(on chat) a logit bias that makes `</think>` the model's choice wherever the schema allows it.
The model is served with `reasoning_parser=deepseek_r1`: its reply starts inside the think block,
so what it writes before `</think>` is thinking and what follows is the answer.

Over the CPU stand-in of TensorRT-LLM's llmapi model: test_reasoning_llmapi.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.gateway_process import GatewayProcess, agent_gateway
from tests.support.openai_schema import validate, validated_responses_events
from tests.support.tokenizers import loaded_tokenizer

pytestmark = pytest.mark.integration

USER = [{"role": "user", "content": "What is the weather like?"}]
# The answer's one string holds exactly `</think>` (8 characters): the thinking is the JSON before it.
SPLIT_SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "weather",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"w": {"type": "string", "minLength": 8, "maxLength": 8}},
            "required": ["w"],
            "additionalProperties": False,
        },
    },
}
# A reply that never closes the block: all of it is thinking.
THINKING_SCHEMA = {
    "type": "object",
    "properties": {"w": {"type": "string", "enum": ["sunny", "rainy"]}},
    "required": ["w"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, Path]]:
    root = tmp_path_factory.mktemp("reasoning")
    options = "reasoning_parser=deepseek_r1,default_max_tokens=48"
    with agent_gateway(root, options, ["--state-dir", str(root / "state")]) as (process, repo):
        yield process, repo.model_dir


@pytest.fixture(scope="module")
def sdk(served: tuple[GatewayProcess, Path]) -> Iterator[openai.OpenAI]:
    gateway, _ = served
    with openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def steer(served: tuple[GatewayProcess, Path]) -> dict[str, int]:
    """A logit bias that makes the model open the string with the separator token ` "` (not a
    token that also holds the string's first characters) and then write `</think>` as one token:
    the schema allows each only at its own step, where the bias makes it the greedy choice."""
    tokenizer = loaded_tokenizer(served[1])
    (quote,) = tokenizer.encode(' "', add_special_tokens=False)
    return {str(quote): 100, str(tokenizer.vocab["</think>"]): 100}


def split_request(steer: dict[str, int]) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": USER,
        "temperature": 0,
        "max_tokens": 48,
        "response_format": SPLIT_SCHEMA,
        "logit_bias": steer,
        "logprobs": True,
    }


def test_chat_reasoning_content_whole_and_streamed_are_equal(
    sdk: openai.OpenAI, steer: dict[str, int]
) -> None:
    whole = sdk.chat.completions.create(**split_request(steer))
    validate("CreateChatCompletionResponse", whole.model_dump(mode="json", exclude_unset=True))
    message = whole.model_dump()["choices"][0]["message"]
    reasoning, content = message["reasoning_content"], message["content"]
    # The thinking is the JSON up to the string's opening quote, the answer its closing.
    assert (reasoning, content) == ('{"w": "', '"}'), message
    assert "</think>" not in reasoning + content
    # Counted: the tokens before `</think>` (each has its log probability; end tokens have none).
    tokens = [entry.token for entry in whole.choices[0].logprobs.content]  # type: ignore[union-attr]
    assert "</think>" in tokens
    usage = whole.model_dump()["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == tokens.index("</think>") > 0

    pieces: list[str] = []
    answer: list[str] = []
    final_usage = None
    request = {**split_request(steer), "stream": True, "stream_options": {"include_usage": True}}
    for chunk in sdk.chat.completions.create(**request):
        validate("CreateChatCompletionStreamResponse", chunk.model_dump(mode="json", exclude_unset=True))
        if chunk.usage is not None:
            final_usage = chunk.model_dump()["usage"]
        for choice in chunk.model_dump()["choices"]:
            delta = choice["delta"]
            if delta.get("reasoning_content"):
                pieces.append(delta["reasoning_content"])
            if delta.get("content"):
                answer.append(delta["content"])
    assert "".join(pieces) == reasoning and "".join(answer) == content
    # (The prompt's cached tokens differ: the second request reuses the first one's KV cache.)
    assert final_usage is not None
    for key in ("completion_tokens", "completion_tokens_details"):
        assert final_usage[key] == usage[key]


def test_responses_reasoning_item_streams_reasoning_text_and_counts_its_tokens(sdk: openai.OpenAI) -> None:
    text_format = {
        "format": {"type": "json_schema", "name": "weather", "schema": THINKING_SCHEMA, "strict": True}
    }
    body: dict[str, Any] = {
        "model": "tiny",
        "input": USER[0]["content"],
        "temperature": 0,
        "text": text_format,
    }
    whole = sdk.responses.create(**body, max_output_tokens=48)
    validate(
        "Response", whole.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude={"output_text"})
    )
    (item,) = [i for i in whole.output if i.type == "reasoning"]
    thought = "".join(part.text for part in item.content or [])
    assert thought.replace(" ", "").replace("\n", "") in ('{"w":"sunny"}', '{"w":"rainy"}'), thought
    assert whole.usage is not None
    reasoning_tokens = whole.usage.output_tokens_details.reasoning_tokens
    # The same greedy request on chat: one log probability per generated token but the end token,
    # and every one of them was thinking.
    chat = sdk.chat.completions.create(
        model="tiny",
        messages=USER,
        temperature=0,
        max_tokens=48,
        logprobs=True,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "weather", "schema": THINKING_SCHEMA},
        },
    )
    assert chat.choices[0].message.model_dump()["reasoning_content"] == thought
    assert reasoning_tokens == len(chat.choices[0].logprobs.content) > 0  # type: ignore[union-attr]

    deltas: list[str] = []
    kinds: list[str] = []
    with sdk.responses.stream(**body, max_output_tokens=48) as stream:
        for event in validated_responses_events(stream):
            kinds.append(event.type)
            if event.type == "response.reasoning_text.delta":
                deltas.append(event.delta)
            if event.type == "response.reasoning_text.done":
                assert event.text == thought
            if event.type == "response.completed":
                final = event.response
    assert len(deltas) > 1 and "".join(deltas) == thought
    assert kinds.index("response.output_item.added") < kinds.index("response.reasoning_text.delta")
    assert kinds[-1] == "response.completed"
    assert final.usage is not None and final.usage.output_tokens_details.reasoning_tokens == reasoning_tokens
