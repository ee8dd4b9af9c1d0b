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


# Writes a call's arguments as Llama 3.1's JSON tool template does: `arguments | tojson`.
TOJSON_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}"
    "{% for c in m.get('tool_calls') or [] %}{{ c['function']['arguments'] | tojson }}{% endfor %}\n"
    "{% endfor %}"
)


async def test_a_conversation_with_tool_calls_is_tokenized_as_a_chat_request_sends_it(
    make_client: MakeClient, tiny_agent_dir: Path, tmp_path: Path
) -> None:
    """The template gets a call's arguments as an object on both routes (it writes them with
    `tojson`): /tokenize shows the prompt the chat request sends, not the arguments encoded twice."""
    template = tmp_path / "tojson.jinja"
    template.write_text(TOJSON_TEMPLATE)
    client, engine = await make_client(
        tokenizer_dir=tiny_agent_dir, needs_prompt_ids=True, route="engine", model={"chat_template": template}
    )
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = await client.post("/tokenize", json={"model": "tiny", "messages": messages})
    assert r.status_code == 200, r.text
    tokens = r.json()["tokens"]
    text = engine.tokenizer.decode(tokens, skip_special_tokens=False)
    assert 'assistant: {"city": "Paris"}' in text and '\\"city\\"' not in text, text
    chat = await client.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 2}
    )
    assert chat.status_code == 200, chat.text
    assert list(engine.requests[-1].prompt_ids) == tokens


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
