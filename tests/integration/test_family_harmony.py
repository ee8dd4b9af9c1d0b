"""gpt-oss's harmony format from the family's tiny model on the real CPU Triton, through the
official clients: thinking on the analysis channel, a call on the commentary channel addressed to
`functions.get_weather`, whole and streamed, and the conversation back through the family's
template.

The model is random, so each request steers it (greedy) into a real harmony reply: a regex guide
spells the reply, markers included, and a logit bias on the markers makes each one the family's own
single token. The CPU engine allows a special token where the guide names it, as TensorRT-LLM's
xgrammar allows any token whose text the guide spells (see the engine's GuidedDecoding).
The Messages API takes the regex guide (vLLM's `structured_outputs`, as on chat completions) but
no logit bias, so there the model may spell a marker in pieces; the harmony parser reads the text
as openai-harmony encodes it, so the reply reads the same."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.integration.conftest import TritonStack, family_model_spec
from tests.integration.test_family_tool_calls import (
    MESSAGES_TOOLS,
    PARIS,
    RESPONSES_TOOLS,
    TOOLS,
    USER,
    marker_bias,
    regex_literal,
    streamed_chat,
)
from tests.support import http_client
from tests.support.gateway_process import GatewayProcess

pytestmark = pytest.mark.integration

THOUGHT = "The user wants the forecast."
# A reply as gpt-oss writes one after the template's `<|start|>assistant`.
CALL_REPLY = (
    f"<|channel|>analysis<|message|>{THOUGHT}<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris", "days": 3}<|call|>'
)
ANSWER = "Sunny in Paris for three days."
FINAL_REPLY = (
    "<|channel|>analysis<|message|>The tool answered.<|end|>"
    f"<|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>"
)
MARKERS = ("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|constrain|>", "<|call|>")
# Every harmony marker: none may reach a client's text.
LEAKS = (*MARKERS, "<|return|>", "to=functions", "commentary", "analysis")


@pytest.fixture(scope="module")
def gateway(triton_stack: TritonStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    spec = family_model_spec(
        triton_stack, "gptoss", name="gptoss", tool_parser="openai", reasoning_parser="gpt_oss"
    )
    args = ["--triton-url", triton_stack.grpc_url, "--log-level", "warning", "--model", spec]
    args += ["--state-dir", str(tmp_path_factory.mktemp("family_harmony_state"))]
    with GatewayProcess(args) as process:
        yield process


@pytest.fixture(scope="module")
def sdk(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def claude(gateway: GatewayProcess) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gateway.base_url, api_key="unused", max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def bias(triton_stack: TritonStack) -> dict[str, int]:
    return marker_bias(triton_stack, "gptoss", (*MARKERS, "<|return|>"))


def assert_clean(*texts: str | None) -> None:
    for text in texts:
        for marker in LEAKS:
            assert marker not in (text or ""), (marker, text)


def steered(text: str, **extra: Any) -> dict[str, Any]:
    return {"structured_outputs": {"regex": regex_literal(text)}, **extra}


def test_a_harmony_call_after_thinking_through_chat_completions(
    sdk: openai.OpenAI, bias: dict[str, int]
) -> None:
    request: dict[str, Any] = {
        "model": "gptoss",
        "messages": USER,
        "tools": TOOLS,
        "temperature": 0,
        "max_tokens": 120,
        "logit_bias": bias,
        "extra_body": steered(CALL_REPLY),
    }
    whole = sdk.chat.completions.create(logprobs=True, **request)
    choice = whole.choices[0]
    message = choice.message
    # The model wrote each marker as its own token (`<|call|>` ends generation: not part of the reply).
    assert choice.logprobs is not None and choice.logprobs.content is not None
    tokens = [entry.token for entry in choice.logprobs.content]
    for marker in MARKERS[:-1]:
        assert marker in tokens, (marker, tokens)
    assert choice.finish_reason == "tool_calls", message
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or ()] == [
        ("get_weather", PARIS)
    ]
    reasoning = (message.model_extra or {}).get("reasoning_content")
    assert (message.content, reasoning) == (None, THOUGHT)
    assert_clean(message.content, reasoning)
    # The thinking's tokens as the model wrote them (the guide lets it spell words in pieces).
    assert whole.usage is not None and whole.usage.completion_tokens_details is not None
    thinking = tokens[tokens.index("<|message|>") + 1 : tokens.index("<|end|>")]
    assert "".join(thinking) == THOUGHT
    assert whole.usage.completion_tokens_details.reasoning_tokens == len(thinking)

    content, streamed_reasoning, calls, finish = streamed_chat(sdk, **request)
    assert (content, streamed_reasoning, finish) == ("", THOUGHT, "tool_calls")
    assert list(calls) == [0]
    name, pieces = calls[0]
    assert name == "get_weather"
    # The arguments stream as the model writes them.
    assert len(pieces) > 1
    assert "".join(pieces) == message.tool_calls[0].function.arguments  # type: ignore[index]


def test_a_harmony_call_after_thinking_through_the_messages_api(claude: anthropic.Anthropic) -> None:
    request: dict[str, Any] = {
        "model": "gptoss",
        "max_tokens": 120,
        "messages": USER,
        "tools": MESSAGES_TOOLS,
        "extra_body": steered(CALL_REPLY, temperature=0),
    }
    message = claude.messages.create(**request)
    assert message.stop_reason == "tool_use", message
    assert [(b.name, b.input) for b in message.content if b.type == "tool_use"] == [("get_weather", PARIS)]
    assert [b.thinking for b in message.content if b.type == "thinking"] == [THOUGHT]
    assert not [b for b in message.content if b.type == "text"]
    assert [b.type for b in message.content] == ["thinking", "tool_use"]

    with claude.messages.stream(**request) as stream:
        deltas = [e.delta for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    partial = [d.partial_json for d in deltas if d.type == "input_json_delta"]
    # The arguments stream as the model writes them.
    assert json.loads("".join(partial)) == PARIS and len(partial) > 1
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == THOUGHT
    assert not [d for d in deltas if d.type == "text_delta"]
    assert final.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "input", None)) for b in final.content] == [
        (b.type, getattr(b, "input", None)) for b in message.content
    ]


def test_a_harmony_call_after_thinking_through_the_responses_api(
    sdk: openai.OpenAI, bias: dict[str, int]
) -> None:
    request: dict[str, Any] = {
        "model": "gptoss",
        "input": USER,
        "tools": RESPONSES_TOOLS,
        "temperature": 0,
        "max_output_tokens": 120,
        "extra_body": steered(CALL_REPLY, logit_bias=bias),
    }
    response = sdk.responses.create(**request)
    calls = [i for i in response.output if i.type == "function_call"]
    assert [(i.name, json.loads(i.arguments)) for i in calls] == [("get_weather", PARIS)]
    thought = "".join(
        c.text
        for i in response.output
        if i.type == "reasoning"
        for c in (i.content or ())
        if c.type == "reasoning_text"
    )
    assert thought == THOUGHT
    assert not [i for i in response.output if i.type == "message"]
    assert_clean(thought)

    deltas: list[str] = []
    with sdk.responses.stream(**request) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                deltas.append(event.delta)
            if event.type == "response.output_text.delta":
                assert_clean(event.delta)
        final = stream.get_final_response()
    streamed_calls = [i for i in final.output if i.type == "function_call"]
    assert [(i.name, i.arguments) for i in streamed_calls] == [(i.name, i.arguments) for i in calls]
    assert len(deltas) > 1 and "".join(deltas) == calls[0].arguments


def _history(arguments: str) -> list[dict[str, Any]]:
    """The conversation after the call: the call (its thinking with it) and the tool's result."""
    return [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": THOUGHT,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                }
            ],
        },
        # (No name: the template finds the function by the call's id.)
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "sunny"}'},
    ]


