"""Chat completions through the ASGI app on a scripted engine: shapes, streaming bytes, stops, usage."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import MakeClient
from tests.support.fixtures import tiny_agent_dir  # noqa: F401
from tests.support.openai_schema import validate

USER = [{"role": "user", "content": "Say hello"}]
REPLY = "Hello there! 你好 🎉 how are you today?"


def sse_events(body: str) -> list[str]:
    assert body.endswith("data: [DONE]\n\n"), body[-200:]
    events = [e for e in body.split("\n\n") if e]
    for e in events:
        assert e.startswith("data: "), e
    return [e.removeprefix("data: ") for e in events]


def chunks_of(body: str) -> list[dict]:
    events = sse_events(body)
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


async def test_chat_completion_matches_the_official_schema_and_counts_usage(make_client: MakeClient) -> None:
    client, engine = await make_client()
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER})
    assert r.status_code == 200, r.text
    body = r.json()
    validate("CreateChatCompletionResponse", body)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": REPLY, "refusal": None}
    assert body["choices"][0]["finish_reason"] == "stop"
    request = engine.requests[0]
    reply_ids = engine.tokenizer.encode(REPLY, add_special_tokens=False)
    assert body["usage"] == {
        "prompt_tokens": len(request.prompt_ids),
        "completion_tokens": len(reply_ids),
        "total_tokens": len(request.prompt_ids) + len(reply_ids),
    }
    assert request.prompt_text == engine.tokenizer.apply_chat_template(USER)


async def test_stream_sends_role_deltas_finish_usage_and_done_in_order(make_client: MakeClient) -> None:
    client, engine = await make_client(reply=lambda req, i: "Hi you")
    r = await client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": USER, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    chunks = chunks_of(r.text)
    for chunk in chunks:
        validate("CreateChatCompletionStreamResponse", chunk)
    ids = engine.tokenizer.encode("Hi you", add_special_tokens=False)
    pieces = [
        engine.tokenizer.decode(ids[: i + 1])[len(engine.tokenizer.decode(ids[:i])) :]
        for i in range(len(ids))
    ]
    head = {k: chunks[0][k] for k in ("id", "object", "created", "model")}
    expected = [
        {
            **head,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
            "usage": None,
        },
        *[
            {
                **head,
                "choices": [{"index": 0, "delta": {"content": p}, "logprobs": None, "finish_reason": None}],
                "usage": None,
            }
            for p in pieces
        ],
        {
            **head,
            "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
            "usage": None,
        },
        {
            **head,
            "choices": [],
            "usage": {
                "prompt_tokens": len(engine.requests[0].prompt_ids),
                "completion_tokens": len(ids),
                "total_tokens": len(engine.requests[0].prompt_ids) + len(ids),
            },
        },
    ]
    assert chunks == expected
    # Exact framing: one `data:` line per event, a blank line between, [DONE] last.
    assert (
        r.text
        == "".join(f"data: {json.dumps(c, separators=(',', ':'), ensure_ascii=False)}\n\n" for c in expected)
        + "data: [DONE]\n\n"
    )


async def test_without_include_usage_chunks_carry_no_usage_field(make_client: MakeClient) -> None:
    client, _ = await make_client()
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER, "stream": True})
    chunks = chunks_of(r.text)
    assert all("usage" not in c for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == REPLY


@pytest.mark.parametrize("token_ids", [True, False], ids=["ids", "text-bytes"])
async def test_streamed_text_equals_non_streamed_text(make_client: MakeClient, token_ids: bool) -> None:
    client, _ = await make_client(token_ids=token_ids)
    full = (await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER})).json()
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER, "stream": True})
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks_of(r.text))
    assert streamed == full["choices"][0]["message"]["content"] == REPLY


async def test_stop_string_split_across_tokens_cuts_the_answer_and_cancels_the_engine(
    make_client: MakeClient,
) -> None:
    client, engine = await make_client()
    stop = "你好"
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER, "stop": stop})
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == REPLY[: REPLY.index(stop)]
    assert choice["finish_reason"] == "stop"
    assert engine.cancelled == [engine.requests[0].request_id]
    r = await client.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": USER, "stop": [stop], "stream": True}
    )
    chunks = chunks_of(r.text)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == REPLY[: REPLY.index(stop)]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_max_tokens_one_gives_one_token_and_length(make_client: MakeClient) -> None:
    client, engine = await make_client()
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER, "max_tokens": 1})
    body = r.json()
    first = engine.tokenizer.decode(engine.tokenizer.encode(REPLY, add_special_tokens=False)[:1])
    assert body["choices"][0] == {
        "index": 0,
        "message": {"role": "assistant", "content": first, "refusal": None},
        "logprobs": None,
        "finish_reason": "length",
    }
    assert body["usage"]["completion_tokens"] == 1
    assert engine.requests[0].params.max_tokens == 1


async def test_max_completion_tokens_wins_over_max_tokens(make_client: MakeClient) -> None:
    client, engine = await make_client()
    await client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": USER, "max_tokens": 50, "max_completion_tokens": 3},
    )
    assert engine.requests[0].params.max_tokens == 3


async def test_default_max_tokens_is_the_rest_of_the_context_not_16(make_client: MakeClient) -> None:
    client, engine = await make_client()
    await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER})
    request = engine.requests[0]
    assert request.params.max_tokens == 512 - len(request.prompt_ids)


async def test_n_two_gives_two_choices_with_indexes_0_and_1(make_client: MakeClient) -> None:
    client, _ = await make_client(reply=lambda req, i: f"answer number {i}")
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER, "n": 2})
    body = r.json()
    validate("CreateChatCompletionResponse", body)
    assert [(c["index"], c["message"]["content"]) for c in body["choices"]] == [
        (0, "answer number 0"),
        (1, "answer number 1"),
    ]
    r = await client.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": USER, "n": 2, "stream": True}
    )
    texts = {0: "", 1: ""}
    finishes = {}
    for c in chunks_of(r.text):
        ch = c["choices"][0]
        texts[ch["index"]] += ch["delta"].get("content") or ""
        if ch["finish_reason"]:
            finishes[ch["index"]] = ch["finish_reason"]
    assert texts == {0: "answer number 0", 1: "answer number 1"}
    assert finishes == {0: "stop", 1: "stop"}


async def test_extra_end_token_stops_generation_with_stop(make_client: MakeClient) -> None:
    client, engine = await make_client(reply=lambda req, i: "before<|eot|>after")
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER})
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == "before"
    assert choice["finish_reason"] == "stop"
    request = engine.requests[0]
    assert request.end_token_strings == ("<|eot|>",)
    assert engine.cancelled == [request.request_id]


async def test_sampling_fields_and_engine_knobs_reach_the_engine(make_client: MakeClient) -> None:
    client, engine = await make_client()
    await client.post(
        "/v1/chat/completions",
        json={
            "model": "tiny",
            "messages": USER,
            "temperature": 0.5,
            "top_p": 0.9,
            "seed": 7,
            "presence_penalty": 0.1,
            "frequency_penalty": 0.2,
            "top_k": 5,
            "repetition_penalty": 1.1,
            "min_tokens": 2,
            "length_penalty": 1.0,
            "ignore_eos": True,
            "max_tokens": 9,
            "user": "someone",
            "some_future_field": {"x": 1},
        },
    )
    p = engine.requests[0].params
    assert (p.temperature, p.top_p, p.seed, p.presence_penalty, p.frequency_penalty) == (
        0.5,
        0.9,
        7,
        0.1,
        0.2,
    )
    assert (p.top_k, p.repetition_penalty, p.min_tokens, p.length_penalty, p.ignore_eos, p.max_tokens) == (
        5,
        1.1,
        2,
        1.0,
        True,
        9,
    )


async def test_a_fresh_seed_is_chosen_when_sampling_without_one(make_client: MakeClient) -> None:
    client, engine = await make_client()
    for _ in range(2):
        await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER, "max_tokens": 2})
    seeds = [r.params.seed for r in engine.requests]
    assert None not in seeds and seeds[0] != seeds[1]
    await client.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": USER, "max_tokens": 2, "temperature": 0}
    )
    assert engine.requests[-1].params.seed is None


async def test_content_parts_are_joined_and_developer_becomes_system(make_client: MakeClient) -> None:
    client, engine = await make_client()
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]},
    ]
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages})
    assert r.status_code == 200
    expected = engine.tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    )
    assert engine.requests[0].prompt_text == expected


async def test_an_engine_failure_mid_stream_is_one_error_event_then_done(make_client: MakeClient) -> None:
    client, _ = await make_client(fail_after=3)
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER, "stream": True})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])
    validate("ErrorResponse", error)
    assert error["error"]["code"] == "engine_error"
    assert all("error" not in json.loads(e) for e in events[:-2])


async def test_the_openai_sdk_parses_responses_and_streams(make_client: MakeClient) -> None:
    import openai

    client, _ = await make_client()
    sdk = openai.AsyncOpenAI(
        base_url="http://gateway.test/v1",
        api_key="unused",
        http_client=httpx.AsyncClient(transport=client._transport),
    )
    async with sdk:
        out = await sdk.chat.completions.create(model="tiny", messages=USER)  # type: ignore[arg-type]
        assert out.choices[0].message.content == REPLY
        stream = await sdk.chat.completions.create(model="tiny", messages=USER, stream=True)  # type: ignore[arg-type]
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == REPLY


async def test_chat_logprobs_whole_and_streamed(make_client: MakeClient) -> None:
    client, engine = await make_client(reply=lambda req, i: "Hi you")
    body = {"model": "tiny", "messages": USER, "logprobs": True, "top_logprobs": 2}
    out = (await client.post("/v1/chat/completions", json=body)).json()
    validate("CreateChatCompletionResponse", out)
    content = out["choices"][0]["logprobs"]["content"]
    ids = engine.tokenizer.encode("Hi you", add_special_tokens=False)
    assert [e["token"] for e in content] == [engine.tokenizer.token_text(t) for t in ids]
    assert "".join(e["token"] for e in content) == "Hi you"
    assert [e["logprob"] for e in content] == pytest.approx([-0.1 * (k + 1) for k in range(len(ids))])
    assert all(len(e["top_logprobs"]) == 2 and e["bytes"] == list(e["token"].encode()) for e in content)
    assert engine.requests[0].logprobs == 2
    r = await client.post("/v1/chat/completions", json={**body, "stream": True})
    streamed = []
    for chunk in chunks_of(r.text):
        validate("CreateChatCompletionStreamResponse", chunk)
        if chunk["choices"] and chunk["choices"][0].get("logprobs"):
            streamed += chunk["choices"][0]["logprobs"]["content"]
    assert streamed == content


@pytest.mark.parametrize(
    ("extra", "param", "kwargs"),
    [
        ({"top_logprobs": 2}, "top_logprobs", {}),
        ({"logprobs": True}, "logprobs", {"logprobs": False}),
    ],
)
async def test_logprobs_that_cannot_be_served_are_400(
    make_client: MakeClient, extra: dict, param: str, kwargs: dict
) -> None:
    from tests.api.test_errors_api import assert_error

    client, _ = await make_client(**kwargs)
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER, **extra})
    assert_error(r, 400, param=param)


@pytest.mark.parametrize("needs_ids", [False, True])
async def test_a_chat_prompt_sent_before_it_is_tokenized_is_counted_the_same(
    make_client: MakeClient, needs_ids: bool
) -> None:
    client, engine = await make_client(needs_prompt_ids=needs_ids)
    body = {"model": "tiny", "messages": USER, "max_tokens": 4, "stream": True}
    r = await client.post("/v1/chat/completions", json={**body, "stream_options": {"include_usage": True}})
    assert r.status_code == 200, r.text
    request = engine.requests[-1]
    ids = engine.tokenizer.encode(request.prompt_text)
    assert request.prompt_ids == (() if not needs_ids else tuple(ids))
    assert chunks_of(r.text)[-1]["usage"]["prompt_tokens"] == len(ids)


async def test_chat_logprobs_give_each_tokens_exact_bytes_also_for_partial_characters(
    make_client: MakeClient,
) -> None:
    reply = "🎉🎉 é ü"
    client, engine = await make_client(reply=lambda req, i: reply)
    tok = engine.tokenizer
    ids = tok.encode(reply, add_special_tokens=False)
    assert any(not _is_utf8(tok.token_raw_bytes(t)) for t in ids), "no partial character to test"
    body = {"model": "tiny", "messages": USER, "logprobs": True, "top_logprobs": 5, "max_tokens": len(ids)}
    out = (await client.post("/v1/chat/completions", json=body)).json()
    validate("CreateChatCompletionResponse", out)
    content = out["choices"][0]["logprobs"]["content"]
    # The bytes put together are the reply, exactly; each token's are its own.
    assert b"".join(bytes(e["bytes"]) for e in content) == reply.encode()
    assert [bytes(e["bytes"]) for e in content] == [tok.token_raw_bytes(t) for t in ids]
    for token_id, e in zip(ids, content, strict=True):
        raw = bytes(e["bytes"])
        expected = raw.decode() if _is_utf8(raw) else "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
        assert e["token"] == expected
        # Every entry has the asked number of distinct alternatives, each with its own bytes (the
        # scripted engine's alternatives are the chosen id and the ids after it).
        assert len({alt["token"] for alt in e["top_logprobs"]}) == 5
        assert [bytes(alt["bytes"]) for alt in e["top_logprobs"]] == [
            tok.token_raw_bytes(token_id + k) for k in range(5)
        ]


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize("needs_prompt_ids", [True, False])
async def test_a_long_conversation_is_rendered_and_encoded_off_the_loop_as_the_tokenizer_would(
    make_client: MakeClient,
    needs_prompt_ids: bool,
    tiny_agent_dir: Path,  # noqa: F811
) -> None:
    """Long messages take the threaded render and the piecewise encoder; the prompt, its ids and
    the usage are the tokenizer's own, also for the turn after (mostly cached pieces)."""
    client, engine = await make_client(tokenizer_dir=tiny_agent_dir, needs_prompt_ids=needs_prompt_ids)
    # (The same tokenizer directory as the app's: it is encoded piecewise.)
    encoder = engine.tokenizer.encoder
    assert encoder is not None and encoder.incremental
    long_text = " ".join(f"line {i}: the value of x{i} is {i * 7}" for i in range(400))
    messages = [{"role": "system", "content": long_text}, {"role": "user", "content": "Sum them."}]
    for turn in range(2):
        r = await client.post(
            "/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 4}
        )
        assert r.status_code == 200, r.text
        request = engine.requests[-1]
        assert request.prompt_text == engine.tokenizer.apply_chat_template(messages)
        want = engine.tokenizer._tok.encode(request.prompt_text)
        if needs_prompt_ids:
            assert list(request.prompt_ids) == want
        assert r.json()["usage"]["prompt_tokens"] == len(want)
        messages += [
            {"role": "assistant", "content": REPLY},
            {"role": "user", "content": f"And turn {turn}?"},
        ]
    metrics = (await client.get("/metrics")).text
    assert "gateway_event_loop_lag_seconds_count" in metrics
