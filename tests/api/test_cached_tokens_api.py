"""Cached prompt tokens in usage, from the engine's KV cache reuse when it reports it:
`prompt_tokens_details.cached_tokens` (chat, completions; absent otherwise),
`input_tokens_details.cached_tokens` (Responses; required by OpenAI's schema, so 0 otherwise) and
`cache_read_input_tokens` (Messages; null otherwise, the reused tokens out of `input_tokens`)."""

from __future__ import annotations

import json

import pydantic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message as SdkMessage
from anthropic.types import RawMessageStreamEvent

from tests.api.conftest import MakeClient
from tests.support.openai_schema import validate

USER = [{"role": "user", "content": "Say hello"}]
ROUTES = {
    "/v1/chat/completions": ({"messages": USER}, "CreateChatCompletionResponse"),
    "/v1/completions": ({"prompt": "Say hello"}, "CreateCompletionResponse"),
}


def _stream_usage(text: str) -> dict:
    events = [e.removeprefix("data: ") for e in text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    return json.loads(events[-2])["usage"]


@pytest.mark.parametrize("path", list(ROUTES))
async def test_usage_carries_the_cached_tokens_the_engine_reports(make_client: MakeClient, path: str) -> None:
    client, _ = await make_client(cached_tokens=16)
    fields, schema = ROUTES[path]
    r = await client.post(path, json={"model": "tiny", **fields})
    assert r.status_code == 200, r.text
    validate(schema, r.json())
    assert r.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 16}
    stream = {"stream": True, "stream_options": {"include_usage": True}}
    r = await client.post(path, json={"model": "tiny", **fields, **stream})
    assert _stream_usage(r.text)["prompt_tokens_details"] == {"cached_tokens": 16}


@pytest.mark.parametrize("path", list(ROUTES))
async def test_zero_cached_tokens_is_reported_as_zero(make_client: MakeClient, path: str) -> None:
    client, _ = await make_client(cached_tokens=0)
    fields, _schema = ROUTES[path]
    r = await client.post(path, json={"model": "tiny", **fields})
    assert r.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


@pytest.mark.parametrize("path", list(ROUTES))
async def test_an_engine_that_does_not_report_reuse_gets_no_prompt_tokens_details(
    make_client: MakeClient, path: str
) -> None:
    client, _ = await make_client()
    fields, _schema = ROUTES[path]
    r = await client.post(path, json={"model": "tiny", **fields})
    assert "prompt_tokens_details" not in r.json()["usage"]
    stream = {"stream": True, "stream_options": {"include_usage": True}}
    r = await client.post(path, json={"model": "tiny", **fields, **stream})
    assert "prompt_tokens_details" not in _stream_usage(r.text)


async def test_n_completions_of_one_prompt_count_its_cached_tokens_once(make_client: MakeClient) -> None:
    client, _ = await make_client(cached_tokens=8)
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER, "n": 3})
    assert r.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 8}
    r = await client.post("/v1/completions", json={"model": "tiny", "prompt": ["a b", "c d"]})
    # Two prompts, each with its own engine request and its own reuse.
    assert r.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 16}


def _sse_data(text: str) -> list[dict]:
    """Each SSE event's JSON data, in order (Responses and Messages streams)."""
    out = []
    for block in text.split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: "):
                out.append(json.loads(line.removeprefix("data: ")))
    return out


RESPONSE = {"model": "tiny", "input": "Say hello", "store": False}


@pytest.mark.parametrize(("reported", "expected"), [(16, 16), (0, 0), (None, 0)])
async def test_responses_usage_has_the_cached_tokens_and_zero_where_the_engine_does_not_say(
    make_client: MakeClient, reported: int | None, expected: int
) -> None:
    # OpenAI's ResponseUsage requires input_tokens_details.cached_tokens: 0 when reuse is unknown.
    client, _ = await make_client(cached_tokens=reported)
    r = await client.post("/v1/responses", json=RESPONSE)
    assert r.status_code == 200, r.text
    validate("Response", r.json())
    details = {"cached_tokens": expected, "cache_write_tokens": 0}
    assert r.json()["usage"]["input_tokens_details"] == details
    r = await client.post("/v1/responses", json={**RESPONSE, "stream": True})
    completed = _sse_data(r.text)[-1]
    assert completed["type"] == "response.completed"
    validate("ResponseStreamEvent", completed)
    assert completed["response"]["usage"]["input_tokens_details"] == details


MESSAGE = {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello"}]}
EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)


def _accumulate(events: list[dict]) -> SdkMessage:
    snapshot = None
    bufs: dict[int, bytes] = {}
    for event in events:
        if event["type"] != "ping":
            snapshot = accumulate_event(
                event=EVENT.validate_python(event), current_snapshot=snapshot, json_bufs=bufs
            )
    assert snapshot is not None
    return SdkMessage.model_validate(snapshot.model_dump())


@pytest.mark.parametrize("reported", [16, 0])
async def test_messages_usage_reads_the_cached_tokens_out_of_input_tokens(
    make_client: MakeClient, reported: int
) -> None:
    client, _ = await make_client(cached_tokens=reported)
    r = await client.post("/v1/messages", json=MESSAGE)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    prompt = (await client.post("/v1/messages/count_tokens", json=MESSAGE)).json()["input_tokens"]
    assert prompt > reported
    # Anthropic: the prompt is input_tokens + cache_creation_input_tokens + cache_read_input_tokens.
    expected = {
        "input_tokens": prompt - reported,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": reported,
    }
    assert {k: usage[k] for k in expected} == expected
    r = await client.post("/v1/messages", json={**MESSAGE, "stream": True})
    events = _sse_data(r.text)
    start = events[0]
    assert start["type"] == "message_start"
    assert {k: start["message"]["usage"][k] for k in expected} == expected
    delta = next(e for e in events if e["type"] == "message_delta")
    assert {k: delta["usage"][k] for k in expected} == expected
    assert _accumulate(events).usage.model_dump(include=set(expected)) == expected


async def test_messages_usage_has_null_cache_counts_where_the_engine_does_not_report_reuse(
    make_client: MakeClient,
) -> None:
    client, _ = await make_client()
    r = await client.post("/v1/messages", json=MESSAGE)
    prompt = (await client.post("/v1/messages/count_tokens", json=MESSAGE)).json()["input_tokens"]
    usage = r.json()["usage"]
    assert usage["input_tokens"] == prompt
    assert usage["cache_read_input_tokens"] is None and usage["cache_creation_input_tokens"] is None
    r = await client.post("/v1/messages", json={**MESSAGE, "stream": True})
    events = _sse_data(r.text)
    assert events[0]["message"]["usage"]["cache_read_input_tokens"] is None
    final = _accumulate(events).usage
    assert final.input_tokens == prompt and final.cache_read_input_tokens is None
