"""Tool calls in each family's own format from the family's tiny model on the real CPU Triton,
through the official clients: the `openai` SDK (chat completions, Responses) and the `anthropic` SDK
(Messages), whole and streamed.

The models are random, so each request steers its model (greedy) into writing the family's text:
a regex guide (vLLM's `structured_outputs`) spells out the reply, and a logit bias on the family's
marker tokens makes each marker its own token (the one id the family has for it) rather than
pieces that spell it. Llama 3.1's calls are JSON, so a JSON schema steers them on every API. A
forced tool choice is a guided call on any family; with DeepSeek-R1's reasoning parser (whose
replies start inside the think block) it is still a call, also when the token limit cuts it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.integration.conftest import TritonStack, family_model_spec
from tests.support import http_client
from tests.support.client_venv import client_python
from tests.support.gateway_process import GatewayProcess
from tests.support.tokenizers import loaded_tokenizer

pytestmark = pytest.mark.integration

TEMPLATES = Path(__file__).parents[1] / "data" / "chat_templates"
CITY = {"type": "string", "enum": ["Paris", "Tokyo"]}
WEATHER_SCHEMA: Any = {
    "type": "object",
    "properties": {"city": CITY, "days": {"type": "integer", "enum": [1, 2, 3]}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER_SCHEMA},
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Clock",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string"}},
                "required": ["zone"],
            },
        },
    },
]
RESPONSES_TOOLS: Any = [{"type": "function", **t["function"]} for t in TOOLS]
MESSAGES_TOOLS: Any = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in TOOLS
]
USER: Any = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]
PARIS = {"city": "Paris", "days": 3}
# Every marker the families write: none may reach a client's text.
MARKERS = (
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<function=",
    "<parameter=",
    "<｜tool",
    "<|python_tag|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<｜end▁of▁sentence｜>",
    "[TOOL_CALLS]",
    "[/INST]",
)


@pytest.fixture(scope="module")
def gateway(triton_stack: TritonStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    specs = [
        family_model_spec(
            triton_stack, "qwen3", name="qwen3", tool_parser="hermes", reasoning_parser="qwen3"
        ),
        family_model_spec(
            triton_stack, "qwen3", name="qwen3-coder", tool_parser="qwen3_coder", reasoning_parser="qwen3"
        ),
        family_model_spec(
            triton_stack,
            "deepseek_v3",
            name="deepseek",
            tool_parser="deepseek_v3",
            chat_template=str(TEMPLATES / "deepseek_v3_tools.jinja"),
        ),
        family_model_spec(
            triton_stack,
            "deepseek_v3",
            name="deepseek-r1",
            tool_parser="deepseek_v3",
            reasoning_parser="deepseek_r1",
            chat_template=str(TEMPLATES / "deepseek_v3_tools.jinja"),
        ),
        # Mistral-Nemo's own template (it renders tools and calls, and takes 9-character ids only).
        family_model_spec(triton_stack, "mistral", name="mistral", tool_parser="mistral"),
        family_model_spec(
            triton_stack,
            "llama3_1",
            name="llama",
            tool_parser="llama3_json",
            chat_template=str(TEMPLATES / "llama3_1_json_tools.jinja"),
        ),
        # Their packaged templates render no tools and they have no call format of their own.
        family_model_spec(triton_stack, "gemma3", name="gemma3"),
        family_model_spec(triton_stack, "llama2", name="llama2"),
    ]
    args = ["--triton-url", triton_stack.grpc_url, "--log-level", "warning"]
    for spec in specs:
        args += ["--model", spec]
    args += ["--state-dir", str(tmp_path_factory.mktemp("family_tools_state"))]
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


def regex_literal(text: str) -> str:
    """A regex that matches exactly `text`."""
    out = []
    for c in text:
        if c == "\n":
            out.append("\\n")
        elif c in '\\.^$*+?{}[]|()/"-':
            out.append("\\" + c)
        else:
            out.append(c)
    return "".join(out)


def marker_bias(triton_stack: TritonStack, family: str, markers: tuple[str, ...]) -> dict[str, int]:
    """A logit bias that makes each marker the model's choice wherever the guide allows it, so it
    comes as the family's own single token."""
    tokenizer = loaded_tokenizer(triton_stack.models[f"family_{family}"].tokenizer_dir)
    return {str(tokenizer.vocab[m]): 100 for m in markers}


