"""usage.prompt_tokens_details.cached_tokens: the engine's KV cache reuse when reported, else absent."""

from __future__ import annotations

import json

import pytest

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
