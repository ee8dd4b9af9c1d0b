"""/v1/responses on the ASGI app with a scripted engine: whole and streamed responses, tools,
stored responses, sealed reasoning, errors in OpenAI's shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import MakeClient
from tests.support.openai_schema import validate

REPLY = "Hello there! 你好 🎉 how are you today?"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}
CALL = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture
def state(tmp_path: Path) -> dict[str, Any]:
    return {"state_dir": tmp_path / "state"}


def sse_events(text: str) -> list[dict[str, Any]]:
    out = []
    for block in text.split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        event = next(line[len("event: ") :] for line in lines if line.startswith("event: "))
        data = json.loads(next(line[len("data: ") :] for line in lines if line.startswith("data: ")))
        assert data["type"] == event
        validate("ResponseStreamEvent", data)
        out.append(data)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


async def create(client: httpx.AsyncClient, **body: Any) -> httpx.Response:
    body.setdefault("model", "tiny")
    return await client.post("/v1/responses", json=body)


def output_text(response: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )


async def test_string_input_gives_a_completed_response_valid_against_the_schema(
    make_client: MakeClient, state: dict[str, Any]
) -> None:
    client, engine = await make_client(settings=state)
    r = await create(client, input="Hi", instructions="Be brief", metadata={"k": "v"}, temperature=0)
    assert r.status_code == 200, r.text
    body = r.json()
    validate("Response", body)
    assert body["object"] == "response" and body["status"] == "completed"
    assert output_text(body) == REPLY
    assert body["instructions"] == "Be brief" and body["metadata"] == {"k": "v"}
    usage = body["usage"]
    assert usage["output_tokens"] == len(engine.tokenizer.encode(REPLY, add_special_tokens=False))
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["output_tokens_details"] == {"reasoning_tokens": 0}
    prompt = engine.requests[-1].prompt_text
    assert "Be brief" in prompt and "Hi" in prompt


async def test_streamed_text_equals_the_whole_text(make_client: MakeClient, state: dict[str, Any]) -> None:
    client, _ = await make_client(settings=state)
    whole = (await create(client, input="Hi", temperature=0)).json()
    r = await create(client, input="Hi", temperature=0, stream=True)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert [e["type"] for e in events][:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert events[-1]["type"] == "response.completed"
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == output_text(whole) == output_text(events[-1]["response"])
    validate("Response", events[-1]["response"])


async def test_a_reply_cut_by_max_output_tokens_is_incomplete(
    make_client: MakeClient, state: dict[str, Any]
) -> None:
    client, _ = await make_client(settings=state, reply=lambda req, i: "word " * 40)
    body = (await create(client, input="Hi", max_output_tokens=16)).json()
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["usage"]["output_tokens"] == 16
    validate("Response", body)


async def test_the_model_default_output_limit_applies_when_none_is_set(
    make_client: MakeClient, state: dict[str, Any]
) -> None:
    client, engine = await make_client(
        settings=state, model={"default_max_tokens": 5}, reply=lambda req, i: "word " * 40
    )
    body = (await create(client, input="Hi")).json()
    assert engine.requests[-1].params.max_tokens == 5
    assert body["status"] == "incomplete" and body["usage"]["output_tokens"] == 5
    # A client's own limit wins.
    await create(client, input="Hi", max_output_tokens=20)
    assert engine.requests[-1].params.max_tokens == 20
    # Chat completions share the default.
    await client.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
    )
    assert engine.requests[-1].params.max_tokens == 5


async def test_function_call_whole_and_streamed_and_its_output_round_trip(
    make_client: MakeClient, state: dict[str, Any]
) -> None:
    client, engine = await make_client(
        settings=state, model={"tool_parser": "hermes"}, reply=lambda r, i: CALL
    )
    whole = (await create(client, input="Weather in Paris?", tools=[WEATHER])).json()
    validate("Response", whole)
    _message, call = whole["output"]
    assert output_text(whole) == "Let me check."
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"} and call["call_id"].startswith("call_")
    assert whole["tools"][0]["name"] == "get_weather"

    events = sse_events((await create(client, input="Weather in Paris?", tools=[WEATHER], stream=True)).text)
    streamed = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert streamed == call["arguments"]
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert done["name"] == "get_weather" and done["arguments"] == streamed

    follow = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "type": "function_call",
            "call_id": call["call_id"],
            "name": "get_weather",
            "arguments": call["arguments"],
        },
        {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny, 21 C"},
    ]
    r = await create(client, input=follow, tools=[WEATHER])
    assert r.status_code == 200, r.text
    prompt = engine.requests[-1].prompt_text
    assert "sunny, 21 C" in prompt and "get_weather" in prompt


async def test_namespace_tools_map_back_and_hosted_tools_are_left_out(
    make_client: MakeClient, state: dict[str, Any]
) -> None:
    reply = '<tool_call>\n{"name": "fs__read", "arguments": {"path": "a"}}\n</tool_call>'
    client, engine = await make_client(
        settings=state, model={"tool_parser": "hermes"}, reply=lambda r, i: reply
    )
    tools = [
        {
            "type": "namespace",
            "name": "fs",
            "description": "files",
            "tools": [{"type": "function", "name": "read"}],
        },
        {"type": "web_search"},
    ]
    body = (await create(client, input="read a", tools=tools)).json()
    (call,) = body["output"]
    assert (call["namespace"], call["name"]) == ("fs", "read")
    assert "web_search" not in engine.requests[-1].prompt_text
    metrics = (await client.get("/metrics")).text
    assert 'gateway_responses_skipped_tools_total{type="web_search"} 1.0' in metrics

    strict_client, _ = await make_client(
        settings={**state, "strict_tools": True}, model={"tool_parser": "hermes"}
    )
    r = await create(strict_client, input="x", tools=tools)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[1].type"


async def test_stored_responses_retrieve_delete_list_and_continue(
    make_client: MakeClient, state: dict[str, Any]
) -> None:
    client, engine = await make_client(settings=state)
    first = (await create(client, input=[{"role": "user", "content": "my name is Ada"}])).json()
    got = await client.get(f"/v1/responses/{first['id']}")
    assert got.status_code == 200 and got.json() == first
    second = (await create(client, input="what is my name?", previous_response_id=first["id"])).json()
    assert second["previous_response_id"] == first["id"]
    prompt = engine.requests[-1].prompt_text
    assert "my name is Ada" in prompt and REPLY in prompt and "what is my name?" in prompt

    # The second response's input: the first's input and output, then its own; newest first by default.
    items = (await client.get(f"/v1/responses/{second['id']}/input_items")).json()
    validate("ResponseItemList", items)
    texts = [i["content"][0]["text"] for i in items["data"]]
    assert texts == ["what is my name?", REPLY, "my name is Ada"]
    page1 = (await client.get(f"/v1/responses/{second['id']}/input_items?limit=2&order=asc")).json()
    assert [i["content"][0]["text"] for i in page1["data"]] == ["my name is Ada", REPLY] and page1["has_more"]
    page2 = (
        await client.get(
            f"/v1/responses/{second['id']}/input_items?limit=2&order=asc&after={page1['last_id']}"
        )
    ).json()
    assert [i["content"][0]["text"] for i in page2["data"]] == ["what is my name?"] and not page2["has_more"]

    deleted = await client.delete(f"/v1/responses/{first['id']}")
    assert deleted.json() == {"id": first["id"], "object": "response", "deleted": True}
    assert (await client.get(f"/v1/responses/{first['id']}")).status_code == 404
    assert (await client.delete(f"/v1/responses/{first['id']}")).status_code == 404


async def test_stored_responses_survive_a_restart(make_client: MakeClient, state: dict[str, Any]) -> None:
    client, _ = await make_client(settings=state)
    first = (await create(client, input="remember me")).json()
    again, _ = await make_client(settings=state)
    assert (await again.get(f"/v1/responses/{first['id']}")).json()["id"] == first["id"]


async def test_a_response_made_with_store_false_is_not_kept(
    make_client: MakeClient, state: dict[str, Any]
) -> None:
    client, _ = await make_client(settings=state)
    body = (await create(client, input="x", store=False)).json()
    assert body["store"] is False
    r = await client.get(f"/v1/responses/{body['id']}")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    r = await create(client, input="y", previous_response_id=body["id"])
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "previous_response_id"
    assert r.json()["error"]["code"] == "previous_response_not_found"


async def test_handed_back_reasoning_is_restored_and_a_forged_one_refused(
    make_client: MakeClient, state: dict[str, Any]
) -> None:
    client, engine = await make_client(settings=state)
    from gateway.apis.responses.sealing import ReasoningSealer, load_or_create_key

    # The app's key is made in the state directory on first use; the same key seals here.
    await create(client, input="warm up", include=["reasoning.encrypted_content"], store=False)
    sealer = ReasoningSealer(load_or_create_key(state["state_dir"]))
    sealed = sealer.seal("the hidden plan", model="tiny")
    items = [
        {"role": "user", "content": "q"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": sealed},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "q2"},
    ]
    r = await create(client, input=items, store=False)
    assert r.status_code == 200, r.text
    assert engine.requests[-1].prompt_text.count("q2") == 1
    forged = ReasoningSealer(bytes(32)).seal("evil", model="tiny")
    items[1]["encrypted_content"] = forged
    r = await create(client, input=items, store=False)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[1].encrypted_content"


async def test_a_codex_shaped_request_is_accepted(make_client: MakeClient, state: dict[str, Any]) -> None:
    client, _ = await make_client(settings=state, model={"tool_parser": "hermes"})
    body = {
        "model": "tiny",
        "instructions": "You are a coding agent.",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "rules " * 10}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "say hi"}]},
        ],
        "tools": [
            {
                "type": "function",
                "name": "shell",
                "description": "run",
                "strict": False,
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
            },
            {
                "type": "namespace",
                "name": "mcp_x",
                "description": "x",
                "tools": [
                    {"type": "function", "name": "fetch", "parameters": {"type": "object", "properties": {}}}
                ],
            },
            {"type": "web_search", "external_web_access": False},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "019a-session",
        "client_metadata": {"x-codex-turn": "1"},
        "service_tier": "auto",
        "text": {"verbosity": "low"},
        "some_future_field": {"anything": True},
    }
    # The spec's `input` items are a oneOf whose message variants overlap (its discriminator
    # decides, which JSON Schema cannot express): the rest of the body is checked here.
    skip = ("client_metadata", "some_future_field", "input")
    validate("CreateResponse", {k: v for k, v in body.items() if k not in skip})
    r = await client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    events = sse_events(r.text)
    assert events[-1]["type"] in ("response.completed", "response.incomplete")


async def test_input_tokens_counts_the_prompt(make_client: MakeClient, state: dict[str, Any]) -> None:
    client, _engine = await make_client(settings=state)
    r = await client.post(
        "/v1/responses/input_tokens", json={"model": "tiny", "input": "Hi", "instructions": "x"}
    )
    assert r.status_code == 200, r.text
    counted = r.json()
    validate("TokenCountsResource", counted)
    whole = (await create(client, input="Hi", instructions="x")).json()
    assert counted == {"object": "response.input_tokens", "input_tokens": whole["usage"]["input_tokens"]}


async def test_an_engine_failure_mid_stream_is_a_failed_response(
    make_client: MakeClient, state: dict[str, Any]
) -> None:
    client, _ = await make_client(settings=state, fail_after=3)
    events = sse_events((await create(client, input="Hi", stream=True)).text)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    validate("Response", events[-1]["response"])


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": [{"type": "mystery"}]}, 400, "input[0].type"),
        ({"input": [{"type": "computer_call_output", "call_id": "c", "output": {}}]}, 400, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            400,
            "input[0].content[0].image_url",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]},
            400,
            "input[0].content[0].file_id",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            400,
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "function_call", "name": "f"}]}, 400, "input[0].call_id"),
        ({"input": [{"role": "user", "content": 5}]}, 400, "input[0].content"),
        ({"input": "x", "tools": [{"type": "hyperdrive"}]}, 400, "tools[0].type"),
        ({"input": "x", "previous_response_id": "resp_missing"}, 400, "previous_response_id"),
        ({"input": "x", "max_output_tokens": 3}, 400, "max_output_tokens"),
        ({"input": "x", "temperature": 9}, 400, "temperature"),
        ({"input": "x", "include": ["bogus"]}, 400, "include[0]"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "x"}}}, 400, "text.format.schema"),
        ({"input": "x", "conversation": "conv_1"}, 400, "conversation"),
        ({"input": "x", "metadata": {f"k{i}": "v" for i in range(17)}}, 400, "metadata"),
        ({"input": "x", "metadata": {"k": "v" * 513}}, 400, "metadata"),
        ({"input": "x " * 5000}, 400, "input"),
        ({"input": []}, 400, "input"),
        ({"input": "x", "model": "nope"}, 404, "model"),
    ],
)
async def test_bad_input_is_an_openai_error_naming_the_param(
    make_client: MakeClient, state: dict[str, Any], body: dict[str, Any], status: int, param: str
) -> None:
    client, _ = await make_client(settings=state)
    r = await create(client, **body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert error["message"] and error["type"]


async def test_truncation_auto_drops_the_oldest_items(make_client: MakeClient, state: dict[str, Any]) -> None:
    client, engine = await make_client(settings=state)
    items = [{"role": "user", "content": f"old{i} " + "x " * 60} for i in range(12)]
    items.append({"role": "user", "content": "newest"})
    r = await create(client, input=items, truncation="auto", max_output_tokens=16)
    assert r.status_code == 200, r.text
    prompt = engine.requests[-1].prompt_text
    assert "newest" in prompt and "old0 " not in prompt
    assert r.json()["truncation"] == "auto"
    r = await create(client, input=items, max_output_tokens=16)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"


CODEX_REQUEST = Path(__file__).resolve().parents[1] / "data" / "codex_exec_request.json"


async def test_the_first_request_of_codex_exec_streams_a_valid_response(
    make_client: MakeClient, state: dict[str, Any]
) -> None:
    # Recorded from the Codex CLI 0.169 (`codex exec "say hi"`, paths and ids scrubbed): two developer
    # and two user messages (~20 KB), function tools, a namespace of functions, web_search,
    # store false, encrypted reasoning asked for, prompt_cache_key, client_metadata.
    body = json.loads(CODEX_REQUEST.read_text(encoding="utf-8"))
    assert {t["type"] for t in body["tools"]} == {"function", "namespace", "web_search"}
    client, engine = await make_client(
        settings=state, model={"tool_parser": "hermes", "max_model_len": 65536}
    )
    r = await client.post("/v1/responses", json={**body, "model": "tiny"})
    assert r.status_code == 200, r.text
    events = sse_events(r.text)
    assert events[-1]["type"] == "response.completed"
    assert output_text(events[-1]["response"]) == REPLY
    prompt = engine.requests[-1].prompt_text
    assert "You are a coding agent" in prompt and "say hi" in prompt
    assert "multi_agent_v1__close_agent" in prompt and "web_search" not in prompt


async def test_logprobs_come_with_the_text_when_included(
    make_client: MakeClient, state: dict[str, Any]
) -> None:
    client, _ = await make_client(settings=state)
    include = ["message.output_text.logprobs"]
    whole = (await create(client, input="Hi", include=include, top_logprobs=2)).json()
    validate("Response", whole)
    part = whole["output"][0]["content"][0]
    assert part["logprobs"] and all(len(e["top_logprobs"]) == 2 for e in part["logprobs"])
    assert len(part["logprobs"]) == whole["usage"]["output_tokens"]
    events = sse_events((await create(client, input="Hi", include=include, top_logprobs=2, stream=True)).text)
    streamed = [e for ev in events if ev["type"] == "response.output_text.delta" for e in ev["logprobs"]]
    assert streamed == part["logprobs"]
    plain = (await create(client, input="Hi")).json()
    assert plain["output"][0]["content"][0]["logprobs"] == []


async def test_a_cut_at_the_models_default_limit_can_end_as_completed(
    make_client: MakeClient, state: dict[str, Any]
) -> None:
    client, engine = await make_client(
        settings=state,
        model={"default_max_tokens": 16, "default_limit_status": "completed"},
        reply=lambda req, i: "word " * 40,
    )
    body = (await create(client, input="Hi")).json()
    assert engine.requests[-1].params.max_tokens == 16
    assert body["status"] == "completed" and body["incomplete_details"] is None
    events = sse_events((await create(client, input="Hi", stream=True)).text)
    assert events[-1]["type"] == "response.completed"
    # The client's own limit is still reported as the cut it is.
    body = (await create(client, input="Hi", max_output_tokens=16)).json()
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