def assert_clean(*texts: str | None) -> None:
    for text in texts:
        for marker in MARKERS:
            assert marker not in (text or ""), (marker, text)


def streamed_chat(
    sdk: openai.OpenAI, **request: Any
) -> tuple[str, str, dict[int, tuple[str, list[str]]], str]:
    """content, reasoning, {index: (name, argument fragments)}, finish reason of a streamed chat."""
    content, reasoning, finish = "", "", ""
    calls: dict[int, tuple[str, list[str]]] = {}
    for chunk in sdk.chat.completions.create(stream=True, **request):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for call in delta.tool_calls or ():
            name, pieces = calls.setdefault(call.index, ("", []))
            if call.function and call.function.name:
                name = call.function.name
            if call.function and call.function.arguments:
                pieces.append(call.function.arguments)
            calls[call.index] = (name, pieces)
        finish = choice.finish_reason or finish
    return content, reasoning, calls, finish


# Mistral-Nemo's calls: the control token, then a JSON array of {"name", "arguments"}.
MISTRAL_CALL = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]'

STEERED = [
    pytest.param(
        "qwen3",
        "qwen3",
        {},
        "<think>\nThe user wants the forecast.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
        ("<think>", "</think>", "<tool_call>", "</tool_call>"),
        "The user wants the forecast.",
        None,
        id="qwen3-hermes-thinking",
    ),
    pytest.param(
        "qwen3",
        "qwen3",
        {"chat_template_kwargs": {"enable_thinking": False}},
        "Let me check.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
        ("<tool_call>", "</tool_call>"),
        None,
        "Let me check.",
        id="qwen3-hermes-thinking-off",
    ),
    pytest.param(
        "qwen3",
        "qwen3-coder",
        {"chat_template_kwargs": {"enable_thinking": False}},
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        ("<tool_call>", "</tool_call>"),
        None,
        None,
        id="qwen3-coder-xml",
    ),
    pytest.param(
        "deepseek_v3",
        "deepseek",
        {},
        # (Content that ends in a letter: the vocabulary has `.<`, which would spell the marker in pieces.)
        "Checking the weather<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
        '```json\n{"city": "Paris", "days": 3}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        (
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁sep｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁calls▁end｜>",
        ),
        None,
        "Checking the weather",
        id="deepseek_v3",
    ),
    pytest.param(
        "mistral",
        "mistral",
        {},
        MISTRAL_CALL,
        ("[TOOL_CALLS]",),
        None,
        None,
        id="mistral",
    ),
]


