"""Body fields the gateway does not use: accepted and named back to the client (a response header
and the access log); a near-miss of a known field is a 400 naming it; the strict setting answers
OpenAI's own 400; the fields real agent clients send keep working."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from tests.api.conftest import MakeClient

USER = [{"role": "user", "content": "Hi"}]
CHAT = {"model": "tiny", "messages": USER, "max_tokens": 3}
COMPLETION = {"model": "tiny", "prompt": "Hi", "max_tokens": 3}
HEADER = "x-gateway-ignored-fields"


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize(
    ("path", "body", "typo", "meant"),
    [
        ("/v1/chat/completions", CHAT, "max_token", "max_tokens"),
        ("/v1/chat/completions", CHAT, "temprature", "temperature"),
        ("/v1/chat/completions", CHAT, "maxTokens", "max_tokens"),
        ("/v1/chat/completions", CHAT, "top_logprob", "top_logprobs"),
        ("/v1/completions", COMPLETION, "max_token", "max_tokens"),
        ("/v1/completions", COMPLETION, "temprature", "temperature"),
        ("/v1/completions", COMPLETION, "sufix", "suffix"),
    ],
)
async def test_a_misspelt_field_is_a_400_naming_the_field_it_resembles_in_both_modes(
    make_client: MakeClient, strict: bool, path: str, body: dict[str, Any], typo: str, meant: str
) -> None:
    client, engine = await make_client(settings={"reject_unknown_fields": strict})
    r = await client.post(path, json={**body, typo: 2})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["message"] == f"Unrecognized request argument supplied: {typo} (did you mean `{meant}`?)"
    assert (error["type"], error["param"]) == ("invalid_request_error", typo)
    assert engine.requests == []


async def test_unknown_fields_are_accepted_and_named_in_a_header_and_the_access_log(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = await make_client()
    caplog.set_level(logging.INFO, logger="gateway.access")
    body = {**CHAT, "store": True, "metadata": {"k": "v"}, "min_p": 0.1, "x_trace_label": "a"}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.headers[HEADER] == "store, metadata, min_p, x_trace_label"
    (line,) = [rec for rec in caplog.records if rec.name == "gateway.access"]
    assert line.fields["ignored_fields"] == "store,metadata,min_p,x_trace_label"  # type: ignore[attr-defined]
    # Streams too; and a request with only fields the gateway uses has no such header.
    r = await client.post("/v1/completions", json={**COMPLETION, "stream": True, "x_client_tag": 1})
    assert r.status_code == 200 and r.headers[HEADER] == "x_client_tag"
    r = await client.post("/v1/completions", json={**COMPLETION, "top_k": 5})
    assert r.status_code == 200 and HEADER not in r.headers


async def test_the_strict_setting_answers_openais_400_for_fields_openai_does_not_define(
    make_client: MakeClient,
) -> None:
    client, engine = await make_client(settings={"reject_unknown_fields": True})
    r = await client.post("/v1/chat/completions", json={**CHAT, "x_trace_label": "a", "min_p": 0.1})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "Unrecognized request arguments supplied: x_trace_label, min_p"
    # Fields OpenAI defines are still accepted (ignored, and named), as OpenAI accepts them.
    r = await client.post("/v1/chat/completions", json={**CHAT, "store": False, "metadata": {"a": "b"}})
    assert r.status_code == 200, r.text
    assert r.headers[HEADER] == "store, metadata"
    assert len(engine.requests) == 1


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_stream_options_without_stream_is_a_400_as_openai_answers(
    make_client: MakeClient, path: str
) -> None:
    client, _ = await make_client()
    body = CHAT if "chat" in path else COMPLETION
    options = {"stream_options": {"include_usage": True}}
    r = await client.post(path, json={**body, **options})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["message"] == "The 'stream_options' parameter is only allowed when 'stream' is enabled."
    assert error["param"] == "stream_options"
    assert (await client.post(path, json={**body, **options, "stream": False})).status_code == 400
    assert (await client.post(path, json={**body, **options, "stream": True})).status_code == 200
    assert (await client.post(path, json={**body, "stream_options": None})).status_code == 200


@pytest.mark.parametrize("strict", [False, True])
async def test_the_openai_sdk_and_langchain_with_their_extra_fields_still_work(
    make_client: MakeClient, strict: bool
) -> None:
    import openai
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI

    client, _ = await make_client(settings={"reject_unknown_fields": strict})
    http = httpx.AsyncClient(transport=client._transport)
    sdk = openai.AsyncOpenAI(base_url="http://gateway.test/v1", api_key="unused", http_client=http)
    async with sdk:
        out = await sdk.chat.completions.create(
            model="tiny",
            messages=USER,  # type: ignore[arg-type]
            max_completion_tokens=3,
            store=False,
            metadata={"session": "s1"},
            service_tier="auto",
            user="u1",
            parallel_tool_calls=False,
            prompt_cache_key="k",
            safety_identifier="s",
            reasoning_effort="low",
        )
        assert out.choices[0].message.content
        # vLLM-style knobs through extra_body: a strict gateway refuses them as OpenAI would.
        call = sdk.chat.completions.create(
            model="tiny",
            messages=USER,  # type: ignore[arg-type]
            max_tokens=3,
            extra_body={"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.1},
        )
        if strict:
            with pytest.raises(openai.BadRequestError, match="min_p"):
                await call
        else:
            assert (await call).choices[0].message.content
    chat = ChatOpenAI(
        model="tiny",
        base_url="http://gateway.test/v1",
        api_key="unused",  # type: ignore[arg-type]
        max_tokens=3,  # type: ignore[call-arg]
        temperature=0.5,
        http_async_client=httpx.AsyncClient(transport=client._transport),
        stream_usage=True,
    )
    reply = await chat.ainvoke([HumanMessage("Hi")])
    assert reply.content
    pieces = [piece async for piece in chat.astream([HumanMessage("Hi")])]
    assert "".join(str(p.content) for p in pieces)
    assert sum(p.usage_metadata["output_tokens"] for p in pieces if p.usage_metadata) > 0
