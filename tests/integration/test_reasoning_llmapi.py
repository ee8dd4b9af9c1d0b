"""A reasoning model over the CPU stand-in of TensorRT-LLM's llmapi model (the same parser,
`reasoning_parser=deepseek_r1`, on its text) through the `openai` SDK: nothing can steer the model
there, so each steering parameter is a 400 naming it, and the unsteered reply, which never closes
the think block, is all thinking, whole and streamed, on chat completions and Responses. (The
agent tiny model steered on the C++ path: test_reasoning_clients.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.integration.conftest import TritonStack, llmapi_model_spec
from tests.integration.test_reasoning_clients import SPLIT_SCHEMA, USER
from tests.support.gateway_process import GatewayProcess
from tests.support.openai_schema import validate, validated_responses_events
from tests.support.refusals import openai_refusal

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def llmapi_sdk(triton_stack: TritonStack) -> Iterator[openai.OpenAI]:
    spec = llmapi_model_spec(triton_stack, "tiny", reasoning_parser="deepseek_r1", default_max_tokens="48")
    args = ["--triton-url", triton_stack.grpc_url, "--log-level", "warning", "--model", spec]
    with (
        GatewayProcess(args) as gateway,
        openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0) as client,
    ):
        yield client


@pytest.mark.parametrize(
    ("field", "value"), [("response_format", SPLIT_SCHEMA), ("logit_bias", {"5": 100}), ("logprobs", True)]
)
def test_over_the_llmapi_model_what_steers_the_thinking_is_a_400_naming_it(
    llmapi_sdk: openai.OpenAI, field: str, value: object
) -> None:
    with openai_refusal(field):
        llmapi_sdk.chat.completions.create(model="tiny", messages=USER, max_tokens=48, **{field: value})  # type: ignore[call-overload]


def test_over_the_llmapi_model_the_thinking_is_parsed_from_its_text(llmapi_sdk: openai.OpenAI) -> None:
    fields: dict[str, Any] = {"model": "tiny", "messages": USER, "temperature": 0, "max_tokens": 48}
    whole = llmapi_sdk.chat.completions.create(**fields)
    validate("CreateChatCompletionResponse", whole.model_dump(mode="json", exclude_unset=True))
    message = whole.model_dump()["choices"][0]["message"]
    # The random model never writes `</think>`: all of its reply is thinking, and all counted so.
    thought = message["reasoning_content"]
    assert thought and not message["content"], message
    usage = whole.model_dump()["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == usage["completion_tokens"] == 48

    pieces: list[str] = []
    request = {**fields, "stream": True, "stream_options": {"include_usage": True}}
    for chunk in llmapi_sdk.chat.completions.create(**request):
        validate("CreateChatCompletionStreamResponse", chunk.model_dump(mode="json", exclude_unset=True))
        if chunk.usage is not None:
            final_usage = chunk.model_dump()["usage"]
        for choice in chunk.model_dump()["choices"]:
            assert not choice["delta"].get("content"), choice
            pieces.append(choice["delta"].get("reasoning_content") or "")
    assert "".join(pieces) == thought
    assert final_usage["completion_tokens_details"] == usage["completion_tokens_details"]

    body: dict[str, Any] = {"model": "tiny", "input": USER[0]["content"], "temperature": 0}
    response = llmapi_sdk.responses.create(**body, max_output_tokens=48)
    (item,) = [i for i in response.output if i.type == "reasoning"]
    assert "".join(part.text for part in item.content or []) == thought
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens == 48
    deltas: list[str] = []
    with llmapi_sdk.responses.stream(**body, max_output_tokens=48) as stream:
        for event in validated_responses_events(stream):
            if event.type == "response.reasoning_text.delta":
                deltas.append(event.delta)
    assert len(deltas) > 1 and "".join(deltas) == thought