@pytest.mark.parametrize(("family", "model", "extra", "text", "markers", "reasoning", "content"), STEERED)
def test_a_familys_own_call_text_is_a_tool_call_whole_and_streamed(
    sdk: openai.OpenAI,
    triton_stack: TritonStack,
    family: str,
    model: str,
    extra: dict[str, Any],
    text: str,
    markers: tuple[str, ...],
    reasoning: str | None,
    content: str | None,
) -> None:
    request: dict[str, Any] = {
        "model": model,
        "messages": USER,
        "tools": TOOLS,
        "temperature": 0,
        "max_tokens": 160,
        "logit_bias": marker_bias(triton_stack, family, markers),
        "extra_body": {"structured_outputs": {"regex": regex_literal(text)}, **extra},
    }
    whole = sdk.chat.completions.create(logprobs=True, **request)
    choice = whole.choices[0]
    message = choice.message
    # The model wrote each of the family's markers as its own token.
    assert choice.logprobs is not None and choice.logprobs.content is not None
    tokens = [entry.token for entry in choice.logprobs.content]
    for marker in markers:
        assert marker in tokens, (marker, tokens)
    assert choice.finish_reason == "tool_calls", message
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or ()] == [
        ("get_weather", PARIS)
    ]
    assert (message.content or None) == content
    assert (message.model_extra or {}).get("reasoning_content") == reasoning
    assert_clean(message.content, (message.model_extra or {}).get("reasoning_content"))
    streamed_content, streamed_reasoning, calls, finish = streamed_chat(sdk, **request)
    assert finish == "tool_calls"
    assert (streamed_content or None, streamed_reasoning or None) == (content, reasoning)
    assert list(calls) == [0]
    name, pieces = calls[0]
    assert name == "get_weather"
    assert "".join(pieces) == message.tool_calls[0].function.arguments  # type: ignore[index]
    if model != "qwen3-coder":
        # JSON arguments stream as the model writes them.
        assert len(pieces) > 1

    # The Responses API, steered the same way (its reasoning effort "none" is Qwen3's thinking off).
    responses: dict[str, Any] = {
        "model": model,
        "input": USER,
        "tools": RESPONSES_TOOLS,
        "temperature": 0,
        "max_output_tokens": 160,
        "extra_body": {"structured_outputs": {"regex": regex_literal(text)}},
    }
    if extra:
        responses["reasoning"] = {"effort": "none"}
    response = sdk.responses.create(**responses)
    assert [(i.name, json.loads(i.arguments)) for i in response.output if i.type == "function_call"] == [
        ("get_weather", PARIS)
    ]
    said = "".join(
        c.text for i in response.output if i.type == "message" for c in i.content if c.type == "output_text"
    )
    thought = "".join(
        c.text
        for i in response.output
        if i.type == "reasoning"
        for c in (i.content or ())
        if c.type == "reasoning_text"
    )
    assert (said or None, thought or None) == (content, reasoning)
    assert_clean(said, thought)
    deltas: list[str] = []
    with sdk.responses.stream(**responses) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    calls_out = [i for i in final.output if i.type == "function_call"]
    assert [(i.name, i.arguments) for i in calls_out] == [
        (i.name, i.arguments) for i in response.output if i.type == "function_call"
    ]
    assert "".join(deltas) == calls_out[0].arguments


@pytest.mark.parametrize(("family", "model", "extra", "text", "markers", "reasoning", "content"), STEERED)
def test_a_familys_own_call_text_is_a_tool_use_block_through_the_messages_api(
    claude: anthropic.Anthropic,
    family: str,
    model: str,
    extra: dict[str, Any],
    text: str,
    markers: tuple[str, ...],
    reasoning: str | None,
    content: str | None,
) -> None:
    """The same replies through the anthropic SDK, steered by the same regex (`structured_outputs`,
    vLLM's extension, taken here as on chat completions): a tool_use block with the call's input,
    its input_json_delta pieces concatenating to it, thinking where the reply thinks, no markers."""
    request: dict[str, Any] = {
        "model": model,
        "max_tokens": 160,
        "messages": USER,
        "tools": MESSAGES_TOOLS,
        "extra_body": {"structured_outputs": {"regex": regex_literal(text)}, "temperature": 0},
    }
    if extra:
        # Qwen3's thinking off, in Anthropic's words.
        request["thinking"] = {"type": "disabled"}
    message = claude.messages.create(**request)
    assert message.stop_reason == "tool_use", message
    assert [(b.name, b.input) for b in message.content if b.type == "tool_use"] == [("get_weather", PARIS)]
    said = "".join(b.text for b in message.content if b.type == "text")
    thought = "".join(b.thinking for b in message.content if b.type == "thinking")
    assert (said or None, thought or None) == (content, reasoning)
    assert_clean(said, thought)
    # Thinking first, then the text, then the call, as the model wrote them.
    order = [b.type for b in message.content]
    assert order == sorted(order, key=["thinking", "text", "tool_use"].index)

    with claude.messages.stream(**request) as stream:
        deltas = [e.delta for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    partial = [d.partial_json for d in deltas if d.type == "input_json_delta"]
    assert json.loads("".join(partial)) == PARIS
    if model != "qwen3-coder":
        # JSON arguments stream as the model writes them.
        assert len(partial) > 1
    streamed_thought = "".join(d.thinking for d in deltas if d.type == "thinking_delta")
    streamed_text = "".join(d.text for d in deltas if d.type == "text_delta")
    assert (streamed_text or None, streamed_thought or None) == (content, reasoning)
    assert final.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "input", None)) for b in final.content] == [
        (b.type, getattr(b, "input", None)) for b in message.content
    ]


RESULT = '{"forecast": "sunny"}'


