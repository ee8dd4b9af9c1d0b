"""Structured output and tool calls through the ASGI app, on a scripted engine."""

from __future__ import annotations

import json

import httpx
import pydantic
import pytest

from tests.api.conftest import MakeClient
from tests.api.test_chat_api import chunks_of
from tests.api.test_errors_api import assert_error
from tests.support.anthropic_errors import assert_error as assert_anthropic_error
from tests.support.openai_schema import validate

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL_JSON = json.dumps([{"name": "get_weather", "arguments": {"city": "Paris"}}])


async def test_json_schema_response_format_reaches_the_engine_as_a_guide(make_client: MakeClient) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    client, engine = await make_client(reply=lambda req, i: '{"answer": 42}')
    body = {
        "model": "tiny",
        "messages": USER,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "a", "schema": schema, "strict": True},
        },
    }
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert json.loads(r.json()["choices"][0]["message"]["content"]) == {"answer": 42}
    assert engine.requests[0].guide == ("json_schema", json.dumps(schema))
    r = await client.post("/v1/chat/completions", json={**body, "response_format": {"type": "json_object"}})
    assert engine.requests[1].guide == ("json", "")


async def test_structured_outputs_reach_the_engine_as_a_guide_on_chat_responses_and_messages(
    make_client: MakeClient,
) -> None:
    client, engine = await make_client(reply=lambda req, i: "yes")
    spec = {"regex": "yes|no"}
    r = await client.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": USER, "structured_outputs": spec}
    )
    assert r.status_code == 200, r.text
    r = await client.post("/v1/responses", json={"model": "tiny", "input": USER, "structured_outputs": spec})
    assert r.status_code == 200, r.text
    messages = {"model": "tiny", "max_tokens": 8, "messages": USER, "structured_outputs": spec}
    r = await client.post("/v1/messages", json=messages)
    assert r.status_code == 200, r.text
    assert r.json()["content"] == [{"type": "text", "text": "yes"}]
    # A field the Messages API takes, not one it ignores.
    assert "x-gateway-ignored-fields" not in r.headers
    assert [req.guide for req in engine.requests] == [("regex", "yes|no")] * 3
    r = await client.post("/v1/messages", json={**messages, "structured_outputs": {"regex": ""}})
    assert_anthropic_error(r, 400, "invalid_request_error", message="structured_outputs.regex")
    r = await client.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": USER, "structured_outputs": {"regex": ""}}
    )
    assert_error(r, 400, param="structured_outputs.regex")


async def test_response_format_on_a_model_without_guided_decoding_is_400(make_client: MakeClient) -> None:
    client, engine = await make_client(guided=False)
    r = await client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": USER, "response_format": {"type": "json_object"}},
    )
    assert_error(r, 400, param="response_format")
    assert engine.requests == []


async def test_the_sdk_parse_helper_returns_a_parsed_object(make_client: MakeClient) -> None:
    import openai

    class Weather(pydantic.BaseModel):
        city: str
        celsius: int

    client, engine = await make_client(reply=lambda req, i: '{"city": "Paris", "celsius": 21}')
    sdk = openai.AsyncOpenAI(
        base_url="http://gateway.test/v1",
        api_key="k",
        http_client=httpx.AsyncClient(transport=client._transport),
    )
    async with sdk:
        out = await sdk.chat.completions.parse(model="tiny", messages=USER, response_format=Weather)  # type: ignore[arg-type]
    assert out.choices[0].message.parsed == Weather(city="Paris", celsius=21)
    guide_type, guide = engine.requests[0].guide  # type: ignore[misc]
    assert guide_type == "json_schema" and json.loads(guide)["properties"]["celsius"]["type"] == "integer"


async def test_required_tool_choice_is_forced_by_a_schema_and_returns_tool_calls(
    make_client: MakeClient,
) -> None:
    client, engine = await make_client(reply=lambda req, i: CALL_JSON)
    body = {"model": "tiny", "messages": USER, "tools": [WEATHER], "tool_choice": "required"}
    r = await client.post("/v1/chat/completions", json=body)
    out = r.json()
    validate("CreateChatCompletionResponse", out)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city":"Paris"}'}
    guide_type, guide = engine.requests[0].guide  # type: ignore[misc]
    assert guide_type == "json_schema"
    assert json.loads(guide)["items"]["properties"]["name"]["enum"] == ["get_weather"]
    # The tools reached the chat template.
    assert "get_weather" in engine.requests[0].prompt_text


async def test_streamed_tool_calls_arrive_as_openai_deltas(make_client: MakeClient) -> None:
    client, _ = await make_client(reply=lambda req, i: CALL_JSON)
    body = {"model": "tiny", "messages": USER, "tools": [WEATHER], "tool_choice": "required", "stream": True}
    r = await client.post("/v1/chat/completions", json=body)
    chunks = chunks_of(r.text)
    for chunk in chunks:
        validate("CreateChatCompletionStreamResponse", chunk)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["index"] == 0
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"city": "Paris"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert not any(d.get("content") for d in deltas)


async def test_auto_tool_choice_parses_the_models_own_format(make_client: MakeClient) -> None:
    reply = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    client, engine = await make_client(model={"tool_parser": "hermes"}, reply=lambda req, i: reply)
    r = await client.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": USER, "tools": [WEATHER]}
    )
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == "Let me check."
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert choice["finish_reason"] == "tool_calls"
    assert engine.requests[0].guide is None


async def test_a_plain_answer_with_tools_offered_is_content(make_client: MakeClient) -> None:
    client, _ = await make_client(model={"tool_parser": "hermes"}, reply=lambda req, i: "It is sunny.")
    r = await client.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": USER, "tools": [WEATHER]}
    )
    choice = r.json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "It is sunny.", "refusal": None}
    assert choice["finish_reason"] == "stop"


async def test_tool_results_and_assistant_calls_are_rendered_for_the_model(make_client: MakeClient) -> None:
    client, engine = await make_client(
        model={"tool_parser": "hermes"}, reply=lambda req, i: "It is 21 degrees."
    )
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C and sunny"},
    ]
    r = await client.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": messages, "tools": [WEATHER]}
    )
    assert r.status_code == 200, r.text
    assert "21 C and sunny" in engine.requests[0].prompt_text


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [WEATHER]}, "tools"),  # no parser configured, not forced
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
async def test_bad_tool_requests_are_400_naming_the_param(
    make_client: MakeClient, extra: dict, param: str
) -> None:
    client, engine = await make_client()
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER, **extra})
    assert_error(r, 400, param=param)
    assert engine.requests == []
