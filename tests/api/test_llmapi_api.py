"""What the core does for an engine like the llmapi model (it tokenizes text itself, adding BOS;
it reports no token counts; it takes few sampling parameters), over a fake engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.conftest import MakeClient
from tests.support.fake_engine import LLMAPI_LIKE as LLMAPI
from tests.support.tokenizers import loaded_tokenizer

USER = [{"role": "user", "content": "hi"}]


async def test_the_bos_a_chat_template_writes_is_left_to_the_engine(
    make_client: MakeClient, tmp_path: Path, tiny_bpe_dir: Path
) -> None:
    template = tmp_path / "template.jinja"
    template.write_text("{{ bos_token }}{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    client, engine = await make_client(model={"chat_template": template}, **LLMAPI)
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER, "max_tokens": 4})
    assert r.status_code == 200, r.text
    tok = loaded_tokenizer(tiny_bpe_dir)
    assert tok.bos_token and engine.requests[0].prompt_text == "hi\n"
    # Counted as the engine counts what it is sent: with special tokens added.
    assert r.json()["usage"]["prompt_tokens"] == len(tok.encode("hi\n", add_special_tokens=True))


async def test_completion_tokens_are_counted_from_the_text(
    make_client: MakeClient, tiny_bpe_dir: Path
) -> None:
    client, _engine = await make_client(**LLMAPI)
    r = await client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 64})
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    assert r.json()["usage"]["completion_tokens"] == len(
        loaded_tokenizer(tiny_bpe_dir).encode(text, add_special_tokens=False)
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [("min_tokens", 2), ("repetition_penalty", 1.1), ("presence_penalty", 0.5), ("ignore_eos", True)],
)
async def test_a_sampling_parameter_the_engine_lacks_is_a_400_naming_it(
    make_client: MakeClient, field: str, value: object
) -> None:
    client, engine = await make_client(**LLMAPI)
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 4, field: value}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field and engine.requests == []


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
async def test_a_forced_tool_choice_without_guided_decoding_is_a_400(
    make_client: MakeClient, choice: object
) -> None:
    # A tool parser reads the reply, but only guided decoding could make the reply a call.
    client, engine = await make_client(model={"tool_parser": "hermes"}, **LLMAPI)
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    body = {"model": "tiny", "messages": USER, "tools": [tool], "tool_choice": choice, "max_tokens": 4}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "tool_choice" and engine.requests == []
    auto = await client.post("/v1/chat/completions", json={**body, "tool_choice": "auto"})
    assert auto.status_code == 200, auto.text


async def test_thinking_counted_from_the_text_never_exceeds_the_completion_tokens(
    make_client: MakeClient,
) -> None:
    # Cut inside its characters, the reply decodes to U+FFFD, which encodes again to more tokens than
    # were generated; the reply is all thinking (deepseek_r1 starts inside the block), so all of
    # its tokens are thinking tokens.
    client, _engine = await make_client(
        model={"reasoning_parser": "deepseek_r1"}, reply=lambda r, i: "🎉" * 40, **LLMAPI
    )
    body = {"model": "tiny", "messages": USER, "max_tokens": 7}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    message, usage = r.json()["choices"][0]["message"], r.json()["usage"]
    assert message["reasoning_content"] and not message["content"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == usage["completion_tokens"] == 7
