"""/v1/messages and /v1/messages/count_tokens through the ASGI app on a scripted engine: Anthropic's
shapes, events and errors on every path, the prompt the engine gets, and what reaches it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pydantic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message as SdkMessage
from anthropic.types import RawMessageStreamEvent

from deploy.families import build_family_model
from tests.api.conftest import MakeClient
from tests.support.anthropic_errors import assert_error
from tests.support.waiting import wait_until

EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL = 'Let me check.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
BILLING = "x-anthropic-billing-header: cc_version=2.1.{}; cc_entrypoint=cli; cch=00000;"


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "max_tokens": 64, "messages": USER, **fields}


def events_of(text: str) -> list[dict[str, Any]]:
    out = []
    for chunk in text.split("\n\n"):
        if chunk.strip():
            name, data = chunk.split("\n")
            event = json.loads(data.removeprefix("data: "))
            assert name == f"event: {event['type']}"
            out.append(event)
    return out


def accumulate(events: list[dict[str, Any]]) -> SdkMessage:
    snapshot = None
    bufs: dict[int, bytes] = {}
    for event in events:
        if event["type"] != "ping":
            snapshot = accumulate_event(
                event=EVENT.validate_python(event), current_snapshot=snapshot, json_bufs=bufs
            )
    assert snapshot is not None
    return SdkMessage.model_validate(snapshot.model_dump())


async def test_a_text_message_has_anthropics_shape_and_usage(make_client: MakeClient) -> None:
    client, engine = await make_client(reply=lambda req, i: "Sunny and warm.")
    r = await client.post(
        "/v1/messages?beta=true",
        json=body(metadata={"user_id": '{"device_id": "d"}'}),
        headers={
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "claude-code-20250219,effort-2025-11-24",
        },
    )
    assert r.status_code == 200, r.text
    message = SdkMessage.model_validate(r.json())
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert [b.model_dump(exclude_none=True) for b in message.content] == [
        {"type": "text", "text": "Sunny and warm."}
    ]
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    prompt_ids = engine.tokenizer.encode(engine.requests[0].prompt_text, add_special_tokens=False)
    assert message.usage.input_tokens == len(prompt_ids)
    assert message.usage.output_tokens > 0
    # The fake engine reports no KV cache reuse: the cache counts are null, not 0.
    assert message.usage.cache_read_input_tokens is None


async def test_streamed_events_accumulate_to_the_non_streamed_message(make_client: MakeClient) -> None:
    client, _ = await make_client(model={"tool_parser": "hermes"}, reply=lambda req, i: CALL)
    whole = (await client.post("/v1/messages", json=body(tools=[WEATHER], temperature=0))).json()
    r = await client.post("/v1/messages", json=body(tools=[WEATHER], temperature=0, stream=True))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = events_of(r.text)
    deltas = [sum(e["type"] == "content_block_delta" and e["index"] == i for e in events) for i in (0, 1)]
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * deltas[0],
        "content_block_stop",
        "content_block_start",
        *["content_block_delta"] * deltas[1],
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    # The tool input streams as the model writes it, not in one piece at the end.
    assert deltas[1] > 1
    assert all(
        e["delta"]["type"] == "input_json_delta" for e in events if e.get("index") == 1 and "delta" in e
    )
    streamed = accumulate(events).model_dump()
    assert streamed["content"][1]["input"] == {"city": "Paris"}
    assert streamed["content"][1]["id"].startswith("toolu_")
    whole = SdkMessage.model_validate(whole).model_dump()
    for message in (streamed, whole):
        # Ids are made per response; everything else must be equal.
        message["id"] = "msg"
        message["content"][1]["id"] = "toolu"
    assert streamed == whole
    assert whole["stop_reason"] == "tool_use"


async def test_a_tool_result_round_trip_renders_the_call_and_its_result(make_client: MakeClient) -> None:
    client, engine = await make_client(model={"tool_parser": "hermes"}, reply=lambda req, i: "It is sunny.")
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "22C, sunny"}],
        },
    ]
    r = await client.post("/v1/messages", json=body(messages=messages, tools=[WEATHER]))
    assert r.status_code == 200, r.text
    prompt = engine.requests[0].prompt_text
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in prompt
    assert "<|im_start|>tool\n22C, sunny<|eot|>" in prompt
    assert r.json()["content"] == [{"type": "text", "text": "It is sunny."}]


async def test_stop_sequences_end_with_stop_sequence_named_and_cancel_the_engine(
    make_client: MakeClient,
) -> None:
    client, engine = await make_client(reply=lambda req, i: "one two three four")
    whole = (await client.post("/v1/messages", json=body(stop_sequences=["three"]))).json()
    assert whole["stop_reason"] == "stop_sequence" and whole["stop_sequence"] == "three"
    assert engine.cancelled == [engine.requests[0].request_id]
    assert whole["content"] == [{"type": "text", "text": "one two "}]
    r = await client.post("/v1/messages", json=body(stop_sequences=["three"], stream=True))
    events = events_of(r.text)
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "three"}
    assert accumulate(events).content[0].text == "one two "  # type: ignore[union-attr]


async def test_max_tokens_beyond_the_context_is_clamped_and_ends_with_max_tokens(
    make_client: MakeClient,
) -> None:
    client, engine = await make_client(model={"max_model_len": 64}, reply=lambda req, i: "word " * 100)
    r = await client.post("/v1/messages", json=body(max_tokens=32000))
    assert r.status_code == 200, r.text
    message = r.json()
    assert message["stop_reason"] == "max_tokens"
    assert message["usage"]["input_tokens"] + message["usage"]["output_tokens"] == 64
    assert engine.requests[0].params.max_tokens == 64 - message["usage"]["input_tokens"]
    r = await client.post(
        "/v1/messages", json=body(max_tokens=32000, messages=[{"role": "user", "content": "x " * 100}])
    )
    assert_error(r, 400, "invalid_request_error", message="maximum context length")


async def test_the_models_default_output_limit_does_not_cut_a_request_that_sets_max_tokens(
    make_client: MakeClient,
) -> None:
    # max_tokens is required on this API, so a model's default limit (for requests that set none)
    # never applies: a reply that ends by itself ends its turn (end_turn), as Claude Code needs.
    client, engine = await make_client(
        model={"max_model_len": 4096, "default_max_tokens": 8}, reply=lambda req, i: "word " * 20
    )
    r = await client.post("/v1/messages", json=body(max_tokens=32000))
    assert r.status_code == 200, r.text
    message = r.json()
    assert message["stop_reason"] == "end_turn" and message["usage"]["output_tokens"] > 8, message
    assert engine.requests[0].params.max_tokens == 4096 - message["usage"]["input_tokens"]
    await client.post("/v1/messages", json=body(max_tokens=100))
    assert engine.requests[1].params.max_tokens == 100


async def test_the_billing_header_block_does_not_change_the_prompt(make_client: MakeClient) -> None:
    client, engine = await make_client()
    for version in ("3.abc", "4.def"):
        system = [
            {"type": "text", "text": BILLING.format(version)},
            {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
        ]
        assert (await client.post("/v1/messages", json=body(system=system))).status_code == 200
    first, second = (req.prompt_text for req in engine.requests)
    assert first == second
    assert "billing" not in first and first.startswith("<|im_start|>system\nYou are a coding agent.")


async def test_count_tokens_equals_the_input_tokens_of_the_same_request(make_client: MakeClient) -> None:
    client, _ = await make_client(model={"tool_parser": "hermes"})
    fields = {"system": "Be brief.", "tools": [WEATHER]}
    counted = await client.post(
        "/v1/messages/count_tokens", json={"model": "tiny", "messages": USER, **fields}
    )
    assert counted.status_code == 200, counted.text
    created = (await client.post("/v1/messages", json=body(**fields))).json()
    assert counted.json() == {"input_tokens": created["usage"]["input_tokens"]}


async def test_reasoning_controls_reach_the_chat_template(make_client: MakeClient, tmp_path: Path) -> None:
    template = tmp_path / "t.jinja"
    template.write_text(
        "{{ 'think=' ~ (enable_thinking if enable_thinking is defined else 'default') }}"
        "{{ ' effort=' ~ (reasoning_effort if reasoning_effort is defined else 'default') }}"
        "{% for m in messages %}|{{ m.role }}:{{ m.content }}{% endfor %}"
    )
    client, engine = await make_client(model={"chat_template": template})
    cases = [
        ({}, "think=default effort=default"),
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}, "think=True effort=high"),
        ({"thinking": {"type": "disabled"}}, "think=False effort=default"),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 2048},
            "think=True effort=default",
        ),
    ]
    for fields, expected in cases:
        assert (await client.post("/v1/messages", json=body(**fields))).status_code == 200
        assert engine.requests[-1].prompt_text.startswith(expected)


async def test_sampling_fields_older_clients_send_reach_the_engine(make_client: MakeClient) -> None:
    client, engine = await make_client()
    await client.post("/v1/messages", json=body(temperature=0.3, top_p=0.8, top_k=7, ignore_eos=True))
    await client.post("/v1/messages", json=body())
    given, default = (req.params for req in engine.requests)
    assert (given.temperature, given.top_p, given.top_k, given.ignore_eos) == (0.3, 0.8, 7, True)
    assert (default.temperature, default.top_p, default.top_k, default.ignore_eos) == (
        None,
        None,
        None,
        False,
    )


async def test_an_output_format_is_a_json_schema_guide(make_client: MakeClient) -> None:
    client, engine = await make_client(reply=lambda req, i: '{"answer": 42}')
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}}
    r = await client.post(
        "/v1/messages", json=body(output_config={"format": {"type": "json_schema", "schema": schema}})
    )
    assert r.status_code == 200, r.text
    assert engine.requests[0].guide == ("json_schema", json.dumps(schema))


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"model": "tiny", "messages": USER}, "max_tokens: Field required"),
        (body(max_tokens="lots"), "max_tokens: Input should be a valid integer"),
        (body(messages=[{"role": "user", "content": [{"type": "video"}]}]), "Input tag 'video'"),
        (
            body(
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}],
                    }
                ]
            ),
            "content parts of type `image` are not supported by this model",
        ),
        (
            body(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]),
            "messages.0.content.0.image.source",
        ),
        (
            body(messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}]),
            "`document` content",
        ),
        (
            body(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9"}]}]),
            "unexpected `tool_use_id`",
        ),
        (body(messages="hello"), "messages: Input should be a valid array"),
        (body(system=5), "system"),
        (body(stop_sequences="x"), "stop_sequences"),
        (body(tools=[{"name": "x"}]), "tools.0.input_schema: Field required"),
        (body(tool_choice={"type": "any"}), "tool_choice"),
        (body(thinking={"type": "enabled", "budget_tokens": 10}), "thinking.budget_tokens"),
    ],
)
async def test_bad_input_is_an_anthropic_400(make_client: MakeClient, payload: dict, message: str) -> None:
    client, engine = await make_client()
    assert_error(
        await client.post("/v1/messages", json=payload), 400, "invalid_request_error", message=message
    )
    assert engine.requests == []


async def test_malformed_json_and_wrong_content_type_are_anthropic_400s(make_client: MakeClient) -> None:
    client, _ = await make_client()
    r = await client.post("/v1/messages", content=b"{not json", headers={"content-type": "application/json"})
    assert_error(r, 400, "invalid_request_error")
    r = await client.post(
        "/v1/messages", content=json.dumps(body()).encode(), headers={"content-type": "text/plain"}
    )
    assert_error(r, 400, "invalid_request_error")
    assert_error(
        await client.post("/v1/messages/count_tokens", json={"model": "tiny"}), 400, "invalid_request_error"
    )


async def test_unknown_model_is_not_found_error(make_client: MakeClient) -> None:
    client, _ = await make_client()
    r = await client.post("/v1/messages", json=body(model="claude-opus"))
    assert_error(r, 404, "not_found_error", message="This server serves `tiny`.")
    r = await client.post("/v1/messages/count_tokens", json={"model": "nope", "messages": USER})
    assert_error(r, 404, "not_found_error")


async def test_other_methods_and_sub_paths_answer_in_anthropics_shape(make_client: MakeClient) -> None:
    client, _ = await make_client()
    assert_error(await client.get("/v1/messages"), 405, "invalid_request_error")
    assert_error(await client.post("/v1/messages/batches", json={}), 404, "not_found_error")


async def test_an_engine_that_is_not_ready_is_overloaded_error_529(make_client: MakeClient) -> None:
    client, engine = await make_client()
    engine.ready = False
    assert_error(await client.post("/v1/messages", json=body()), 529, "overloaded_error")


async def test_an_engine_failure_is_api_error_whole_and_an_error_event_streamed(
    make_client: MakeClient,
) -> None:
    client, _ = await make_client(fail_after=2)
    assert_error(await client.post("/v1/messages", json=body()), 500, "api_error")
    r = await client.post("/v1/messages", json=body(stream=True))
    events = events_of(r.text)
    assert events[0]["type"] == "message_start"
    assert events[-1] == {
        "type": "error",
        "error": {"type": "api_error", "message": "scripted engine failure"},
    }
    assert "message_stop" not in [e["type"] for e in events]


async def test_x_api_key_and_bearer_use_the_same_keys_and_refusals_are_anthropic_shaped(
    make_client: MakeClient,
) -> None:
    client, engine = await make_client(settings={"api_keys": ["k-one"]})
    for headers in ({}, {"x-api-key": "nope"}, {"Authorization": "Bearer nope"}):
        assert_error(
            await client.post("/v1/messages", json=body(), headers=headers), 401, "authentication_error"
        )
    assert engine.requests == []
    for headers in ({"x-api-key": "k-one"}, {"Authorization": "Bearer k-one"}):
        assert (await client.post("/v1/messages", json=body(), headers=headers)).status_code == 200
    # The same key store serves the OpenAI routes, which keep their own error shape.
    r = await client.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": USER}, headers={"x-api-key": "k-one"}
    )
    assert r.status_code == 200
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER})
    assert r.status_code == 401 and set(r.json()) == {"error"}


async def test_too_many_requests_in_flight_is_rate_limit_error_with_retry_after(
    make_client: MakeClient,
) -> None:
    gate = asyncio.Event()
    client, engine = await make_client(
        settings={"max_concurrent_requests": 1, "max_queued_requests": 0, "queue_timeout_s": 5}, gate=gate
    )
    first = asyncio.create_task(client.post("/v1/messages", json=body(max_tokens=3)))
    await wait_until(lambda: bool(engine.active))
    r = await client.post("/v1/messages", json=body())
    assert_error(r, 429, "rate_limit_error")
    assert int(r.headers["retry-after"]) >= 1
    gate.set()
    assert (await first).status_code == 200


async def test_an_oversize_body_is_request_too_large(make_client: MakeClient) -> None:
    client, _ = await make_client(settings={"max_body_bytes": 2048})
    r = await client.post("/v1/messages", json=body(messages=[{"role": "user", "content": "x" * 5000}]))
    assert_error(r, 413, "request_too_large")


async def test_a_deadline_is_timeout_error_and_cancels_the_engine(make_client: MakeClient) -> None:
    client, engine = await make_client(settings={"request_timeout_s": 0.05}, gate=asyncio.Event())
    assert_error(await client.post("/v1/messages", json=body()), 504, "timeout_error")
    await wait_until(lambda: engine.cancelled == [engine.requests[0].request_id])
    r = await client.post("/v1/messages", json=body(stream=True))
    assert events_of(r.text)[-1]["error"]["type"] == "timeout_error"
    await wait_until(lambda: len(engine.cancelled) == 2)


async def test_a_claude_code_shaped_request_streams_to_message_stop(make_client: MakeClient) -> None:
    from tests.support import claude_code_request as cc

    client, engine = await make_client(model={"tool_parser": "hermes", "max_model_len": 65536})
    r = await client.post(cc.PATH, json=cc.request(), headers=cc.HEADERS)
    assert r.status_code == 200, r.text
    # Accepted, not used, and said so.
    assert set(r.headers["x-gateway-ignored-fields"].split(", ")) == {"context_management"}
    events = events_of(r.text)
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    message = accumulate(events)
    assert message.stop_reason == "end_turn" and message.content[0].type == "text"
    # Every tool reaches the template; the mid-conversation system turn stays where it was.
    prompt = engine.requests[0].prompt_text
    assert prompt.count('{"type": "function", "function": {"name": ') == len(cc.tools())
    assert prompt.index("Say hello") < prompt.index("<|im_start|>system\n# Environment")
    # The billing header changes with every Claude Code version; the prompt does not.
    await client.post(cc.PATH, json=cc.request(version="2.1.400.zzz"), headers=cc.HEADERS)
    assert engine.requests[1].prompt_text == prompt


async def test_a_claude_code_shaped_request_on_a_small_context_ends_with_max_tokens(
    make_client: MakeClient,
) -> None:
    from tests.support import claude_code_request as cc

    counter, _ = await make_client(model={"tool_parser": "hermes"})
    fields = {k: v for k, v in cc.request().items() if k not in ("max_tokens", "stream", "metadata")}
    prompt_tokens = (await counter.post("/v1/messages/count_tokens", json=fields)).json()["input_tokens"]
    client, engine = await make_client(
        model={"tool_parser": "hermes", "max_model_len": prompt_tokens + 20},
        reply=lambda req, i: "word " * 500,
    )
    r = await client.post(cc.PATH, json=cc.request(), headers=cc.HEADERS)
    message = accumulate(events_of(r.text))
    assert engine.requests[0].params.max_tokens == 20
    assert message.stop_reason == "max_tokens"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (prompt_tokens, 20)


async def test_a_reasoning_model_answers_with_a_thinking_block(make_client: MakeClient) -> None:
    client, _ = await make_client(
        model={"reasoning_parser": "deepseek_r1"},
        reply=lambda req, i: "<think>Let me see.</think>It is sunny.",
    )
    whole = (await client.post("/v1/messages", json=body(thinking={"type": "adaptive"}))).json()
    assert whole["content"] == [
        {"type": "thinking", "thinking": "Let me see.", "signature": ""},
        {"type": "text", "text": "It is sunny."},
    ]
    r = await client.post("/v1/messages", json=body(thinking={"type": "adaptive"}, stream=True))
    events = events_of(r.text)
    assert next(e["delta"]["type"] for e in events if e["type"] == "content_block_delta") == "thinking_delta"
    streamed = accumulate(events).model_dump()
    assert streamed["content"] == SdkMessage.model_validate(whole).model_dump()["content"]
    omitted = (
        await client.post("/v1/messages", json=body(thinking={"type": "adaptive", "display": "omitted"}))
    ).json()
    assert omitted["content"] == [{"type": "text", "text": "It is sunny."}]


async def test_consecutive_user_turns_are_one_turn_as_anthropic_combines_them(
    make_client: MakeClient,
) -> None:
    # Gemma 3's template refuses roles that do not alternate; Claude Code sends user turns in a row.
    client, engine = await make_client(tokenizer_dir=build_family_model("gemma3"))
    turns = [
        {"role": "user", "content": "<system-reminder>be brief</system-reminder>"},
        {"role": "user", "content": [{"type": "text", "text": "Hello"}]},
        {"role": "assistant", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "there"}]},
        {"role": "user", "content": "Bye"},
    ]
    r = await client.post("/v1/messages", json={"model": "tiny", "max_tokens": 4, "messages": turns})
    assert r.status_code == 200, r.text
    prompt = engine.requests[0].prompt_text
    assert "<system-reminder>be brief</system-reminder>\n\nHello<end_of_turn>" in prompt
    assert "Hi\n\nthere<end_of_turn>" in prompt
    assert prompt.count("<start_of_turn>user") == 2
