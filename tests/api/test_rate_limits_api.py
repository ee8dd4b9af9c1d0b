"""Per-key rate limits on every generation API: OpenAI's x-ratelimit-* headers on each response
(Anthropic's anthropic-ratelimit-* on /v1/messages),
429 with Retry-After in the API's own error shape when a key is over its requests or tokens per
minute, tokens reserved at admission and settled to real usage; with a state server, two gateway
apps (replicas) share a key's limit and stored responses."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import MakeClient
from tests.api.test_errors_api import assert_error
from tests.support import anthropic_errors

USER = [{"role": "user", "content": "hi"}]
KEY = {"Authorization": "Bearer k-one"}


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": USER, "max_tokens": 10, **extra}


async def test_each_response_carries_openais_rate_limit_headers(make_client: MakeClient) -> None:
    client, _ = await make_client(
        settings={"api_keys": ["k-one"], "rate_limit_rpm": 5, "rate_limit_tpm": 600}
    )
    r = await client.post("/v1/chat/completions", json=chat(), headers=KEY)
    assert r.status_code == 200, r.text
    prompt = r.json()["usage"]["prompt_tokens"]
    assert r.headers["x-ratelimit-limit-requests"] == "5"
    assert r.headers["x-ratelimit-remaining-requests"] == "4"
    assert r.headers["x-ratelimit-reset-requests"].endswith("s")
    assert r.headers["x-ratelimit-limit-tokens"] == "600"
    # Reserved at admission: the prompt plus max_tokens (a few tokens may have refilled since).
    assert 0 <= int(r.headers["x-ratelimit-remaining-tokens"]) - (600 - prompt - 10) <= 60
    assert "retry-after" not in r.headers
    # Not on routes that generate nothing.
    models = await client.get("/v1/models", headers=KEY)
    assert "x-ratelimit-limit-requests" not in models.headers


async def test_a_stream_carries_the_headers_too(make_client: MakeClient) -> None:
    client, _ = await make_client(settings={"rate_limit_rpm": 5})
    async with client.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as r:
        assert r.status_code == 200
        assert r.headers["x-ratelimit-remaining-requests"] == "4"
        assert "x-ratelimit-limit-tokens" not in r.headers
        await r.aread()


@pytest.mark.parametrize("stream", [False, True])
async def test_over_the_request_limit_is_openais_429_with_retry_after(
    make_client: MakeClient, stream: bool
) -> None:
    client, engine = await make_client(settings={"api_keys": ["k-one"], "rate_limit_rpm": 2})
    for _ in range(2):
        assert (await client.post("/v1/chat/completions", json=chat(), headers=KEY)).status_code == 200
    r = await client.post("/v1/chat/completions", json=chat(stream=stream), headers=KEY)
    error = assert_error(r, 429, param=None, code="rate_limit_exceeded")
    assert error["type"] == "requests" and "limit 2 per minute" in error["message"]
    # One request comes back every 30 s at 2 per minute.
    assert 28 <= int(r.headers["retry-after"]) <= 30
    assert r.headers["x-ratelimit-remaining-requests"] == "0"
    assert r.headers["x-ratelimit-limit-requests"] == "2"
    assert len(engine.requests) == 2


async def test_over_the_limit_on_messages_is_anthropics_rate_limit_error(make_client: MakeClient) -> None:
    client, engine = await make_client(settings={"api_keys": ["k-one"], "rate_limit_rpm": 1})
    body = {"model": "tiny", "max_tokens": 10, "messages": USER}
    headers = {"x-api-key": "k-one"}
    assert (await client.post("/v1/messages", json=body, headers=headers)).status_code == 200
    r = await client.post("/v1/messages", json=body, headers=headers)
    anthropic_errors.assert_error(r, 429, "rate_limit_error", message="Rate limit reached for requests")
    assert 58 <= int(r.headers["retry-after"]) <= 60
    assert r.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert "x-ratelimit-remaining-requests" not in r.headers
    assert len(engine.requests) == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_messages_carry_anthropics_rate_limit_headers(make_client: MakeClient, stream: bool) -> None:
    """Anthropic's SDKs and Claude Code read `anthropic-ratelimit-*`, with resets as RFC 3339 instants."""
    client, _ = await make_client(settings={"rate_limit_rpm": 5, "rate_limit_tpm": 600})
    body = {"model": "tiny", "max_tokens": 10, "messages": USER, "stream": stream}
    before = datetime.now(UTC).replace(microsecond=0)
    async with client.stream("POST", "/v1/messages", json=body) as r:
        assert r.status_code == 200
        await r.aread()
    h = r.headers
    assert h["anthropic-ratelimit-requests-limit"] == "5"
    assert h["anthropic-ratelimit-requests-remaining"] == "4"
    assert h["anthropic-ratelimit-tokens-limit"] == "600"
    assert int(h["anthropic-ratelimit-tokens-remaining"]) < 600 - 10
    for name in ("anthropic-ratelimit-requests-reset", "anthropic-ratelimit-tokens-reset"):
        assert h[name].endswith("Z")
        reset = datetime.fromisoformat(h[name])
        # One request of five per minute comes back within 12 s; tokens within a minute.
        assert before <= reset <= before + timedelta(seconds=61), (name, h[name])
    assert datetime.fromisoformat(h["anthropic-ratelimit-requests-reset"]) <= before + timedelta(seconds=13)
    assert not [name for name in h if name.startswith("x-ratelimit-")]
    assert "retry-after" not in h