def _history(call_id: str, arguments: Any) -> list[dict[str, Any]]:
    """The conversation after a call: the call as the client hands it back, then its result."""
    return [
        *USER,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": RESULT},
    ]


def test_a_mistral_conversation_goes_back_through_its_own_template_with_any_clients_ids(
    sdk: openai.OpenAI, claude: anthropic.Anthropic, gateway: GatewayProcess, triton_stack: TritonStack
) -> None:
    """Mistral's template takes call ids of 9 characters and nothing else. The gateway names
    Mistral's calls as vLLM does (9 letters and digits), and a longer id handed back (the openai
    SDK's and Codex's `call_...`, Claude Code's `toolu_...`) goes to the template cut to its last 9,
    as vLLM cuts it; an id too short to cut is the template's own refusal, a 400."""
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(triton_stack.models["family_mistral"].tokenizer_dir))
    steered: dict[str, Any] = {
        "model": "mistral",
        "messages": USER,
        "tools": TOOLS,
        "temperature": 0,
        "max_tokens": 64,
        "logit_bias": marker_bias(triton_stack, "mistral", ("[TOOL_CALLS]",)),
        "extra_body": {"structured_outputs": {"regex": regex_literal(MISTRAL_CALL)}},
    }
    (call,) = sdk.chat.completions.create(**steered).choices[0].message.tool_calls or ()
    assert len(call.id) == 9 and call.id.isalnum(), call.id
    _, _, streamed, _ = streamed_chat(sdk, **steered)
    assert list(streamed) == [0]
    clients = "call_" + "Xy7" * 8
    for handed_back in (call.id, clients):
        history = _history(handed_back, call.function.arguments)
        # The template's own rendering of the conversation, the id cut as vLLM cuts it.
        expected = reference.apply_chat_template(
            _history(handed_back[-9:], json.loads(call.function.arguments)),
            tools=TOOLS,
            add_generation_prompt=True,
            tokenize=True,
        )
        expected = list(expected["input_ids"] if hasattr(expected, "keys") else expected)
        shown = http_client.post(
            gateway.base_url + "/tokenize",
            json={"model": "mistral", "messages": history, "tools": TOOLS},
            timeout=60,
        )
        assert shown.status_code == 200, shown.text
        assert shown.json()["tokens"] == expected, handed_back
        reply = sdk.chat.completions.create(
            model="mistral", messages=history, tools=TOOLS, temperature=0, max_tokens=2
        )
        assert reply.usage is not None and reply.usage.prompt_tokens == len(expected), handed_back
        if handed_back == clients:
            # The Responses API: the same conversation as items, the client's call_id cut the same way.
            response = sdk.responses.create(
                model="mistral",
                input=[
                    *USER,
                    {
                        "type": "function_call",
                        "call_id": clients,
                        "name": "get_weather",
                        "arguments": call.function.arguments,
                    },
                    {"type": "function_call_output", "call_id": clients, "output": RESULT},
                ],
                tools=RESPONSES_TOOLS,
                temperature=0,
                max_output_tokens=16,
            )
            assert response.usage is not None and response.usage.input_tokens == len(expected)
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(
            model="mistral", messages=_history("call_1", "{}"), tools=TOOLS, max_tokens=2
        )
    assert "Tool call IDs should be alphanumeric strings with length 9!" in str(refused.value)

    # The Messages API: Anthropic-shaped ids handed back, cut the same way.
    use = "toolu_" + "Ab1" * 8
    expected = reference.apply_chat_template(
        _history(use[-9:], PARIS), tools=TOOLS, add_generation_prompt=True, tokenize=True
    )
    expected = list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    reply = claude.messages.create(
        model="mistral",
        max_tokens=2,
        messages=[
            *USER,
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": use, "name": "get_weather", "input": PARIS}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use, "content": RESULT}],
            },
        ],
        tools=MESSAGES_TOOLS,
        extra_body={"temperature": 0},
    )
    assert reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0) == len(expected)


LLAMA_CALL_SCHEMA: Any = {
    "type": "object",
    "properties": {"name": {"type": "string", "enum": ["get_weather"]}, "parameters": WEATHER_SCHEMA},
    "required": ["name", "parameters"],
    "additionalProperties": False,
}


