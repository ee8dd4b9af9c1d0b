"""The parsers fed as the streaming state machine feeds them: one decoded token at a time from the
agent tiny model's real tokenizer (gpt-oss's own for harmony, whose parser needs its vocabulary), with
the marker ids looked up in its vocabulary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.text.detokenizer import IncrementalDetokenizer
from gateway.text.reasoning import ReasoningDelta, ReasoningEvent, parse_reasoning
from gateway.text.tool_calls import ContentDelta, ToolCallArguments, ToolCallStart
from tests.unit.gateway.text.family_replies import family_dir, reply_encoding
from tests.unit.gateway.text.reasoning.toy import format_named


@pytest.fixture(scope="module")
def tokenizer(tiny_agent_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_agent_dir)


@pytest.fixture(scope="module")
def gptoss() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(family_dir("gptoss"))


def stream(tokenizer: Any, fmt_name: str, text: str, prompt: str) -> tuple[list[ReasoningEvent], int]:
    fmt = format_named(fmt_name)
    ids = tokenizer.encode(text, add_special_tokens=False)
    decoder = IncrementalDetokenizer(tokenizer, skip_special_tokens=not fmt.keeps_special_tokens)
    parser = fmt.parser(
        prompt=prompt, marker_ids=fmt.marker_ids(tokenizer.get_vocab()), encoding=reply_encoding(fmt)
    )
    events: list[ReasoningEvent] = []
    for token_id in ids:
        events += parser.feed(decoder.push_ids([token_id]), [token_id])
    events += parser.feed(decoder.flush())
    events += parser.finish()
    return events, parser.reasoning_tokens


def test_qwen3_token_by_token_with_the_template_opening_the_block(tokenizer: Any) -> None:
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True, enable_thinking=True
    )
    thought = "The user greets me. 你好 🙂 is a fine reply."
    text = f"{thought}\n</think>\n\nHello! 你好 🙂"
    events, tokens = stream(tokenizer, "qwen3", text, prompt)

    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == thought
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == "Hello! 你好 🙂"
    # Every token before `</think>` is a thought; `</think>` itself is one token, not counted.
    assert tokens == len(tokenizer.encode(thought + "\n", add_special_tokens=False))
    whole = parse_reasoning(
        text,
        "qwen3",
        prompt=prompt,
        token_ids=tokenizer.encode(text, add_special_tokens=False),
        marker_ids=format_named("qwen3").marker_ids(tokenizer.get_vocab()),
    )
    assert (whole.reasoning, whole.content, whole.reasoning_tokens) == (thought, "Hello! 你好 🙂", tokens)


def test_gpt_oss_token_by_token_sees_the_special_markers(gptoss: Any) -> None:
    tokenizer = gptoss
    text = (
        "<|channel|>analysis<|message|>Need the weather for Paris.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Paris"}<|call|>'
    )
    # The markers are special: a default decode would drop them and leave nothing to parse.
    assert "<|channel|>" not in tokenizer.decode(tokenizer.encode(text), skip_special_tokens=True)
    events, tokens = stream(tokenizer, "gpt_oss", text, "<|start|>assistant")

    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "Need the weather for Paris."
    assert not any(isinstance(e, ContentDelta) for e in events)
    (start,) = (e for e in events if isinstance(e, ToolCallStart))
    assert start.name == "get_weather"
    arguments = [e.arguments for e in events if isinstance(e, ToolCallArguments)]
    assert len(arguments) > 1, "the arguments stream as they are decoded"
    assert "".join(arguments) == '{"city":"Paris"}'
    assert tokens == len(tokenizer.encode("Need the weather for Paris.", add_special_tokens=False))
