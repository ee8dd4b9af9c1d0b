"""The reply chain every API runs: the reasoning parser, then the tool-call parser on the answer,
streamed in any split or whole, with the thinking's tokens counted from the ids (or the text)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.text.reasoning import ReasoningDelta, get_format
from gateway.text.reply import ParsedReply, ReplyCollector, ReplyParser, parse_reply
from gateway.text.tokenizer import Tokenizer
from gateway.text.tool_calls import ContentDelta, StreamingToolParser, ToolCallStart
from tests.support.tokenizers import loaded_tokenizer
from tests.unit.gateway.text.family_replies import reply_encoding

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def parser(
    reasoning: str | None,
    tool_format: str = "hermes",
    *,
    prompt: str = "",
    marker_ids: dict[str, int] | None = None,
) -> ReplyParser:
    make_id = ids()
    fmt = get_format(reasoning) if reasoning else None
    return ReplyParser(
        reasoning=fmt.parser(
            prompt=prompt, marker_ids=marker_ids, make_id=make_id, encoding=reply_encoding(fmt)
        )
        if fmt
        else None,
        tools=StreamingToolParser(tool_format, tool_names={"get_weather"}, make_id=make_id)
        if tool_format != "none"
        else None,
    )


def streamed(p: ReplyParser, pieces: list[str]) -> ParsedReply:
    collector = ReplyCollector()
    for piece in pieces:
        collector.add(p.feed(piece))
    collector.add(p.finish())
    return collector.reply()


def test_a_tool_call_after_thinking_is_parsed_and_the_thinking_kept_apart() -> None:
    reply = parse_reply(parser("deepseek_r1"), "<think>Needs a tool.</think>Checking." + CALL)
    assert (reply.reasoning, reply.content) == ("Needs a tool.", "Checking.")
    (call,) = reply.tool_calls
    assert (call.id, call.name, json.loads(call.arguments)) == ("call_0", "get_weather", {"city": "Paris"})


def test_a_call_written_inside_the_thinking_is_thinking_not_a_call() -> None:
    reply = parse_reply(parser("qwen3"), "<think>Maybe " + CALL + "</think>No call.")
    assert reply == ParsedReply("Maybe " + CALL, "No call.", ())


def test_without_a_reasoning_format_the_chain_is_the_tool_call_parser() -> None:
    reply = parse_reply(parser(None), "<think>x</think>Checking." + CALL)
    assert reply.reasoning is None and reply.content == "<think>x</think>Checking."
    assert [c.name for c in reply.tool_calls] == ["get_weather"]
    plain = parse_reply(parser(None, "none"), "just text")
    assert plain == ParsedReply(None, "just text", ())


def test_gpt_oss_calls_come_from_the_reasoning_parser_and_pass_through() -> None:
    text = (
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
    )
    p = parser("gpt_oss", "none")
    reply = parse_reply(p, text)
    assert (reply.reasoning, reply.content) == ("Need weather.", "")
    (call,) = reply.tool_calls
    assert (call.id, call.name, json.loads(call.arguments)) == ("call_0", "get_weather", {"city": "Paris"})
    assert p.tool_calls == 1


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_any_split_of_the_reply_gives_the_same_thinking_answer_and_calls(data: st.DataObject) -> None:
    text = "<think>\nWeather needs a tool: </thin k> is not the end.\n</think>\n\nChecking. " + CALL + " done"
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(text) - 1), max_size=12))))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assert streamed(parser("deepseek_r1"), pieces) == parse_reply(parser("deepseek_r1"), text)


@pytest.fixture(scope="module")
def agent(tiny_agent_dir: Path) -> Tokenizer:
    return loaded_tokenizer(tiny_agent_dir)


def test_thinking_tokens_are_counted_from_the_ids_without_the_markers(agent: Tokenizer) -> None:
    fmt = get_format("qwen3")
    assert fmt is not None
    thought = "The user greets me, 你好."
    text = f"<think>{thought}</think>Hello!" + CALL
    token_ids = agent.encode(text, add_special_tokens=False)
    p = parser("qwen3", marker_ids=fmt.marker_ids(agent.vocab))
    events = [e for i in token_ids for e in p.feed(agent.decode([i], skip_special_tokens=False), [i])]
    events += p.finish()
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == thought
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == "Hello!"
    assert [e.name for e in events if isinstance(e, ToolCallStart)] == ["get_weather"]
    assert p.reasoning_tokens == len(agent.encode(thought, add_special_tokens=False)) > 0


def test_without_ids_the_thinking_is_counted_by_encoding_it(agent: Tokenizer) -> None:
    fmt = get_format("deepseek_r1")
    assert fmt is not None
    thought = "Short thought here"
    p = ReplyParser(
        reasoning=fmt.parser(),
        count_text=lambda t: len(agent.encode(t, add_special_tokens=False)),
    )
    parsed = parse_reply(p, f"{thought}</think>Answer")
    assert parsed.reasoning == thought
    assert p.reasoning_tokens == len(agent.encode(thought, add_special_tokens=False)) > 0
    # No thinking, nothing counted.
    empty = ReplyParser(reasoning=fmt.parser(), count_text=lambda t: len(t))
    parse_reply(empty, "</think>Answer")
    assert empty.reasoning_tokens == 0


def test_thinking_counted_from_text_never_exceeds_the_replys_own_count() -> None:
    fmt = get_format("deepseek_r1")
    assert fmt is not None

    # Text encoded again can take more tokens than were generated (a random model's byte tokens):
    # here one per character, where the choice counted 5 (say, max_tokens, the reason length).
    def counted(completion: int) -> ReplyParser:
        return ReplyParser(reasoning=fmt.parser(), count_text=len, completion_tokens=lambda: completion)

    all_thinking = counted(5)
    assert parse_reply(all_thinking, "a long thought").content == ""
    # All of the reply was thinking: all of its tokens are, however the text encodes again.
    assert all_thinking.reasoning_tokens == 5
    assert counted(40).reasoning_tokens == 0  # nothing fed, nothing thought
    whole = counted(40)
    parse_reply(whole, "a long thought")
    assert whole.reasoning_tokens == 40
    # With an answer, the thinking's own count, never above the reply's.
    split = counted(5)
    parse_reply(split, "a long thought</think>Answer")
    assert split.reasoning_tokens == 5
    roomy = counted(40)
    parse_reply(roomy, "a long thought</think>Answer")
    assert roomy.reasoning_tokens == len("a long thought")


def test_a_harmony_tool_parser_reads_replies_with_the_channel_parser() -> None:
    from gateway.text.reasoning import get_format
    from gateway.text.reply import reasoning_format_of

    harmony = get_format("gpt_oss")
    assert reasoning_format_of("none", "openai") is harmony
    assert reasoning_format_of("openai_gptoss", "none") is harmony
    assert reasoning_format_of("none", "hermes") is None
    assert reasoning_format_of("qwen3", "qwen3_coder") is get_format("qwen3")
