from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tests.api.conftest import MakeClient
from tests.api.test_chat_api import REPLY, chunks_of
from tests.support.openai_schema import validate
from tests.support.tokenizers import loaded_tokenizer


async def test_completion_matches_the_official_schema(make_client: MakeClient) -> None:
    client, engine = await make_client()
    r = await client.post("/v1/completions", json={"model": "tiny", "prompt": "Once upon a time"})
    body = r.json()
    validate("CreateCompletionResponse", body)
    assert body["object"] == "text_completion"
    assert body["choices"] == [{"index": 0, "text": REPLY, "logprobs": None, "finish_reason": "stop"}]
    prompt_ids = engine.tokenizer.encode("Once upon a time")
    assert engine.requests[0].prompt_ids == tuple(prompt_ids)
    assert body["usage"]["prompt_tokens"] == len(prompt_ids)


async def test_a_list_of_prompts_gives_n_choices_per_prompt_in_order(make_client: MakeClient) -> None:
    client, _ = await make_client(reply=lambda req, i: f"{req.prompt_text}/{i}")
    r = await client.post(
        "/v1/completions", json={"model": "tiny", "prompt": ["a b", "c d"], "n": 2, "max_tokens": 20}
    )
    body = r.json()
    validate("CreateCompletionResponse", body)
    assert [(c["index"], c["text"]) for c in body["choices"]] == [
        (0, "a b/0"),
        (1, "a b/1"),
        (2, "c d/0"),
        (3, "c d/1"),
    ]
    r = await client.post(
        "/v1/completions",
        json={"model": "tiny", "prompt": ["a b", "c d"], "n": 2, "max_tokens": 20, "stream": True},
    )
    texts: dict[int, str] = {}
    for chunk in chunks_of(r.text):
        validate("CreateCompletionResponse.stream", chunk)
        for c in chunk["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
    assert texts == {0: "a b/0", 1: "a b/1", 2: "c d/0", 3: "c d/1"}


async def test_token_id_prompts_are_accepted(make_client: MakeClient) -> None:
    client, engine = await make_client()
    ids = engine.tokenizer.encode("Hello world")
    r = await client.post("/v1/completions", json={"model": "tiny", "prompt": ids, "max_tokens": 3})
    assert r.status_code == 200
    assert engine.requests[0].prompt_ids == tuple(ids)
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    r = await client.post(
        "/v1/completions", json={"model": "tiny", "prompt": [ids, ids[:2]], "max_tokens": 3}
    )
    assert len(r.json()["choices"]) == 2


async def test_echo_prepends_the_prompt(make_client: MakeClient) -> None:
    client, _ = await make_client()
    r = await client.post("/v1/completions", json={"model": "tiny", "prompt": "Start:", "echo": True})
    assert r.json()["choices"][0]["text"] == "Start:" + REPLY
    r = await client.post(
        "/v1/completions", json={"model": "tiny", "prompt": "Start:", "echo": True, "stream": True}
    )
    assert "".join(c["choices"][0]["text"] for c in chunks_of(r.text) if c["choices"]) == "Start:" + REPLY


async def test_stream_with_usage_ends_with_a_usage_chunk(make_client: MakeClient) -> None:
    client, _engine = await make_client()
    r = await client.post(
        "/v1/completions",
        json={
            "model": "tiny",
            "prompt": "Hi",
            "stream": True,
            "stream_options": {"include_usage": True},
            "stop": "你",
        },
    )
    chunks = chunks_of(r.text)
    for c in chunks[:-1]:
        validate("CreateCompletionResponse.stream", c)
        # As chat chunks, and as OpenAI streams completions: null until the last chunk.
        assert "usage" in c and c["usage"] is None
    assert chunks[-1]["choices"] == []
    usage = chunks[-1]["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == REPLY[: REPLY.index("你")]
    assert json.loads(json.dumps(usage))["completion_tokens"] > 0


async def test_models_endpoints_match_the_schema(make_client: MakeClient) -> None:
    client, _ = await make_client()
    body = (await client.get("/v1/models")).json()
    validate("ListModelsResponse", body)
    assert [m["id"] for m in body["data"]] == ["tiny"]
    one = (await client.get("/v1/models/tiny")).json()
    validate("Model", one)
    assert one["id"] == "tiny"


async def test_metrics_count_requests_tokens_and_latency(make_client: MakeClient) -> None:
    client, _ = await make_client()
    await client.post("/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 4})
    await client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": True},
    )
    await client.post("/v1/completions", json={"model": "nope", "prompt": "Hi"})
    text = (await client.get("/metrics")).text
    assert 'gateway_requests_total{model="tiny",route="/v1/completions",status="200"} 1.0' in text
    assert 'gateway_requests_total{model="none",route="/v1/completions",status="404"} 1.0' in text
    assert 'gateway_requests_total{model="tiny",route="/v1/chat/completions",status="200"} 1.0' in text
    assert 'gateway_e2e_request_latency_seconds_count{model="tiny"} 2.0' in text
    assert 'gateway_inter_token_latency_seconds_count{model="tiny"}' in text
    assert 'gateway_time_to_first_token_seconds_count{model="tiny"} 2.0' in text
    assert 'gateway_generation_tokens_total{model="tiny"}' in text
    assert "gateway_requests_in_flight 1.0" in text  # the /metrics request itself


async def test_request_id_is_returned_and_the_access_line_has_tokens_but_no_prompt(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = await make_client()
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        r = await client.post(
            "/v1/completions",
            json={"model": "tiny", "prompt": "secret prompt text", "max_tokens": 3},
            headers={"X-Request-Id": "req-123"},
        )
        r2 = await client.get("/v1/models")
    assert r.headers["x-request-id"] == "req-123"
    assert len(r2.headers["x-request-id"]) == 32
    lines = [rec for rec in caplog.records if rec.name == "gateway.access"]
    fields = lines[0].fields  # type: ignore[attr-defined]
    assert fields["request_id"] == "req-123" and fields["status"] == 200 and fields["model"] == "tiny"
    assert fields["completion_tokens"] == 3 and fields["prompt_tokens"] > 0 and fields["ttft_ms"] is not None
    assert all(
        "secret" not in rec.getMessage() and "secret" not in str(getattr(rec, "fields", ""))
        for rec in caplog.records
    )


async def test_completion_logprobs_have_offsets_tokens_and_alternatives(make_client: MakeClient) -> None:
    client, _ = await make_client(reply=lambda req, i: "Hi you")
    body = {"model": "tiny", "prompt": "Say:", "logprobs": 2}
    out = (await client.post("/v1/completions", json=body)).json()
    validate("CreateCompletionResponse", out)
    logprobs = out["choices"][0]["logprobs"]
    assert "".join(logprobs["tokens"]) == "Hi you"
    assert logprobs["text_offset"][0] == 0
    assert all(len(t) == 2 for t in logprobs["top_logprobs"])
    assert logprobs["token_logprobs"][0] == pytest.approx(-0.1)
    r = await client.post("/v1/completions", json={**body, "stream": True})
    tokens = []
    for chunk in chunks_of(r.text):
        validate("CreateCompletionResponse.stream", chunk)
        if chunk["choices"][0]["logprobs"]:
            tokens += chunk["choices"][0]["logprobs"]["tokens"]
    assert tokens == logprobs["tokens"]


def _usage_of(text: str) -> dict:
    chunks = chunks_of(text)
    assert chunks[-1]["choices"] == []
    return chunks[-1]["usage"]


@pytest.mark.parametrize("needs_ids", [False, True])
async def test_a_prompt_within_every_limit_is_sent_before_it_is_tokenized_and_still_counted(
    make_client: MakeClient, tiny_bpe_dir: Path, needs_ids: bool
) -> None:
    client, engine = await make_client(needs_prompt_ids=needs_ids)
    prompt = "Hello there, how are you? 你好 🎉"
    ids = loaded_tokenizer(tiny_bpe_dir).encode(prompt)
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 5, "stream": True}
    r = await client.post("/v1/completions", json={**body, "stream_options": {"include_usage": True}})
    assert r.status_code == 200, r.text
    # An engine that does not need the ids gets none: the count came after the request went out.
    assert engine.requests[-1].prompt_ids == (() if not needs_ids else tuple(ids))
    assert _usage_of(r.text)["prompt_tokens"] == len(ids)
    r = await client.post("/v1/completions", json={**body, "stream": False})
    assert r.json()["usage"]["prompt_tokens"] == len(ids)


async def test_without_max_tokens_the_prompt_is_tokenized_first_for_the_default(
    make_client: MakeClient, tiny_bpe_dir: Path
) -> None:
    client, engine = await make_client()
    r = await client.post("/v1/completions", json={"model": "tiny", "prompt": "Hello there"})
    assert r.status_code == 200, r.text
    assert engine.requests[-1].prompt_ids == tuple(loaded_tokenizer(tiny_bpe_dir).encode("Hello there"))


async def test_near_a_limit_the_exact_count_decides(make_client: MakeClient, tiny_bpe_dir: Path) -> None:
    prompt = "hello world " * 10
    count = len(loaded_tokenizer(tiny_bpe_dir).encode(prompt))
    # The byte bound (one token per byte) is over the limit; the prompt itself is not.
    assert count < len(prompt.encode())
    client, engine = await make_client(settings={"max_prompt_tokens": count})
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 3}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert len(engine.requests[-1].prompt_ids) == count
    assert r.json()["usage"]["prompt_tokens"] == count
    client, engine = await make_client(settings={"max_prompt_tokens": count - 1})
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    assert f"the prompt has {count} tokens" in r.json()["error"]["message"]
    assert engine.requests == []


async def test_logprobs_of_tokens_that_are_not_whole_characters_stay_distinct(
    make_client: MakeClient,
) -> None:
    # In the tiny byte-level BPE, "🎉" and "é" end up split across tokens, and the scripted
    # alternatives (the next ids) are partial characters too: as text they would all be "\ufffd".
    reply = "🎉🎉 é ü"
    client, engine = await make_client(reply=lambda req, i: reply)
    tok = engine.tokenizer
    ids = tok.encode(reply, add_special_tokens=False)
    assert any(len({tok.token_text(t + k) for k in range(5)}) < 5 for t in ids), "no collision to test"
    body = {"model": "tiny", "prompt": "Say:", "logprobs": 5, "max_tokens": len(ids)}
    out = (await client.post("/v1/completions", json=body)).json()
    validate("CreateCompletionResponse", out)
    logprobs = out["choices"][0]["logprobs"]
    assert out["choices"][0]["text"] == reply
    assert len(logprobs["top_logprobs"]) == len(ids)
    assert all(len(entry) == 5 for entry in logprobs["top_logprobs"])
    for token_id, token in zip(ids, logprobs["tokens"], strict=True):
        raw = tok.token_raw_bytes(token_id)
        try:
            assert token == raw.decode()
        except UnicodeDecodeError:
            # OpenAI's way of naming a token that is not whole characters.
            assert token == "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
    # Offsets count the characters of the text so far: a partial character counts once complete.
    done = b""
    for token_id, offset in zip(ids, logprobs["text_offset"], strict=True):
        assert offset == len(done.decode(errors="ignore"))
        done += tok.token_raw_bytes(token_id)
    r = await client.post("/v1/completions", json={**body, "stream": True})
    streamed = []
    for chunk in chunks_of(r.text):
        if chunk["choices"] and chunk["choices"][0]["logprobs"]:
            streamed += chunk["choices"][0]["logprobs"]["top_logprobs"]
    assert streamed == logprobs["top_logprobs"]