def test_llamas_json_call_through_chat_responses_and_messages(
    sdk: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    """Llama 3.1 writes a call as the whole reply, `{"name": ..., "parameters": ...}`: a JSON schema
    steers the model into it with the tool choice left to the model, and every API reports a call."""
    chat: dict[str, Any] = {
        "model": "llama",
        "messages": USER,
        "tools": TOOLS,
        "temperature": 0,
        "max_tokens": 64,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "call", "schema": LLAMA_CALL_SCHEMA},
        },
    }
    whole = sdk.chat.completions.create(**chat)
    (call,) = whole.choices[0].message.tool_calls or ()
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"city", "days"}
    assert whole.choices[0].message.content is None
    content, _, calls, finish = streamed_chat(sdk, **chat)
    assert (content, finish) == ("", "tool_calls")
    assert calls[0][0] == "get_weather" and "".join(calls[0][1]) == call.function.arguments
    assert len(calls[0][1]) > 1

    text_format = {"format": {"type": "json_schema", "name": "call", "schema": LLAMA_CALL_SCHEMA}}
    response = sdk.responses.create(
        model="llama",
        input=USER,
        tools=RESPONSES_TOOLS,
        temperature=0,
        max_output_tokens=64,
        text=text_format,
    )
    items = [item for item in response.output if item.type == "function_call"]
    assert [(i.name, json.loads(i.arguments)) for i in items] == [("get_weather", arguments)]
    assert not [item for item in response.output if item.type == "message"]
    deltas: list[str] = []
    with sdk.responses.stream(
        model="llama",
        input=USER,
        tools=RESPONSES_TOOLS,
        temperature=0,
        max_output_tokens=64,
        text=text_format,
    ) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert "".join(deltas) == items[0].arguments and len(deltas) > 1
    assert [i.name for i in final.output if i.type == "function_call"] == ["get_weather"]

    output_config: Any = {"format": {"type": "json_schema", "schema": LLAMA_CALL_SCHEMA}}
    message = claude.messages.create(
        model="llama",
        max_tokens=64,
        messages=USER,
        tools=MESSAGES_TOOLS,
        extra_body={"output_config": output_config, "temperature": 0},
    )
    assert message.stop_reason == "tool_use"
    uses = [b for b in message.content if b.type == "tool_use"]
    assert [(u.name, u.input) for u in uses] == [("get_weather", arguments)]
    assert not [b for b in message.content if b.type == "text"]
    with claude.messages.stream(
        model="llama",
        max_tokens=64,
        messages=USER,
        tools=MESSAGES_TOOLS,
        extra_body={"output_config": output_config, "temperature": 0},
    ) as stream:
        partial = [
            e.delta.partial_json
            for e in stream
            if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
        ]
        streamed = stream.get_final_message()
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [
        ("get_weather", arguments)
    ]
    assert json.loads("".join(partial)) == arguments


