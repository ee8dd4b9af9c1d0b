"""Prompt log probabilities on the fake engine: echo with logprobs, max_tokens 0, vLLM's
prompt_logprobs on completions and chat, and the 400 where a model cannot score its prompt.
(The values are the fake engine's scripted ones; tests/integration/test_prompt_logprobs.py
compares real ones with transformers.)"""

from __future__ import annotations

import pytest

from deploy.families import build_family_model
from tests.api.conftest import MakeClient
from tests.api.test_chat_api import chunks_of


async def test_echo_with_logprobs_scores_the_prompt_then_the_completion(make_client: MakeClient) -> None:
    client, engine = await make_client(reply=lambda req, i: "Hi you")
    body = {"model": "tiny", "prompt": "Say:", "logprobs": 2, "echo": True}
    out = (await client.post("/v1/completions", json=body)).json()
    (choice,) = out["choices"]
    logprobs = choice["logprobs"]
    prompt_ids = list(engine.requests[0].prompt_ids)
    assert engine.requests[0].prompt_logprobs == 2
    n = len(prompt_ids)
    assert choice["text"] == "Say:Hi you"
    assert "".join(logprobs["tokens"]) == "Say:Hi you"
    # The first prompt token has nothing before it: null, as OpenAI's legacy API gives it.
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert logprobs["token_logprobs"][1:n] == [-0.5 * i for i in range(1, n)]
    assert logprobs["token_logprobs"][n:] == pytest.approx([-0.1, -0.2, -0.3])
    assert all(len(top) == 2 for top in logprobs["top_logprobs"][1:])
    # Offsets count characters of the whole text: the prompt's from 0, the completion's after it.
    assert logprobs["text_offset"][0] == 0
    assert logprobs["text_offset"][n] == len("Say:")
    text = choice["text"]
    for token, offset in zip(logprobs["tokens"], logprobs["text_offset"], strict=True):
        assert text[offset : offset + len(token)] == token
    assert "prompt_logprobs" not in choice


async def test_an_echoed_prompts_offsets_are_its_texts_where_the_tokenizer_adds_a_bos(
    make_client: MakeClient,
) -> None:
    """Llama 3's tokenizer puts <|begin_of_text|> before a text prompt: it is scored (first, null)
    but not in the echoed text, so it takes no characters there and every other token's offset
    points at that token in the choice's text."""
    client, _ = await make_client(tokenizer_dir=build_family_model("llama3_1"), reply=lambda req, i: "Hi you")
    for prompt in ("Say hi", ["Say hi", "Tell me"]):
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "echo": True, "logprobs": 1}
        for choice in (await client.post("/v1/completions", json=body)).json()["choices"]:
            text, logprobs = choice["text"], choice["logprobs"]
            assert logprobs["tokens"][0] == "<|begin_of_text|>" and logprobs["token_logprobs"][0] is None
            offsets = logprobs["text_offset"]
            assert offsets[0] == 0 and offsets == sorted(offsets)
            for token, offset in zip(logprobs["tokens"][1:], offsets[1:], strict=True):
                assert text[offset : offset + len(token)] == token


async def test_echo_with_logprobs_streams_the_prompts_logprobs_first(make_client: MakeClient) -> None:
    client, _ = await make_client(reply=lambda req, i: "Hi you")
    body = {"model": "tiny", "prompt": "Say:", "logprobs": 1, "echo": True}
    whole = (await client.post("/v1/completions", json=body)).json()["choices"][0]["logprobs"]
    r = await client.post("/v1/completions", json={**body, "stream": True})
    tokens: list[str] = []
    values: list[float | None] = []
    texts = []
    for chunk in chunks_of(r.text):
        (choice,) = chunk["choices"]
        texts.append(choice["text"])
        if choice["logprobs"]:
            tokens += choice["logprobs"]["tokens"]
            values += choice["logprobs"]["token_logprobs"]
    assert texts[0] == "Say:"
    assert "".join(texts) == "Say:Hi you"
    assert tokens == whole["tokens"] and values == whole["token_logprobs"]


@pytest.mark.parametrize("shape", [{"prompt": ["Say:", "Tell me:"]}, {"prompt": "Say:", "n": 2}])
async def test_a_streamed_echo_waits_for_its_prompts_logprobs_wherever_they_come(
    make_client: MakeClient, shape: dict
) -> None:
    """A prompt's log probabilities may come on a later engine response than a choice's first token
    (another prompt's request, another sequence, another of n requests answers first): each choice
    still streams its echo with them first, then its tokens, as the whole completion gives them."""
    client, _ = await make_client(reply=lambda req, i: "Hi you", prompt_logprobs_last=True)
    body = {"model": "tiny", **shape, "logprobs": 1, "echo": True, "max_tokens": 8}
    whole = {c["index"]: c for c in (await client.post("/v1/completions", json=body)).json()["choices"]}
    r = await client.post("/v1/completions", json={**body, "stream": True})
    assert r.status_code == 200, r.text
    texts: dict[int, list[str]] = {i: [] for i in whole}
    values: dict[int, list[float | None]] = {i: [] for i in whole}
    for chunk in chunks_of(r.text):
        assert "error" not in chunk, chunk
        (choice,) = chunk["choices"]
        texts[choice["index"]].append(choice["text"])
        if choice["logprobs"]:
            values[choice["index"]] += choice["logprobs"]["token_logprobs"]
    for i, choice in whole.items():
        echo = choice["text"].removesuffix("Hi you")
        assert texts[i][0] == echo and "".join(texts[i]) == choice["text"]
        assert values[i] == choice["logprobs"]["token_logprobs"] and values[i][0] is None


