"""The Responses API against the real CPU Triton, through the official clients: the `openai` SDK
(`client.responses`), the OpenAI Agents SDK and LangChain's ChatOpenAI(use_responses_api=True); on
the C++ repository and on the CPU stand-in of TensorRT-LLM's llmapi model, where what needs guided
decoding (a forced tool choice, a JSON schema) is a 400 naming the parameter."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any, Literal

import jsonschema
import openai
import pydantic
import pytest

from tests.integration.conftest import TritonStack, llmapi_model_spec
from tests.support.gateway_process import GatewayProcess
from tests.support.openai_schema import validate, validated_responses_events
from tests.support.refusals import openai_refusal

pytestmark = pytest.mark.integration

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
# The random test model never ends by itself: every request bounds its output.
SHORT = {"max_output_tokens": 24, "temperature": 0}
# The same tiny model as `tiny`, behind the llmapi model's contract.
LLMAPI = "tiny-llmapi"
MODELS = ["tiny", LLMAPI]


@pytest.fixture(scope="module")
def gateway(triton_stack: TritonStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    m = triton_stack.models["bpe_current"]
    spec = (
        f"name=tiny,tokenizer={m.tokenizer_dir},triton_model={m.ensemble},engine_model={m.engine},"
        "tool_parser=hermes,default_max_tokens=24"
    )
    # Nothing steers the llmapi model to end a reply (no guided decoding), and the random model
    # seldom ends one itself: its backstop cut is reported as a completed answer, as a model's own
    # end would be (the Agents SDK raises on an incomplete response).
    llmapi = llmapi_model_spec(
        triton_stack, LLMAPI, tool_parser="hermes", default_max_tokens="24", default_limit_status="completed"
    )
    state = tmp_path_factory.mktemp("gateway_state")
    args = [
        "--triton-url",
        triton_stack.grpc_url,
        "--log-level",
        "warning",
        "--model",
        spec,
        "--model",
        llmapi,
    ]
    args += ["--state-dir", str(state)]
    with GatewayProcess(args) as process:
        yield process


@pytest.fixture
def sdk(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def dump(response: Any) -> dict[str, Any]:
    return response.model_dump(mode="json", exclude_unset=True, exclude={"output_text"})


@pytest.mark.parametrize("model", MODELS)
def test_create_with_string_and_item_input_and_instructions(sdk: openai.OpenAI, model: str) -> None:
    first = sdk.responses.create(model=model, input="Hello there", instructions="Answer briefly", **SHORT)
    assert first.status in ("completed", "incomplete") and first.output_text
    assert first.usage is not None and first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    validate("Response", dump(first))
    items = [
        {"role": "developer", "content": "Answer briefly"},
        {"role": "user", "content": [{"type": "input_text", "text": "Hello there"}]},
    ]
    second = sdk.responses.create(model=model, input=items, **SHORT)
    validate("Response", dump(second))
    # The same conversation either way (a developer item is the instructions' role).
    assert second.output_text == first.output_text


@pytest.mark.parametrize("model", MODELS)
def test_streamed_text_equals_whole_text_for_a_greedy_request(sdk: openai.OpenAI, model: str) -> None:
    whole = sdk.responses.create(model=model, input="Tell me a story", **SHORT)
    deltas = []
    with sdk.responses.stream(model=model, input="Tell me a story", **SHORT) as stream:
        for event in validated_responses_events(stream):
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            if event.type in ("response.completed", "response.incomplete"):
                # The SDK's get_final_response() only takes response.completed; a reply cut by
                # max_output_tokens ends with response.incomplete, as OpenAI's does.
                final = event.response
    assert "".join(deltas) == whole.output_text == final.output_text
    assert final.status == whole.status


@pytest.mark.parametrize("model", MODELS)
def test_stream_reaches_response_completed(sdk: openai.OpenAI, model: str) -> None:
    seen = []
    with sdk.responses.stream(model=model, input="Hi", max_output_tokens=200) as stream:
        for event in stream:
            seen.append(event.type)
    assert seen[:2] == ["response.created", "response.in_progress"]
    assert seen[-1] in ("response.completed", "response.incomplete")
    # The random model may or may not end before 200 tokens; either is a finished response.


@pytest.mark.parametrize("model", MODELS)
def test_function_call_and_its_output_round_trip(sdk: openai.OpenAI, model: str) -> None:
    question = "Weather in Paris?"
    forced: dict[str, Any] = {
        "model": model,
        "input": question,
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_output_tokens": 64,
        "temperature": 0,
    }
    if model == LLMAPI:
        # Only guided decoding makes a reply a call, and the llmapi model has none: the round trip
        # goes on from a call written here.
        with openai_refusal("tool_choice"):
            sdk.responses.create(**forced)
        with openai_refusal("tool_choice"), sdk.responses.stream(**forced):
            pass
        call_item = {"type": "function_call", "call_id": "call_weather", "name": "get_weather"}
        call_item["arguments"] = '{"city": "Paris"}'
        follow = sdk.responses.create(
            model=model,
            input=[
                {"role": "user", "content": question},
                call_item,
                {"type": "function_call_output", "call_id": "call_weather", "output": '{"celsius": 21}'},
            ],  # type: ignore[list-item]
            tools=[WEATHER],  # type: ignore[list-item]
            **SHORT,
        )
    else:
        follow = _called_and_followed(sdk, forced)
    assert follow.status in ("completed", "incomplete")
    items = list(sdk.responses.input_items.list(follow.id, order="asc"))
    assert [i.type for i in items][-2:] == ["function_call", "function_call_output"]


def _called_and_followed(sdk: openai.OpenAI, forced: dict[str, Any]) -> Any:
    """A required tool choice is enforced by guided decoding, so the random model calls the tool:
    the call, whole and streamed, and the answer to its output."""
    first = sdk.responses.create(**{k: v for k, v in forced.items() if k != "temperature"})
    validate("Response", dump(first))
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls, first.output
    call = calls[0]
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Tokyo")

    # Streamed, the arguments concatenate to the whole ones (greedy, same request).
    args = ""
    with sdk.responses.stream(**forced) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                args += event.delta
            if event.type in ("response.completed", "response.incomplete"):
                streamed = event.response
    whole = sdk.responses.create(**forced)
    whole_call = next(i for i in whole.output if i.type == "function_call")
    streamed_call = next(i for i in streamed.output if i.type == "function_call")
    assert args == whole_call.arguments == streamed_call.arguments

    return sdk.responses.create(
        model=forced["model"],
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"celsius": 21}'}],
        tools=[WEATHER],  # type: ignore[list-item]
        **SHORT,
    )


class Forecast(pydantic.BaseModel):
    city: str = pydantic.Field(pattern="^[A-Z][a-z]{1,8}$")
    celsius: int = pydantic.Field(ge=-30, le=45)
    sunny: bool


@pytest.mark.parametrize("model", MODELS)
def test_text_format_json_schema_and_parse(sdk: openai.OpenAI, model: str) -> None:
    schema = Forecast.model_json_schema() | {"additionalProperties": False}
    fields: dict[str, Any] = {
        "model": model,
        "input": "Forecast?",
        "text": {"format": {"type": "json_schema", "name": "forecast", "schema": schema, "strict": True}},
        "max_output_tokens": 200,
    }
    if model == LLMAPI:
        # A JSON schema is enforced by guided decoding, which the llmapi model lacks.
        with openai_refusal("text.format"):
            sdk.responses.create(**fields)
        with openai_refusal("text.format"):
            sdk.responses.parse(model=model, input="Forecast?", text_format=Forecast, max_output_tokens=200)
        return
    r = sdk.responses.create(**fields)
    jsonschema.validate(json.loads(r.output_text), schema)
    parsed = sdk.responses.parse(model=model, input="Forecast?", text_format=Forecast, max_output_tokens=200)
    assert isinstance(parsed.output_parsed, Forecast)


@pytest.mark.parametrize("model", MODELS)
def test_previous_response_id_retrieve_delete_and_input_items(sdk: openai.OpenAI, model: str) -> None:
    first = sdk.responses.create(model=model, input="My name is Ada.", **SHORT)
    second = sdk.responses.create(
        model=model, input="What is my name?", previous_response_id=first.id, **SHORT
    )
    assert second.previous_response_id == first.id
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens - 1
    got = sdk.responses.retrieve(second.id)
    assert got.id == second.id and got.output_text == second.output_text
    items = list(sdk.responses.input_items.list(second.id))
    assert [i.type for i in items] == ["message", "message", "message"]
    assert items[0].content[0].text == "What is my name?"  # newest first
    assert items[-1].content[0].text == "My name is Ada."
    sdk.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as info:
        sdk.responses.create(model=model, input="again", previous_response_id=first.id, **SHORT)
    assert info.value.body["param"] == "previous_response_id"  # type: ignore[index]


@pytest.mark.parametrize("model", MODELS)
def test_store_false_is_not_retrievable(sdk: openai.OpenAI, model: str) -> None:
    r = sdk.responses.create(model=model, input="x", store=False, **SHORT)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(r.id)


class Report(pydantic.BaseModel):
    city: Literal["Paris", "Tokyo"]
    sunny: bool


@pytest.mark.parametrize("model", MODELS)
def test_agents_sdk_calls_the_tool_and_finishes(gateway: GatewayProcess, model: str) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # the Agents SDK would otherwise export traces to OpenAI
    called: list[str] = []

    # An enum argument: guided decoding then closes the call in a few tokens.
    @function_tool
    def get_weather(city: Literal["Paris", "Tokyo"]) -> str:
        """Current weather for a city."""
        called.append(city)
        return f"{city}: sunny"

    async def run() -> None:
        client = openai.AsyncOpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0)
        # The random model is steered by guided decoding both turns: the required first turn is a
        # call, and once the SDK has reset the tool choice, the output type's schema shapes the
        # answer, which ends when its JSON does (an unguided random model would run to the limit).
        agent = Agent(
            name="weather",
            model=OpenAIResponsesModel(model, client),
            tools=[get_weather],
            output_type=Report,
            model_settings=ModelSettings(tool_choice="required", max_tokens=96, temperature=0),
        )
        if model == LLMAPI:
            await refused_and_unforced(agent)
            await client.close()
            return
        result = await Runner.run(agent, "Weather in Paris?", max_turns=4)
        assert called and isinstance(result.final_output, Report)
        before = len(called)
        streamed = Runner.run_streamed(agent, "Weather in Tokyo?", max_turns=4)
        kinds = set()
        async for event in streamed.stream_events():
            kinds.add(event.type)
        assert len(called) > before and "raw_response_event" in kinds
        assert isinstance(streamed.final_output, Report)
        await client.close()

    async def refused_and_unforced(agent: Agent[Any]) -> None:
        # The llmapi model has no guided decoding to force the call.
        with openai_refusal("tool_choice"):
            await Runner.run(agent, "Weather in Paris?", max_turns=4)
        # Unforced, the turn completes: the random model answers in text (it writes no call), the
        # agent's final output, streamed as it is written.
        plain = agent.clone(output_type=None, model_settings=ModelSettings(temperature=0))
        result = await Runner.run(plain, "Weather in Paris?", max_turns=4)
        assert isinstance(result.final_output, str) and result.final_output
        streamed = Runner.run_streamed(plain, "Weather in Paris?", max_turns=4)
        kinds = {event.type async for event in streamed.stream_events()}
        assert "raw_response_event" in kinds and streamed.final_output == result.final_output

    asyncio.run(run())


@pytest.mark.parametrize("model", MODELS)
def test_langchain_responses_api_invoke_stream_and_tool_round_trip(
    gateway: GatewayProcess, model: str
) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=model,
        base_url=gateway.base_url + "/v1",
        api_key="unused",  # type: ignore[arg-type]
        use_responses_api=True,
        max_tokens=24,
        temperature=0,
        max_retries=0,
    )
    reply = llm.invoke("Hello")
    assert reply.text
    chunks = list(llm.stream("Hello"))
    assert "".join(c.text for c in chunks) == reply.text
    tool = {k: v for k, v in WEATHER.items() if k != "strict"}
    # A forced call is guided JSON: room for all of it.
    roomy = ChatOpenAI(
        model=model,
        base_url=gateway.base_url + "/v1",
        api_key="unused",  # type: ignore[arg-type]
        use_responses_api=True,
        max_tokens=96,
        temperature=0,
        max_retries=0,
    )
    with_tools = roomy.bind_tools([tool], tool_choice="get_weather")
    question = HumanMessage("Weather in Paris?")
    if model == LLMAPI:
        # No guided decoding to force the call: the round trip goes on from a call written here.
        with openai_refusal("tool_choice"):
            with_tools.invoke([question])
        call_message = AIMessage(
            "", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_weather"}]
        )
    else:
        call_message = with_tools.invoke([question])
    (call,) = call_message.tool_calls
    assert call["name"] == "get_weather"
    answer = llm.bind_tools([tool]).invoke(
        [question, call_message, ToolMessage(content="sunny", tool_call_id=call["id"])]
    )
    assert answer.text is not None
