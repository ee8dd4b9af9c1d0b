"""/tokenize and /detokenize: the ids generation sends for a prompt or a chat, in vLLM's shapes."""

from __future__ import annotations

from pathlib import Path

from tests.api.conftest import MakeClient
from tests.support.openai_schema import validate

MESSAGES = [{"role": "user", "content": "Hello 你好 🎉"}]


async def test_a_prompt_is_tokenized_as_a_completion_encodes_it(
    make_client: MakeClient, tiny_metaspace_dir: Path
) -> None:
    client, engine = await make_client(tokenizer_dir=tiny_metaspace_dir, needs_prompt_ids=True)
    tok = engine.tokenizer
    r = await client.post("/tokenize", json={"model": "tiny", "prompt": "Once upon a time 🎉"})
    assert r.status_code == 200, r.text
    body = r.json()
    ids = tok.encode("Once upon a time 🎉")
    assert body == {"count": len(ids), "max_model_len": 512, "tokens": ids, "token_strs": None}
    # This tokenizer adds BOS to any text; the completion sends exactly these ids.
    assert tok.convert_ids_to_tokens(ids[:1]) == ["<|bos|>"]
    await client.post("/v1/completions", json={"model": "tiny", "prompt": "Once upon a time 🎉"})
    assert list(engine.requests[-1].prompt_ids) == ids
    r = await client.post(
        "/tokenize",
        json={"prompt": "Once upon a time", "add_special_tokens": False, "return_token_strs": True},
    )
    body = r.json()
    assert body["tokens"] == tok.encode("Once upon a time", add_special_tokens=False)
    assert body["token_strs"] == tok.convert_ids_to_tokens(body["tokens"])


async def test_messages_are_tokenized_as_a_chat_request_sends_them(
    make_client: MakeClient, tiny_metaspace_dir: Path
) -> None:
    client, engine = await make_client(
        tokenizer_dir=tiny_metaspace_dir, needs_prompt_ids=True, route="engine"
    )
    tok = engine.tokenizer
    r = await client.post("/tokenize", json={"model": "tiny", "messages": MESSAGES})
    assert r.status_code == 200, r.text
    tokens = r.json()["tokens"]
    rendered = tok.apply_chat_template(MESSAGES)
    # The template's own text, with no BOS added on top of it.
    assert tokens == tok.encode(rendered, add_special_tokens=False)
    await client.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "max_tokens": 2})
    assert list(engine.requests[-1].prompt_ids) == tokens
    with_specials = await client.post("/tokenize", json={"messages": MESSAGES, "add_special_tokens": True})
    assert with_specials.json()["tokens"] == tok.encode(rendered, add_special_tokens=True)
    no_prompt = await client.post(
        "/tokenize", json={"messages": MESSAGES, "add_generation_prompt": False, "return_token_strs": True}
    )
    body = no_prompt.json()
    assert body["count"] < len(tokens) and body["token_strs"] == tok.convert_ids_to_tokens(body["tokens"])


async def test_detokenize_gives_the_text_of_ids_special_tokens_included(make_client: MakeClient) -> None:
    client, engine = await make_client()
    ids = engine.tokenizer.encode("Hello 你好 🎉")
    r = await client.post("/detokenize", json={"model": "tiny", "tokens": ids})
    assert r.status_code == 200 and r.json() == {"prompt": "Hello 你好 🎉"}
    eos = engine.tokenizer.info.eos_token_id
    assert eos is not None
    r = await client.post("/detokenize", json={"tokens": [*ids, eos]})
    assert r.json()["prompt"] == "Hello 你好 🎉<|eos|>"


async def test_bad_requests_are_openai_errors(make_client: MakeClient) -> None:
    client, engine = await make_client()
    for path, body, status in (
        ("/tokenize", {"model": "tiny"}, 400),
        ("/tokenize", {"model": "tiny", "prompt": "a", "messages": MESSAGES}, 400),
        ("/tokenize", {"model": "gpt-9", "prompt": "a"}, 404),
        ("/tokenize", {"model": "tiny", "messages": [{"content": "no role"}]}, 400),
        ("/detokenize", {"model": "tiny", "tokens": [engine.tokenizer.vocab_size]}, 400),
        ("/detokenize", {"model": "tiny", "tokens": "abc"}, 400),
    ):
        r = await client.post(path, json=body)
        assert r.status_code == status, (path, body, r.text)
        validate("ErrorResponse", r.json())
