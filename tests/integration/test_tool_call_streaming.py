"""Tool-call arguments streamed as the model writes them, and a call cut by the token limit, against
the real CPU Triton with the official clients: the `openai` SDK (chat completions and the Responses
stream) and the `anthropic` SDK's stream. Guided decoding forces the call (a required or named tool
choice), and greedy decoding makes every request repeatable. The CPU stand-in of TensorRT-LLM's
llmapi model has no guided decoding: there, each forced call is a 400 naming `tool_choice`, streamed
or not, in the API's own error shape."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.integration.conftest import TritonStack, llmapi_model_spec
from tests.support.gateway_process import GatewayProcess
from tests.support.openai_schema import validate, validated_responses_events
from tests.support.refusals import anthropic_refusal, openai_refusal

pytestmark = pytest.mark.integration

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Tokyo", "Reykjavik"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "units": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "days", "units"],
    "additionalProperties": False,
}
CHAT_TOOL: Any = {"type": "function", "function": {"name": "get_forecast", "parameters": PARAMETERS}}
RESPONSES_TOOL: Any = {"type": "function", "name": "get_forecast", "parameters": PARAMETERS, "strict": True}
MESSAGES_TOOL: Any = {"name": "get_forecast", "input_schema": PARAMETERS}
QUESTION = "What is the forecast for Paris this week?"
LIMIT = 96
# The same tiny model as `tiny`, behind the llmapi model's contract.
LLMAPI = "tiny-llmapi"
MODELS = ["tiny", LLMAPI]


@pytest.fixture(scope="module")
def gateway(triton_stack: TritonStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    m = triton_stack.models["bpe_current"]
    spec = (
        f"name=tiny,tokenizer={m.tokenizer_dir},triton_model={m.ensemble},engine_model={m.engine},"
        "tool_parser=hermes"
    )
    args = ["--triton-url", triton_stack.grpc_url, "--log-level", "warning", "--model", spec]
    args += ["--model", llmapi_model_spec(triton_stack, LLMAPI, tool_parser="hermes")]
    args += ["--state-dir", str(tmp_path_factory.mktemp("gateway_state"))]
    with GatewayProcess(args) as process:
        yield process


@pytest.fixture
def sdk(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


@pytest.fixture
def claude(gateway: GatewayProcess) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gateway.base_url, api_key="unused", max_retries=0) as client:
        yield client


def cut_inside_the_arguments(arguments_at: Callable[[int], str | None], whole: str, tokens: int) -> int:
    """The largest token limit whose reply is a call with only part of `whole` as arguments (greedy
    output under a limit is a prefix of the unlimited output, so this is found counting down)."""
    for limit in range(tokens - 1, 0, -1):
        cut = arguments_at(limit)
        if cut is not None and cut != whole:
            return limit
    raise AssertionError("no token limit cuts the call inside its arguments")


def assert_cut(cut: str, whole: str) -> None:
    """A proper, non-trivial prefix of the whole arguments, and JSON as far as it goes."""
    assert cut.startswith("{") and whole.startswith(cut) and cut != whole
    json.loads(whole)


# ---------------------------------------------------------------- chat completions


@pytest.mark.parametrize("model", MODELS)
def test_chat_streams_the_arguments_in_several_deltas_equal_to_the_whole_ones(
    sdk: openai.OpenAI, model: str
) -> None:
    fields: Any = {
        "model": model,
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": [CHAT_TOOL],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 0,
        "max_tokens": LIMIT,
    }
    if model == LLMAPI:
        for stream in (False, True):
            with openai_refusal("tool_choice"):
                sdk.chat.completions.create(**fields, stream=stream)
        return
    whole = sdk.chat.completions.create(**fields)
    (call,) = whole.choices[0].message.tool_calls or []
    assert call.function.name == "get_forecast"  # type: ignore[union-attr]
    arguments = call.function.arguments  # type: ignore[union-attr]
    assert json.loads(arguments)["city"] in ("Paris", "Tokyo", "Reykjavik")
    assert whole.choices[0].finish_reason == "tool_calls"

    deltas = []
    for chunk in sdk.chat.completions.create(**fields, stream=True):
        validate("CreateChatCompletionStreamResponse", chunk.model_dump(mode="json", exclude_unset=True))
        for choice in chunk.choices:
            deltas += choice.delta.tool_calls or []
            if choice.finish_reason is not None:
                finish = choice.finish_reason
    first, *rest = deltas
    # The name first, with the id; then the arguments as they are written.
    assert first.id and first.function and first.function.name == "get_forecast"
    assert not first.function.arguments
    assert len(rest) > 1 and all(d.function and d.function.name is None for d in rest)
    assert "".join(d.function.arguments or "" for d in rest if d.function) == arguments
    assert finish == "tool_calls"


@pytest.mark.parametrize("model", MODELS)
def test_chat_a_call_cut_by_max_tokens_is_a_tool_call_with_finish_reason_length(
    sdk: openai.OpenAI, model: str
) -> None:
    fields: Any = {
        "model": model,
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": [CHAT_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_forecast"}},
        "temperature": 0,
    }
    if model == LLMAPI:
        for stream in (False, True):
            with openai_refusal("tool_choice"):
                sdk.chat.completions.create(**fields, max_tokens=LIMIT, stream=stream)
        return
    whole = sdk.chat.completions.create(**fields, max_tokens=LIMIT)
    arguments = (whole.choices[0].message.tool_calls or [])[0].function.arguments  # type: ignore[union-attr]
    assert whole.usage is not None

    def arguments_at(limit: int) -> str | None:
        r = sdk.chat.completions.create(**fields, max_tokens=limit)
        calls = r.choices[0].message.tool_calls
        return calls[0].function.arguments if calls else None  # type: ignore[union-attr]

    limit = cut_inside_the_arguments(arguments_at, arguments, whole.usage.completion_tokens)
    cut = sdk.chat.completions.create(**fields, max_tokens=limit)
    validate("CreateChatCompletionResponse", cut.model_dump(mode="json", exclude_unset=True))
    choice = cut.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_forecast"  # type: ignore[union-attr]
    assert_cut(call.function.arguments, arguments)  # type: ignore[union-attr]

    streamed = ""
    for chunk in sdk.chat.completions.create(**fields, max_tokens=limit, stream=True):
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                streamed += (delta.function.arguments or "") if delta.function else ""
            if choice.finish_reason is not None:
                finish = choice.finish_reason
    assert streamed == call.function.arguments  # type: ignore[union-attr]
    assert finish == "length"


# ---------------------------------------------------------------- Responses


@pytest.mark.parametrize("model", MODELS)
def test_responses_stream_arguments_in_deltas_and_a_cut_call_is_incomplete(
    sdk: openai.OpenAI, model: str
) -> None:
    fields: Any = {
        "model": model,
        "input": QUESTION,
        "tools": [RESPONSES_TOOL],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 0,
    }
    if model == LLMAPI:
        with openai_refusal("tool_choice"):
            sdk.responses.create(**fields, max_output_tokens=LIMIT)
        with openai_refusal("tool_choice"), sdk.responses.stream(**fields, max_output_tokens=LIMIT):
            pass
        return
    whole = sdk.responses.create(**fields, max_output_tokens=LIMIT)
    (call,) = [item for item in whole.output if item.type == "function_call"]
    assert call.name == "get_forecast" and json.loads(call.arguments)
    assert whole.usage is not None

    def stream(limit: int) -> tuple[list[str], Any]:
        deltas = []
        with sdk.responses.stream(**fields, max_output_tokens=limit) as events:
            for event in validated_responses_events(events):
                if event.type == "response.function_call_arguments.delta":
                    deltas.append(event.delta)
                if event.type in ("response.completed", "response.incomplete"):
                    final = event.response
        return deltas, final

    deltas, final = stream(LIMIT)
    assert len(deltas) > 1 and "".join(deltas) == call.arguments
    assert final.status == "completed"

    def arguments_at(limit: int) -> str | None:
        r = sdk.responses.create(**fields, max_output_tokens=limit)
        calls = [item for item in r.output if item.type == "function_call"]
        return calls[0].arguments if calls else None

    limit = cut_inside_the_arguments(arguments_at, call.arguments, whole.usage.output_tokens)
    cut = sdk.responses.create(**fields, max_output_tokens=limit)
    validate("Response", cut.model_dump(mode="json", exclude_unset=True, exclude={"output_text"}))
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    (item,) = cut.output
    assert item.type == "function_call" and item.name == "get_forecast" and item.status == "incomplete"
    assert_cut(item.arguments, call.arguments)

    deltas, final = stream(limit)
    assert final.status == "incomplete"
    (streamed,) = final.output
    assert "".join(deltas) == streamed.arguments == item.arguments


# ---------------------------------------------------------------- Messages


@pytest.mark.parametrize("model", MODELS)
def test_messages_stream_input_json_in_deltas_and_a_cut_call_stops_for_max_tokens(
    claude: anthropic.Anthropic, model: str
) -> None:
    fields: Any = {
        "model": model,
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": [MESSAGES_TOOL],
        "tool_choice": {"type": "tool", "name": "get_forecast"},
        "extra_body": {"temperature": 0},
    }
    if model == LLMAPI:
        with anthropic_refusal("tool_choice"):
            claude.messages.create(**fields, max_tokens=LIMIT)
        with anthropic_refusal("tool_choice"), claude.messages.stream(**fields, max_tokens=LIMIT):
            pass
        return
    whole = claude.messages.create(**fields, max_tokens=LIMIT)
    assert whole.stop_reason == "tool_use"
    (call,) = [b for b in whole.content if b.type == "tool_use"]
    assert set(call.input) == {"city", "days", "units"}  # type: ignore[arg-type]

    def stream(limit: int) -> tuple[list[str], anthropic.types.Message]:
        partial = []
        with claude.messages.stream(**fields, max_tokens=limit) as events:
            for event in events:
                if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                    partial.append(event.delta.partial_json)
            return partial, events.get_final_message()

    partial, final = stream(LIMIT)
    assert len(partial) > 1
    (streamed,) = [b for b in final.content if b.type == "tool_use"]
    assert (streamed.name, streamed.input) == (call.name, call.input)
    arguments = "".join(partial)
    assert json.loads(arguments) == call.input

    def arguments_at(limit: int) -> str | None:
        partial, message = stream(limit)
        return "".join(partial) if any(b.type == "tool_use" for b in message.content) else None

    limit = cut_inside_the_arguments(arguments_at, arguments, whole.usage.output_tokens)
    cut = claude.messages.create(**fields, max_tokens=limit)
    assert cut.stop_reason == "max_tokens"
    (block,) = cut.content
    assert block.type == "tool_use" and block.name == "get_forecast"
    # The input is what parsed: members of the whole call's (the last one maybe a cut number).
    assert isinstance(block.input, dict) and set(block.input) <= set(call.input)  # type: ignore[arg-type]

    partial, final = stream(limit)
    assert_cut("".join(partial), arguments)
    assert final.stop_reason == "max_tokens"
    (streamed,) = final.content
    assert streamed.type == "tool_use" and streamed.input == block.input
