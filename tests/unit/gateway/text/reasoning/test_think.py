"""deepseek_r1 and qwen3: the think block, whole and streamed token by token."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.text.reasoning import (
    FORMATS,
    MODEL_FORMATS,
    ReasoningDelta,
    ReasoningEvent,
    ReasoningOutput,
    check_format,
    get_format,
    parse_reasoning,
)
from gateway.text.reasoning.think import prompt_state
from gateway.text.tool_calls import ContentDelta
from tests.unit.gateway.text.reasoning.toy import MARKER_IDS, format_named, ids_of, tokenize

QWEN3_THINKING = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
QWEN3_NO_THINKING = QWEN3_THINKING + "<think>\n\n</think>\n\n"
THINKING_2507 = QWEN3_THINKING + "<think>\n"


def parse(text: str, fmt: str, prompt: str = "") -> ReasoningOutput:
    return parse_reasoning(text, fmt, prompt=prompt, token_ids=ids_of(tokenize(text)), marker_ids=MARKER_IDS)


def test_the_registry_lists_every_format_by_its_own_name() -> None:
    assert FORMATS == ("deepseek_r1", "qwen3", "gpt_oss")
    # vLLM's name for gpt-oss's parser is accepted too, as the same format.
    assert ("none", *FORMATS, "openai_gptoss") == MODEL_FORMATS
    assert format_named("openai_gptoss") is format_named("gpt_oss")
    assert [format_named(name).name for name in FORMATS] == list(FORMATS)
    assert get_format("none") is None


def test_an_unknown_format_is_a_configuration_error_naming_the_choices() -> None:
    from gateway.errors import ServerConfigError

    with pytest.raises(ServerConfigError, match="none, deepseek_r1, qwen3, gpt_oss"):
        get_format("deepseek")
    assert check_format("qwen3") == "qwen3"


def test_none_leaves_the_whole_reply_as_content() -> None:
    text = "<think>x</think>y"
    assert parse_reasoning(text, "none") == ReasoningOutput(None, text, (), 0)


@pytest.mark.parametrize(
    ("fmt", "prompt", "text", "reasoning", "content", "tokens"),
    [
        # The model writes the whole block.
        (
            "qwen3",
            QWEN3_THINKING,
            "<think>\nLet me add.\n</think>\n\n2 + 2 = 4",
            "Let me add.",
            "2 + 2 = 4",
            13,
        ),
        ("deepseek_r1", "", "<think>\nLet me add.\n</think>\n\n2 + 2 = 4", "Let me add.", "2 + 2 = 4", 13),
        # The template opened it: the reply starts inside.
        ("qwen3", THINKING_2507, "Let me add.\n</think>\n\n2 + 2 = 4", "Let me add.", "2 + 2 = 4", 12),
        ("deepseek_r1", "<｜Assistant｜><think>\n", "Let me add.</think>4", "Let me add.", "4", 11),
        # R1 always thinks, even without the opening marker in the prompt or the reply.
        ("deepseek_r1", "", "Let me add.</think>4", "Let me add.", "4", 11),
        # A reply cut while thinking is all reasoning (R1) ...
        ("deepseek_r1", "", "<think>Still thinking about it", "Still thinking about it", "", 23),
        ("qwen3", THINKING_2507, "Still thinking", "Still thinking", "", 14),
        # ... and the block's interior whitespace is kept, its edges are not.
        ("qwen3", QWEN3_THINKING, "<think> a\n\nb </think> c d ", "a\n\nb", "c d ", 6),
        # The markers after the block are the answer's text.
        ("qwen3", QWEN3_THINKING, "<think>x</think>use <think> tags", "x", "use <think> tags", 1),
    ],
)
def test_the_think_block_is_reasoning_and_the_rest_is_content(
    fmt: str, prompt: str, text: str, reasoning: str, content: str, tokens: int
) -> None:
    assert parse(text, fmt, prompt) == ReasoningOutput(reasoning, content, (), tokens)


@pytest.mark.parametrize(
    ("prompt", "text"),
    [
        (QWEN3_THINKING, "Hello there, no thinking today."),
        # enable_thinking: false renders an empty closed block; the reply is the answer.
        (QWEN3_NO_THINKING, "Hello there, no thinking today."),
        # A closing marker in an answer is not reasoning when the block was closed in the prompt.
        (QWEN3_NO_THINKING, "x </think> y"),
    ],
)
def test_qwen3_without_a_think_block_is_all_content(prompt: str, text: str) -> None:
    assert parse(text, "qwen3", prompt) == ReasoningOutput(None, text, (), 0)


def test_deepseek_r1_with_thinking_closed_in_the_prompt_is_all_content() -> None:
    text = "The answer is 4."
    assert parse(text, "deepseek_r1", "<think>\n\n</think>\n\n") == ReasoningOutput(None, text, (), 0)


def test_leading_whitespace_of_an_answer_without_a_block_is_kept() -> None:
    assert parse("\n  Hi", "qwen3").content == "\n  Hi"


def test_an_empty_block_gives_no_reasoning_and_the_answer() -> None:
    assert parse("<think>\n\n</think>\n\nHi", "qwen3") == ReasoningOutput(None, "Hi", (), 2)


def test_reasoning_tokens_are_zero_without_the_marker_ids() -> None:
    out = parse_reasoning("<think>abc</think>d", "qwen3", token_ids=[1, 2, 3, 4, 5, 6])
    assert (out.reasoning, out.content, out.reasoning_tokens) == ("abc", "d", 0)


@pytest.mark.parametrize(
    ("prompt", "state"),
    [("a<think>\n", True), ("a<think></think>\n\n", False), ("a\n", None), ("<think>x</think>y\n", None)],
)
def test_the_prompt_says_whether_the_template_opened_or_closed_the_block(
    prompt: str, state: bool | None
) -> None:
    assert prompt_state(prompt) is state


# ---------------------------------------------------------------- streaming


def merged(events: list[ReasoningEvent]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for event in events:
        assert isinstance(event, ReasoningDelta | ContentDelta)
        kind = "reasoning" if isinstance(event, ReasoningDelta) else "content"
        assert event.text, "no empty deltas"
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + event.text)
        else:
            out.append((kind, event.text))
    return out


def stream(text: str, fmt: str, prompt: str, cuts: list[int]) -> tuple[list[ReasoningEvent], int]:
    """Feed the tokens of `text` in chunks that end at the token positions `cuts`."""
    tokens = tokenize(text)
    parser = format_named(fmt).parser(prompt=prompt, marker_ids=MARKER_IDS)
    events: list[ReasoningEvent] = []
    start = 0
    for end in [*sorted(set(cuts)), len(tokens)]:
        chunk = tokens[start:end]
        events += parser.feed("".join(t for t, _ in chunk), ids_of(chunk))
        start = max(start, end)
    events += parser.finish()
    return events, parser.reasoning_tokens


def test_streamed_deltas_go_out_as_soon_as_they_are_decided() -> None:
    parser = format_named("qwen3").parser(marker_ids=MARKER_IDS)
    steps = ["<thi", "nk>\nI ", "think </th", "ink>\n", "\nAns", "wer"]
    out = [parser.feed(step) for step in steps]
    assert out == [
        [],
        [ReasoningDelta("I")],  # the space after it may be the block's trailing whitespace
        [ReasoningDelta(" think")],
        [],
        [ContentDelta("Ans")],
        [ContentDelta("wer")],
    ]
    assert parser.finish() == []


# The structure of a reply: leading whitespace, an optional opening marker, the reasoning, the
# closing marker and whitespace, the answer. Text has no markers and is not only whitespace.
_words = st.text(alphabet=st.sampled_from("ab <>/\n你🙂"), min_size=1, max_size=12).filter(
    lambda s: s.strip() and "<think>" not in s and "</think>" not in s
)
_space = st.sampled_from(["", " ", "\n", "\n\n"])


@given(
    fmt_prompt=st.sampled_from([("deepseek_r1", ""), ("deepseek_r1", "<think>\n"), ("qwen3", THINKING_2507)]),
    opened=st.booleans(),
    lead=_space,
    reasoning=_words,
    gap=_space,
    content=st.one_of(st.just(""), _words),
    data=st.data(),
)
def test_any_split_of_a_reply_that_starts_in_the_block_gives_its_reasoning_and_content(
    fmt_prompt: tuple[str, str],
    opened: bool,
    lead: str,
    reasoning: str,
    gap: str,
    content: str,
    data: st.DataObject,
) -> None:
    fmt, prompt = fmt_prompt
    text = lead + ("<think>" if opened else "") + lead + reasoning + gap + "</think>" + gap + content
    whole = parse(text, fmt, prompt)
    assert whole.reasoning == reasoning.strip()
    assert whole.content == content.lstrip()
    # Every token inside the block but the markers, its whitespace included.
    assert whole.reasoning_tokens == len(lead + lead + reasoning + gap)

    cuts = data.draw(st.lists(st.integers(0, len(tokenize(text))), max_size=8))
    events, tokens = stream(text, fmt, prompt, cuts)
    expected = [("reasoning", whole.reasoning)] + ([("content", whole.content)] if whole.content else [])
    assert merged(events) == expected
    assert tokens == whole.reasoning_tokens


@given(
    reasoning=_words,
    content=st.one_of(st.just(""), _words),
    closed=st.booleans(),
    data=st.data(),
)
def test_any_split_of_a_qwen3_reply_gives_the_same_reasoning_and_content(
    reasoning: str, content: str, closed: bool, data: st.DataObject
) -> None:
    text = "<think>\n" + reasoning + ("\n</think>\n\n" + content if closed else "")
    whole = parse(text, "qwen3", QWEN3_THINKING)
    assert whole.reasoning == reasoning.strip()
    assert whole.content == (content.lstrip() if closed else "")

    cuts = data.draw(st.lists(st.integers(0, len(tokenize(text))), max_size=8))
    events, tokens = stream(text, "qwen3", QWEN3_THINKING, cuts)
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == whole.reasoning
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == whole.content
    assert tokens == whole.reasoning_tokens == len(reasoning) + (1 if closed else 0) + 1


_pieces = st.sampled_from(["a", "b", " ", "\n", "<", ">", "/", "<think>", "</think>", "</th", "ink>", "你"])


@given(pieces=st.lists(_pieces, max_size=30), data=st.data())
def test_any_split_of_arbitrary_text_gives_the_same_events(pieces: list[str], data: st.DataObject) -> None:
    text = "".join(pieces)
    for fmt, prompt in (("qwen3", ""), ("qwen3", THINKING_2507), ("deepseek_r1", "")):
        whole = merged(stream(text, fmt, prompt, [])[0])
        cuts = data.draw(st.lists(st.integers(0, len(tokenize(text))), max_size=10))
        assert merged(stream(text, fmt, prompt, cuts)[0]) == whole