@pytest.mark.parametrize("stream", [False, True])
async def test_max_tokens_0_with_echo_scores_without_generating(
    make_client: MakeClient, stream: bool
) -> None:
    client, engine = await make_client(reply=lambda req, i: "Hi you")
    ids = [5, 6, 7, 8]
    body = {"model": "tiny", "prompt": ids, "logprobs": 1, "echo": True, "max_tokens": 0, "stream": stream}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    if stream:
        chunks = [c for c in chunks_of(r.text) if c["choices"]]
        text = "".join(c["choices"][0]["text"] for c in chunks)
        values = [
            v
            for c in chunks
            if c["choices"][0]["logprobs"]
            for v in c["choices"][0]["logprobs"]["token_logprobs"]
        ]
        reason = chunks[-1]["choices"][0]["finish_reason"]
    else:
        out = r.json()
        (choice,) = out["choices"]
        text, values, reason = choice["text"], choice["logprobs"]["token_logprobs"], choice["finish_reason"]
        assert out["usage"]["completion_tokens"] == 0
        assert out["usage"]["prompt_tokens"] == len(ids)
    assert engine.requests[0].prompt_ids == tuple(ids)
    assert text == engine.tokenizer.decode(ids, skip_special_tokens=False)
    assert values == [None, -0.5, -1.0, -1.5]
    assert reason == "length"


async def test_max_tokens_0_without_echo_is_a_400(make_client: MakeClient) -> None:
    client, _ = await make_client()
    r = await client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 0})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "max_tokens"


async def test_token_id_batches_are_scored_each_on_its_own(make_client: MakeClient) -> None:
    """lm-eval's request: several id prompts in one body, max_tokens 1, logprobs 1, echo."""
    client, engine = await make_client(reply=lambda req, i: "Z")
    prompts = [[5, 6, 7], [9, 10]]
    body = {
        "model": "tiny",
        "prompt": prompts,
        "logprobs": 1,
        "echo": True,
        "max_tokens": 1,
        "temperature": 0,
    }
    out = (await client.post("/v1/completions", json=body)).json()
    by_index = sorted(out["choices"], key=lambda c: c["index"])
    assert [len(c["logprobs"]["tokens"]) for c in by_index] == [4, 3]
    assert by_index[0]["logprobs"]["token_logprobs"][:3] == [None, -0.5, -1.0]
    assert by_index[1]["logprobs"]["token_logprobs"][:2] == [None, -0.5]
    assert sorted(tuple(r.prompt_ids) for r in engine.requests) == sorted(tuple(p) for p in prompts)


async def test_vllm_prompt_logprobs_on_completions(make_client: MakeClient) -> None:
    client, engine = await make_client(reply=lambda req, i: "Hi")
    out = (
        await client.post(
            "/v1/completions", json={"model": "tiny", "prompt": [5, 6, 7], "prompt_logprobs": 2}
        )
    ).json()
    (choice,) = out["choices"]
    prompt = choice["prompt_logprobs"]
    assert prompt[0] is None
    # The prompt token itself (with its rank) and the two most likely, ranked 1 and 2.
    assert prompt[1]["6"] == {"logprob": -0.5, "rank": 1, "decoded_token": prompt[1]["6"]["decoded_token"]}
    assert prompt[2]["7"]["rank"] == 2
    assert {k: v["rank"] for k, v in prompt[2].items() if k != "7"} == {"0": 1, "1": 2}
    assert choice["logprobs"] is None
    assert engine.requests[0].prompt_logprobs == 2


async def test_vllm_prompt_logprobs_on_chat(make_client: MakeClient) -> None:
    client, engine = await make_client()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "prompt_logprobs": 0}
    out = (await client.post("/v1/chat/completions", json=body)).json()
    prompt = out["prompt_logprobs"]
    ids = engine.requests[0].prompt_ids
    assert len(prompt) == len(ids) and prompt[0] is None
    assert [next(iter(entry)) for entry in prompt[1:]] == [str(t) for t in ids[1:]]


async def test_unasked_prompt_logprobs_leave_responses_as_they_were(make_client: MakeClient) -> None:
    client, engine = await make_client()
    chat = (
        await client.post(
            "/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        )
    ).json()
    assert "prompt_logprobs" not in chat
    assert engine.requests[0].prompt_logprobs is None


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "x", "logprobs": 1, "echo": True}, "echo"),
        ("/v1/completions", {"prompt": "x", "prompt_logprobs": 1}, "prompt_logprobs"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0, "echo": True, "logprobs": 0}, "echo"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 1},
            "prompt_logprobs",
        ),
    ],
)
async def test_a_model_that_cannot_score_its_prompt_says_so(
    make_client: MakeClient, path: str, body: dict, param: str
) -> None:
    client, engine = await make_client(prompt_logprobs=False)
    r = await client.post(path, json={"model": "tiny", **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param
    assert "context logits" in error["message"]
    assert not engine.requests


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "x"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ],
)
async def test_prompt_logprobs_with_stream_is_a_400_as_in_vllm(
    make_client: MakeClient, path: str, body: dict
) -> None:
    client, _ = await make_client()
    r = await client.post(path, json={"model": "tiny", **body, "prompt_logprobs": 1, "stream": True})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "prompt_logprobs"