async def test_each_key_has_its_own_limit_and_may_have_its_own_numbers(make_client: MakeClient) -> None:
    client, _ = await make_client(
        settings={"api_keys": ["k-one", "k-two"], "rate_limit_rpm": 3, "key_rate_limits": ["key=k-one,rpm=1"]}
    )
    one, two = KEY, {"Authorization": "Bearer k-two"}
    assert (await client.post("/v1/chat/completions", json=chat(), headers=one)).status_code == 200
    assert (await client.post("/v1/chat/completions", json=chat(), headers=one)).status_code == 429
    for _ in range(3):
        r = await client.post("/v1/chat/completions", json=chat(), headers=two)
        assert r.status_code == 200 and r.headers["x-ratelimit-limit-requests"] == "3"
    assert (await client.post("/v1/chat/completions", json=chat(), headers=two)).status_code == 429


async def test_without_api_keys_every_request_shares_one_limit(make_client: MakeClient) -> None:
    """A client cannot escape its limit by sending made-up keys when the gateway checks none."""
    client, _ = await make_client(settings={"rate_limit_rpm": 1})
    assert (await client.post("/v1/chat/completions", json=chat(), headers=KEY)).status_code == 200
    other = {"Authorization": "Bearer something-else"}
    assert (await client.post("/v1/chat/completions", json=chat(), headers=other)).status_code == 429


async def test_an_invalid_request_counts_against_no_limit(make_client: MakeClient) -> None:
    client, _ = await make_client(settings={"rate_limit_rpm": 1})
    assert_error(
        await client.post("/v1/chat/completions", json=chat(temperature=9)), 400, param="temperature"
    )
    assert (await client.post("/v1/chat/completions", json=chat())).status_code == 200


async def test_a_request_larger_than_the_token_limit_is_refused_for_good(make_client: MakeClient) -> None:
    client, engine = await make_client(settings={"rate_limit_tpm": 100})
    r = await client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 200})
    error = assert_error(r, 429, param=None, code="rate_limit_exceeded")
    assert error["type"] == "tokens" and "Request too large" in error["message"]
    assert "retry-after" not in r.headers
    assert engine.requests == []


async def test_unused_reserved_tokens_go_back_to_the_bucket(make_client: MakeClient) -> None:
    """The reply is a few tokens long: most of a large max_tokens is given back when it ends, so a
    second request that would not fit beside the first reservation is admitted."""
    client, _ = await make_client(settings={"rate_limit_tpm": 600})
    first = await client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 400})
    assert first.status_code == 200, first.text
    usage = first.json()["usage"]
    assert usage["completion_tokens"] < 50
    second = await client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 400})
    assert second.status_code == 200, second.text
    # What the first really used stays taken; the second's reservation is taken now.
    remaining = int(second.headers["x-ratelimit-remaining-tokens"])
    assert 0 <= remaining - (600 - usage["total_tokens"] - usage["prompt_tokens"] - 400) <= 60