@pytest.mark.parametrize("max_tokens", [64, 2])
def test_a_forced_call_with_deepseek_r1s_parser_is_a_call_on_every_api(
    sdk: openai.OpenAI, claude: anthropic.Anthropic, max_tokens: int
) -> None:
    """The reply of a forced choice is the call's JSON from its first token: not thinking (the R1
    parser starts every reply inside the think block), and a call even when the limit cuts it
    before its name is written."""
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    request: dict[str, Any] = {
        "model": "deepseek-r1",
        "messages": USER,
        "tools": TOOLS,
        "tool_choice": named,
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    whole = sdk.chat.completions.create(**request)
    message = whole.choices[0].message
    assert [c.function.name for c in message.tool_calls or ()] == ["get_weather"]
    assert message.content is None
    assert (message.model_extra or {}).get("reasoning_content") is None
    assert whole.choices[0].finish_reason == ("tool_calls" if max_tokens == 64 else "length")
    if max_tokens == 64:
        assert set(json.loads(message.tool_calls[0].function.arguments)) == {"city", "days"}  # type: ignore[index]
    content, reasoning, calls, _ = streamed_chat(sdk, **request)
    assert (content, reasoning) == ("", "")
    assert [name for name, _ in calls.values()] == ["get_weather"]
    assert "".join(calls[0][1]) == message.tool_calls[0].function.arguments  # type: ignore[index]

    response = sdk.responses.create(
        model="deepseek-r1",
        input=USER,
        tools=RESPONSES_TOOLS,
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
        # The Responses API's least limit (OpenAI's), which still cuts the call.
        max_output_tokens=max(max_tokens, 16),
    )
    assert [i.name for i in response.output if i.type == "function_call"] == ["get_weather"]
    assert not [i for i in response.output if i.type in ("message", "reasoning")]

    reply = claude.messages.create(
        model="deepseek-r1",
        max_tokens=max_tokens,
        messages=USER,
        tools=MESSAGES_TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body={"temperature": 0},
    )
    assert [b.name for b in reply.content if b.type == "tool_use"] == ["get_weather"]
    assert not [b for b in reply.content if b.type in ("text", "thinking")]


# instructor in its own venv: its pins (jiter<0.15, rich<15) cannot share the project's environment.
INSTRUCTOR = ("instructor==1.17.0",)
INSTRUCTOR_SCRIPT = """
import sys
from typing import Literal

import instructor
import openai
from pydantic import BaseModel


class Forecast(BaseModel):
    city: Literal["Paris", "Tokyo"]
    days: Literal[1, 2, 3]


client = instructor.from_openai(
    openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0), mode=instructor.Mode.TOOLS
)
forecast = client.chat.completions.create(
    model=sys.argv[2],
    response_model=Forecast,
    messages=[{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}],
    max_tokens=64,
    temperature=0,
    max_retries=0,
)
assert isinstance(forecast, Forecast)
print(forecast.model_dump_json())
"""


@pytest.mark.parametrize("model", ["gemma3", "llama2"])
def test_instructor_tools_mode_returns_a_validated_object_on_a_template_without_tools(
    gateway: GatewayProcess, model: str
) -> None:
    """instructor's Mode.TOOLS forces a call to its response model's function: served by guided
    decoding on packaged templates that render no tools (Gemma 3's, Llama 2's)."""
    python = client_python("instructor", INSTRUCTOR)
    out = subprocess.run(
        [str(python), "-c", INSTRUCTOR_SCRIPT, gateway.base_url + "/v1", model],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    forecast = json.loads(out.stdout)
    assert forecast["city"] in ("Paris", "Tokyo") and forecast["days"] in (1, 2, 3)


@pytest.mark.parametrize("model", ["gemma3", "llama2"])
def test_a_forced_calls_result_goes_back_through_a_template_without_a_tool_turn(
    sdk: openai.OpenAI,
    claude: anthropic.Anthropic,
    gateway: GatewayProcess,
    triton_stack: TritonStack,
    model: str,
) -> None:
    """Gemma 3's and Llama 2's templates refuse a `tool` turn and never read `tool_calls`: the call
    the model was forced into and its result come back on chat completions and the Messages API and
    are answered, the model shown its own call's JSON and the result in a tool_output user turn."""
    forced: Any = {"type": "function", "function": {"name": "get_weather"}}
    first = sdk.chat.completions.create(
        model=model, messages=USER, tools=TOOLS, tool_choice=forced, temperature=0, max_tokens=64
    )
    (call,) = first.choices[0].message.tool_calls or ()
    result = "22 C and sunny"
    messages: Any = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": result},
    ]
    second = sdk.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=8)
    assert second.choices[0].finish_reason in ("stop", "length")
    tokens = http_client.post(
        gateway.base_url + "/tokenize", json={"model": model, "messages": messages}, timeout=60
    ).json()["tokens"]
    shown = loaded_tokenizer(triton_stack.models[f"family_{model}"].tokenizer_dir).decode(
        tokens, skip_special_tokens=False
    )
    written = json.dumps({"name": "get_weather", "arguments": json.loads(call.function.arguments)})
    assert written in shown and f"```tool_output\n{result}\n```" in shown, shown
    assert shown.index(written) < shown.index(result)

    answer = claude.messages.create(
        model=model,
        max_tokens=8,
        # The pinned SDK takes no `temperature` argument on create(); the API still reads the field.
        extra_body={"temperature": 0},
        messages=[
            *USER,
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": PARIS}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result}],
            },
        ],
    )
    assert answer.stop_reason in ("end_turn", "max_tokens")