def test_the_call_and_its_result_go_back_through_the_template(
    sdk: openai.OpenAI, gateway: GatewayProcess, triton_stack: TritonStack, bias: dict[str, int]
) -> None:
    from transformers import AutoTokenizer

    history = _history(json.dumps(PARIS))
    reference = AutoTokenizer.from_pretrained(triton_stack.models["family_gptoss"].tokenizer_dir)
    # As transformers (and vLLM) hand a call to a template: its arguments as an object.
    expected = reference.apply_chat_template(
        _history_as_objects(), tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    expected_ids = reference.encode(expected, add_special_tokens=False)
    # The template wrote the call in harmony and the arguments once, as JSON (never a string of JSON).
    assert (
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Paris", "days": 3}<|call|>'
    ) in expected
    assert (
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{"sky": "sunny"}'
        in expected
    )
    assert expected.endswith("<|start|>assistant")

    tokenized = http_client.post(
        gateway.base_url + "/tokenize", json={"model": "gptoss", "messages": history, "tools": TOOLS}
    )
    assert tokenized.status_code == 200, tokenized.text
    assert tokenized.json()["tokens"] == expected_ids

    request: dict[str, Any] = {
        "model": "gptoss",
        "messages": history,
        "tools": TOOLS,
        "temperature": 0,
        "max_tokens": 60,
        "logit_bias": bias,
        "extra_body": steered(FINAL_REPLY),
    }
    whole = sdk.chat.completions.create(**request)
    assert whole.usage is not None and whole.usage.prompt_tokens == len(expected_ids)
    message = whole.choices[0].message
    assert (message.content, (message.model_extra or {}).get("reasoning_content")) == (
        ANSWER,
        "The tool answered.",
    )
    assert not message.tool_calls and whole.choices[0].finish_reason == "stop"
    content, reasoning, calls, finish = streamed_chat(sdk, **request)
    assert (content, reasoning, calls, finish) == (ANSWER, "The tool answered.", {}, "stop")


def _history_as_objects() -> list[dict[str, Any]]:
    history = _history("")
    history[1]["tool_calls"][0]["function"]["arguments"] = dict(PARIS)
    return history


def test_the_messages_api_sends_the_call_and_its_result_back_through_the_template(
    claude: anthropic.Anthropic, sdk: openai.OpenAI
) -> None:
    """Anthropic's shapes for the same conversation: the thinking and the tool_use as the assistant
    turn, the tool_result as the user's; the prompt is the one chat completions renders, and
    nothing of harmony's reaches the reply."""
    messages: Any = [
        *USER,
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": THOUGHT, "signature": ""},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": PARIS},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": '{"sky": "sunny"}'}],
        },
    ]
    counted = claude.messages.count_tokens(model="gptoss", messages=messages, tools=MESSAGES_TOOLS)
    chat = sdk.chat.completions.create(
        model="gptoss", messages=_history(json.dumps(PARIS)), tools=TOOLS, max_tokens=1, temperature=0
    )
    assert chat.usage is not None and counted.input_tokens == chat.usage.prompt_tokens

    reply = claude.messages.create(
        model="gptoss",
        max_tokens=24,
        messages=messages,
        tools=MESSAGES_TOOLS,
        extra_body={"temperature": 0},
    )
    # (Anthropic's input_tokens leave out what was read from the cache.)
    usage = reply.usage
    read = (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    assert usage.input_tokens + read == chat.usage.prompt_tokens
    for block in reply.content:
        if block.type == "text":
            assert_clean(block.text)
        elif block.type == "thinking":
            assert_clean(block.thinking)
    with claude.messages.stream(
        model="gptoss",
        max_tokens=24,
        messages=messages,
        tools=MESSAGES_TOOLS,
        extra_body={"temperature": 0},
    ) as stream:
        streamed = stream.get_final_message()
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in reply.content]