async def test_n_reserves_max_tokens_for_every_choice(make_client: MakeClient) -> None:
    client, _ = await make_client(settings={"rate_limit_tpm": 1000})
    r = await client.post("/v1/chat/completions", json=chat(max_tokens=300, n=4))
    assert_error(r, 429, param=None)
    assert (await client.post("/v1/chat/completions", json=chat(max_tokens=300, n=3))).status_code == 200


async def test_responses_reserve_max_output_tokens(make_client: MakeClient) -> None:
    client, _ = await make_client(settings={"rate_limit_tpm": 100, "response_store": "memory"})
    r = await client.post("/v1/responses", json={"model": "tiny", "input": "hi", "max_output_tokens": 200})
    assert_error(r, 429, param=None)
    r = await client.post("/v1/responses", json={"model": "tiny", "input": "hi", "max_output_tokens": 20})
    assert r.status_code == 200 and r.headers["x-ratelimit-limit-tokens"] == "100"


async def test_two_replicas_on_one_state_server_share_limits_and_stored_responses(
    make_client: MakeClient, redis_url: str
) -> None:
    settings = {"api_keys": ["k-one"], "rate_limit_rpm": 3, "state_url": redis_url}
    a, _ = await make_client(settings=settings)
    b, _ = await make_client(settings=settings)
    remaining = []
    for client in (a, b, a):
        r = await client.post("/v1/chat/completions", json=chat(), headers=KEY)
        assert r.status_code == 200
        remaining.append(r.headers["x-ratelimit-remaining-requests"])
    assert remaining == ["2", "1", "0"]
    assert_error(await b.post("/v1/chat/completions", json=chat(), headers=KEY), 429, param=None)


async def test_a_conversation_stored_through_one_replica_continues_on_another(
    make_client: MakeClient, redis_url: str
) -> None:
    a, _ = await make_client(settings={"state_url": redis_url})
    b, engine_b = await make_client(settings={"state_url": redis_url})
    first = await a.post(
        "/v1/responses", json={"model": "tiny", "input": "my name is Ada", "max_output_tokens": 16}
    )
    assert first.status_code == 200, first.text
    response_id = first.json()["id"]
    got = await b.get(f"/v1/responses/{response_id}")
    assert got.status_code == 200 and got.json()["output"] == first.json()["output"]
    second = await b.post(
        "/v1/responses",
        json={
            "model": "tiny",
            "input": "what is my name?",
            "previous_response_id": response_id,
            "max_output_tokens": 16,
        },
    )
    assert second.status_code == 200, second.text
    # Replica b's engine got the whole conversation that replica a stored.
    assert "my name is Ada" in engine_b.requests[-1].prompt_text
    items = (await a.get(f"/v1/responses/{second.json()['id']}/input_items")).json()["data"]
    texts = [part["text"] for item in items if item["type"] == "message" for part in item["content"]]
    assert "my name is Ada" in texts and "what is my name?" in texts
    assert (await b.delete(f"/v1/responses/{response_id}")).status_code == 200
    assert (await a.get(f"/v1/responses/{response_id}")).status_code == 404


async def test_the_key_file_gives_a_keys_own_limits(make_client: MakeClient, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nk-one priority=1 rpm=1\nk-two tpm=50\nk-three\n")
    client, _ = await make_client(settings={"api_key_file": keys, "rate_limit_rpm": 5})
    one = {"Authorization": "Bearer k-one"}
    assert (await client.post("/v1/chat/completions", json=chat(), headers=one)).status_code == 200
    assert_error(await client.post("/v1/chat/completions", json=chat(), headers=one), 429, param=None)
    two = await client.post("/v1/chat/completions", json=chat(), headers={"Authorization": "Bearer k-two"})
    assert (
        two.headers["x-ratelimit-limit-tokens"] == "50" and two.headers["x-ratelimit-limit-requests"] == "5"
    )
    three = await client.post(
        "/v1/chat/completions", json=chat(), headers={"Authorization": "Bearer k-three"}
    )
    assert (
        three.headers["x-ratelimit-limit-requests"] == "5" and "x-ratelimit-limit-tokens" not in three.headers
    )
