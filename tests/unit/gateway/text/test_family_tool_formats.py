"""Tool calls and reasoning in each family's own format, as real token sequences: the family's
tokenizer encodes the text the model writes (its markers are its own single ids), and the ids go
through the gateway's streaming path token by token, whole, and cut at every position; every way
gives the same thinking, content and calls, and the streamed arguments are always valid JSON so far."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tests.unit.gateway.text.family_replies import (
    assert_json_prefixes,
    calls,
    encode,
    family_tokenizer,
    run_reply,
    run_text,
)

PARIS = {"city": "Paris", "days": 3}
CET = {"zone": "CET"}
DS_CALL = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"


@dataclass(frozen=True)
class Case:
    id: str
    family: str
    tool_parser: str
    reasoning_parser: str
    text: str  # what the model writes, end token included
    reasoning: str | None
    content: str | None
    calls: list[tuple[str, Any]]
    markers: tuple[str, ...]  # the family's own tokens, each one id
    prompt: str = ""


CASES = [
    Case(
        "llama3_1-json",
        "llama3_1",
        "llama3_json",
        "none",
        '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}<|eom_id|>',
        None,
        None,
        [("get_weather", PARIS)],
        ("<|eom_id|>",),
    ),
    Case(
        "llama3_1-python-tag",
        "llama3_1",
        "llama3_json",
        "none",
        "Let me look.<|python_tag|>"
        '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}<|eom_id|>',
        None,
        "Let me look.",
        [("get_weather", PARIS)],
        ("<|python_tag|>", "<|eom_id|>"),
    ),
    Case(
        "llama3_1-parallel",
        "llama3_1",
        "llama3_json",
        "none",
        '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}; '
        '{"name": "get_time", "parameters": {"zone": "CET"}}<|eot_id|>',
        None,
        None,
        [("get_weather", PARIS), ("get_time", CET)],
        ("<|eot_id|>",),
    ),
    Case(
        "qwen3-hermes-thinking",
        "qwen3",
        "hermes",
        "qwen3",
        "<think>\nThe user wants the weather and the time.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call><|im_end|>',
        "The user wants the weather and the time.",
        None,
        [("get_weather", PARIS), ("get_time", CET)],
        ("<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_end|>"),
    ),
    Case(
        "qwen3-hermes-template-opened-think",
        "qwen3",
        "hermes",
        "qwen3",
        "Weather first.\n</think>\n\nSure.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
        "</tool_call><|im_end|>",
        "Weather first.",
        "Sure.",
        [("get_weather", PARIS)],
        ("</think>", "<tool_call>"),
        prompt="<|im_start|>assistant\n<think>\n",
    ),
    Case(
        "qwen3-hermes-thinking-off",
        "qwen3",
        "hermes",
        "qwen3",
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call><|im_end|>',
        None,
        None,
        [("get_time", CET)],
        ("<tool_call>",),
        prompt="<|im_start|>assistant\n<think>\n\n</think>\n\n",
    ),
    Case(
        "qwen3-coder-xml",
        "qwen3",
        "qwen3_coder",
        "qwen3",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n</function>\n</tool_call><|im_end|>",
        None,
        None,
        [("get_weather", PARIS), ("get_time", CET)],
        ("<tool_call>", "</tool_call>"),
    ),
    Case(
        "qwen3-coder-xml-multiline-text",
        "qwen3",
        "qwen3_coder",
        "none",
        "Checking.\n<tool_call>\n<function=get_weather>\n"
        '<parameter=city>\nSão Paulo\n"centro"\n</parameter>\n'
        "</function>\n</tool_call><|im_end|>",
        None,
        "Checking.",
        [("get_weather", {"city": 'São Paulo\n"centro"'})],
        ("<tool_call>",),
    ),
    Case(
        "deepseek_r1-thinking",
        "deepseek_r1",
        "deepseek_v3",
        "deepseek_r1",
        "The user asks for two things.\n</think>\n\n<｜tool▁calls▁begin｜>"
        + DS_CALL.format(name="get_weather", args='{"city": "Paris", "days": 3}')
        + "\n"
        + DS_CALL.format(name="get_time", args='{"zone": "CET"}')
        + "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
        "The user asks for two things.",
        None,
        [("get_weather", PARIS), ("get_time", CET)],
        (
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁sep｜>",
            "<｜tool▁call▁end｜>",
            "</think>",
        ),
    ),
    Case(
        "deepseek_v3-content-then-call",
        "deepseek_v3",
        "deepseek_v3",
        "none",
        "Checking the weather.<｜tool▁calls▁begin｜>"
        + DS_CALL.format(name="get_weather", args='{"city": "Paris", "days": 3}')
        + "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
        None,
        "Checking the weather.",
        [("get_weather", PARIS)],
        ("<｜tool▁calls▁end｜>", "<｜end▁of▁sentence｜>"),
    ),
    Case(
        "gptoss-harmony-call",
        "gptoss",
        "openai",
        "none",
        "<|channel|>analysis<|message|>Need the weather in Paris.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "Paris", "days": 3}<|call|>',
        "Need the weather in Paris.",
        "",
        [("get_weather", PARIS)],
        ("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|constrain|>", "<|call|>"),
    ),
    Case(
        "gptoss-harmony-final",
        "gptoss",
        "openai",
        "openai_gptoss",
        "<|channel|>analysis<|message|>Simple greeting.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Bonjour ! 😀 你好<|return|>",
        "Simple greeting.",
        "Bonjour ! 😀 你好",
        [],
        ("<|channel|>", "<|return|>"),
    ),
]


def _ids(case: Case) -> list[int]:
    tok = family_tokenizer(case.family)
    for marker in case.markers:
        # The family's own id for its marker, not a spelling of it in pieces.
        assert len(tok.encode(marker, add_special_tokens=False)) == 1, marker
    return encode(case.family, case.text)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_family_reply_streamed_token_by_token_and_whole(case: Case) -> None:
    ids = _ids(case)
    whole = run_reply(
        case.family,
        ids,
        tool_parser=case.tool_parser,
        reasoning_parser=case.reasoning_parser,
        prompt=case.prompt,
    )
    assert whole.finish_reason == "stop"
    assert whole.reply.reasoning == case.reasoning
    assert (whole.reply.content or None) == (case.content or None)
    assert calls(whole.reply) == case.calls
    streamed = run_reply(
        case.family,
        ids,
        tool_parser=case.tool_parser,
        reasoning_parser=case.reasoning_parser,
        prompt=case.prompt,
        splits=range(1, len(ids)),
    )
    assert (streamed.reply.reasoning, streamed.reply.content) == (whole.reply.reasoning, whole.reply.content)
    assert calls(streamed.reply) == case.calls
    assert_json_prefixes(streamed.fragments)
    if case.calls and case.tool_parser != "qwen3_coder":
        # The arguments arrive as the model writes them, not in one piece at the end.
        assert len(streamed.fragments[0]) > 1


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_every_two_way_split_gives_the_same_reply(case: Case) -> None:
    ids = _ids(case)
    kwargs = {
        "tool_parser": case.tool_parser,
        "reasoning_parser": case.reasoning_parser,
        "prompt": case.prompt,
    }
    whole = run_reply(case.family, ids, **kwargs)
    want = (whole.reply.reasoning, whole.reply.content, calls(whole.reply))
    for cut in range(1, len(ids)):
        got = run_reply(case.family, ids, splits=[cut], **kwargs)
        assert (got.reply.reasoning, got.reply.content, calls(got.reply)) == want, cut


@pytest.mark.parametrize("case", [c for c in CASES if c.calls], ids=lambda c: c.id)
def test_a_reply_cut_by_the_token_limit_keeps_its_committed_calls(case: Case) -> None:
    """Cut after every token: streamed and whole agree, no committed call is taken back, and a
    call's arguments are a prefix of the whole call's."""
    ids = _ids(case)
    kwargs = {
        "tool_parser": case.tool_parser,
        "reasoning_parser": case.reasoning_parser,
        "prompt": case.prompt,
    }
    full = run_reply(case.family, ids, **kwargs)
    seen = 0
    for limit in range(1, len(ids)):
        cut = ids[:limit]
        whole = run_reply(case.family, cut, max_tokens=limit, **kwargs)
        streamed = run_reply(case.family, cut, max_tokens=limit, splits=range(1, limit), **kwargs)
        assert whole.finish_reason == "length"
        assert (streamed.reply.content, streamed.reply.reasoning) == (
            whole.reply.content,
            whole.reply.reasoning,
        )
        assert [(c.name, c.arguments) for c in streamed.reply.tool_calls] == [
            (c.name, c.arguments) for c in whole.reply.tool_calls
        ]
        assert_json_prefixes(streamed.fragments)
        assert len(whole.reply.tool_calls) >= seen, limit
        seen = len(whole.reply.tool_calls)
        for got, final in zip(whole.reply.tool_calls, full.reply.tool_calls, strict=False):
            assert got.name == final.name
            if case.tool_parser != "qwen3_coder":
                assert final.arguments.startswith(got.arguments)


# A forced tool choice under guided decoding: the reply is the guide's JSON from its first token
# (see tool_call_json_schema), whatever the family, and is parsed as a call whatever cuts it.
FORCED = [
    # DeepSeek-R1's template opens the think block, and its parser starts there: the call is still a call.
    ("deepseek_r1", "deepseek_v3", "deepseek_r1", "<｜Assistant｜><think>\n", "get_weather", "arguments",
     '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}<｜end▁of▁sentence｜>'),
    ("qwen3", "hermes", "qwen3", "<|im_start|>assistant\n", "get_weather", "arguments",
     '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}<|im_end|>'),
    ("llama3_1", "llama3_json", "none", "", "get_weather", "parameters",
     '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}<|eot_id|>'),
]  # fmt: skip


@pytest.mark.parametrize(
    ("family", "tool_parser", "reasoning_parser", "prompt", "name", "key", "text"), FORCED
)
def test_a_forced_call_is_a_call_from_its_first_token_whatever_cuts_it(
    family: str, tool_parser: str, reasoning_parser: str, prompt: str, name: str, key: str, text: str
) -> None:
    ids = encode(family, text)
    kwargs: dict[str, Any] = {
        "tool_parser": tool_parser,
        "reasoning_parser": reasoning_parser,
        "prompt": prompt,
        "forced": True,
        "forced_name": name,
    }
    full = run_reply(family, ids, **kwargs)
    assert (full.reply.reasoning, full.reply.content) == (None, "")
    assert calls(full.reply) == [(name, PARIS)]
    for limit in range(1, len(ids)):
        for splits in ((), range(1, limit)):
            got = run_reply(family, ids[:limit], max_tokens=limit, splits=splits, **kwargs)
            # Never thinking, never content (not even `{"name`): one call of the named function.
            assert (got.reply.reasoning, got.reply.content) == (None, ""), limit
            assert [c.name for c in got.reply.tool_calls] == [name], limit
            assert full.reply.tool_calls[0].arguments.startswith(got.reply.tool_calls[0].arguments)
            assert_json_prefixes(got.fragments)
        # The call is announced with the reply's first token, before its name is written.
        first = run_reply(family, ids[:1], max_tokens=1, **kwargs)
        assert [c.name for c in first.reply.tool_calls] == [name]


def test_a_required_call_among_several_tools_is_announced_once_its_name_is_written() -> None:
    text = (
        '[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
        '{"name": "get_time", "arguments": {"zone": "CET"}}]<|im_end|>'
    )
    ids = encode("qwen3", text)
    kwargs: dict[str, Any] = {"tool_parser": "hermes", "reasoning_parser": "qwen3", "forced": True}
    full = run_reply("qwen3", ids, **kwargs)
    assert calls(full.reply) == [("get_weather", PARIS), ("get_time", CET)]
    named = len(encode("qwen3", '[{"name": "get_weather", "arguments": {'))
    for limit in range(1, len(ids)):
        got = run_reply("qwen3", ids[:limit], max_tokens=limit, splits=range(1, limit), **kwargs)
        assert (got.reply.reasoning, got.reply.content) == (None, ""), limit
        if limit >= named:
            assert got.reply.tool_calls[0].name == "get_weather"
        else:
            assert not got.reply.tool_calls


# The end tokens a reply's text may end with (never text: the engine's end ids).
END_TOKENS = ("<|eom_id|>", "<|eot_id|>", "<|im_end|>", "<｜end▁of▁sentence｜>", "<|call|>", "<|return|>")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_any_split_of_the_text_gives_the_same_reply(case: Case) -> None:
    """A guided engine may tokenize the same text otherwise than the tokenizer does: the parsers
    give the same reply fed one character at a time."""
    text = case.text
    for end in END_TOKENS:
        text = text.removesuffix(end)
    kwargs: dict[str, Any] = {
        "tool_parser": case.tool_parser,
        "reasoning_parser": case.reasoning_parser,
        "prompt": case.prompt,
    }
    for step in (None, 1):
        reply = run_text(text, step=step, **kwargs)
        want = (case.reasoning, case.content or None, case.calls)
        assert (reply.reasoning, reply.content or None, calls(reply)) == want
