"""Tool-call arguments streamed as the model writes them, and a call cut by the token limit, on
each API (chat completions, Responses, Messages) through the ASGI app on a scripted engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from anthropic.types import Message as SdkMessage

from gateway.text.tokenizer import Tokenizer
from tests.api.conftest import MakeClient
from tests.api.test_chat_api import chunks_of
from tests.api.test_messages_api import accumulate, events_of
from tests.api.test_responses_api import sse_events
from tests.support.openai_schema import validate

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "note": {"type": "string"}},
    "required": ["city"],
}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "parameters": PARAMETERS}
MESSAGES_TOOL = {"name": "get_weather", "input_schema": PARAMETERS}
REPLY = (
    "Let me check.<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "note": "bring an umbrella, just in case"}}'
    "\n</tool_call>"
)
ARGUMENTS = '{"city":"Paris","note":"bring an umbrella, just in case"}'
HERMES = {"tool_parser": "hermes"}


def cut_inside_the_note(tokenizer: Tokenizer) -> int:
    """A token limit that ends the reply inside the "note" argument."""
    ids = tokenizer.encode(REPLY, add_special_tokens=False)
    return next(k for k in range(len(ids)) if '"note": "bring' in tokenizer.decode(ids[:k]))


def assert_cut(arguments: str) -> None:
    assert arguments.startswith('{"city":"Paris","note":"bring')
    assert ARGUMENTS.startswith(arguments) and arguments != ARGUMENTS


@pytest.fixture
def state(tmp_path: Path) -> dict[str, Any]:
    return {"state_dir": tmp_path / "state"}


# ---------------------------------------------------------------- chat completions


def chat_calls(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        call
        for chunk in chunks
        for choice in chunk["choices"]
        for call in choice["delta"].get("tool_calls", ())
    ]


async def test_chat_streams_the_name_first_then_the_arguments_as_they_are_written(
    make_client: MakeClient,
) -> None:
    client, _ = await make_client(model=HERMES, reply=lambda req, i: REPLY)
    body = {"model": "tiny", "messages": USER, "tools": [CHAT_TOOL], "temperature": 0}
    whole = (await client.post("/v1/chat/completions", json=body)).json()
    (call,) = whole["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": ARGUMENTS}

    chunks = chunks_of((await client.post("/v1/chat/completions", json={**body, "stream": True})).text)
    for chunk in chunks:
        validate("CreateChatCompletionStreamResponse", chunk)
    first, *rest = chat_calls(chunks)
    assert first["index"] == 0 and first["id"].startswith("call_") and first["type"] == "function"
    assert first["function"] == {"name": "get_weather", "arguments": ""}
    # OpenAI's shape: the later deltas carry only the index and more of the arguments.
    assert all(set(c) == {"index", "function"} and set(c["function"]) == {"arguments"} for c in rest)
    assert len(rest) > 1
    assert "".join(c["function"]["arguments"] for c in rest) == call["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_chat_a_call_cut_by_max_tokens_is_a_tool_call_with_finish_reason_length(
    make_client: MakeClient,
) -> None:
    client, engine = await make_client(model=HERMES, reply=lambda req, i: REPLY)
    limit = cut_inside_the_note(engine.tokenizer)
    body = {"model": "tiny", "messages": USER, "tools": [CHAT_TOOL], "max_tokens": limit}
    whole = (await client.post("/v1/chat/completions", json=body)).json()
    validate("CreateChatCompletionResponse", whole)
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] == "Let me check."
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert_cut(call["function"]["arguments"])

    chunks = chunks_of((await client.post("/v1/chat/completions", json={**body, "stream": True})).text)
    calls = chat_calls(chunks)
    assert calls[0]["function"]["name"] == "get_weather"
    assert "".join(c["function"]["arguments"] for c in calls) == call["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


# ---------------------------------------------------------------- Responses


async def test_responses_stream_arguments_in_deltas_and_a_cut_call_is_an_incomplete_item(
    make_client: MakeClient, state: dict[str, Any]
) -> None:
    client, engine = await make_client(settings=state, model=HERMES, reply=lambda req, i: REPLY)
    body = {"model": "tiny", "input": "Weather in Paris?", "tools": [RESPONSES_TOOL], "temperature": 0}
    events = sse_events((await client.post("/v1/responses", json={**body, "stream": True})).text)
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) > 1 and "".join(deltas) == ARGUMENTS
    added = next(e for e in events if e["type"] == "response.output_item.added" and e["output_index"] == 1)
    assert added["item"]["name"] == "get_weather" and added["item"]["arguments"] == ""
    # The item is announced before its arguments, which come before their .done.
    types = [e["type"] for e in events]
    assert types.index("response.function_call_arguments.delta") > events.index(added)
    assert types.index("response.function_call_arguments.done") > max(
        i for i, t in enumerate(types) if t == "response.function_call_arguments.delta"
    )

    limit = cut_inside_the_note(engine.tokenizer)
    whole = (await client.post("/v1/responses", json={**body, "max_output_tokens": limit})).json()
    validate("Response", whole)
    assert whole["status"] == "incomplete"
    assert whole["incomplete_details"] == {"reason": "max_output_tokens"}
    message, call = whole["output"]
    assert message["type"] == "message" and message["status"] == "completed"
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert call["status"] == "incomplete"
    assert_cut(call["arguments"])

    events = sse_events(
        (await client.post("/v1/responses", json={**body, "max_output_tokens": limit, "stream": True})).text
    )
    streamed = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert streamed == call["arguments"]
    done = next(e for e in events if e["type"] == "response.output_item.done" and e["output_index"] == 1)
    assert done["item"]["status"] == "incomplete" and done["item"]["arguments"] == streamed
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


# ---------------------------------------------------------------- Messages


async def test_messages_stream_input_json_in_deltas_and_a_cut_call_stops_for_max_tokens(
    make_client: MakeClient,
) -> None:
    client, engine = await make_client(model=HERMES, reply=lambda req, i: REPLY)
    limit = cut_inside_the_note(engine.tokenizer)
    body = {"model": "tiny", "max_tokens": limit, "messages": USER, "tools": [MESSAGES_TOOL]}
    whole = (await client.post("/v1/messages", json=body)).json()
    assert whole["stop_reason"] == "max_tokens"
    text, tool_use = whole["content"]
    assert text == {"type": "text", "text": "Let me check."}
    assert tool_use["type"] == "tool_use" and tool_use["name"] == "get_weather"
    # The input as far as it parsed: the cut "note" string is left out, as the SDK reads it.
    assert tool_use["input"] == {"city": "Paris"}

    events = events_of((await client.post("/v1/messages", json={**body, "stream": True})).text)
    partial = [e["delta"]["partial_json"] for e in events if e.get("index") == 1 and "delta" in e]
    assert len(partial) > 1
    assert_cut("".join(partial))
    assert [e["type"] for e in events][-4:] == [
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    streamed = accumulate(events).model_dump()
    parsed = SdkMessage.model_validate(whole).model_dump()
    for message in (streamed, parsed):
        # Ids are made per response; everything else must be equal.
        message["id"] = "msg"
        message["content"][1]["id"] = "toolu"
    assert streamed == parsed
