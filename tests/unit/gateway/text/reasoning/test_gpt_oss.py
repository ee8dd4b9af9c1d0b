"""gpt_oss: the harmony channels, whole and streamed token by token."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.text.reasoning import (
    ReasoningDelta,
    ReasoningEvent,
    ReasoningOutput,
    parse_reasoning,
)
from gateway.text.tool_calls import ContentDelta, JsonScanner, ToolCall, ToolCallArguments, ToolCallStart
from tests.unit.gateway.text.family_replies import harmony_encoding
from tests.unit.gateway.text.reasoning.toy import MARKER_IDS, Counter, format_named, ids_of, tokenize

ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather. Call the tool.<|end|>"
NEXT = "<|start|>assistant"
CALL = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
FINAL = "<|channel|>final<|message|>It is sunny in Paris.<|return|>"
THOUGHT = "The user wants the weather. Call the tool."


@pytest.fixture(autouse=True, scope="module")
def _loaded() -> None:
    # The encoding loads once (a second or so), before hypothesis times its examples.
    harmony_encoding()


def parse(text: str) -> ReasoningOutput:
    return parse_reasoning(
        text,
        "gpt_oss",
        token_ids=ids_of(tokenize(text)),
        marker_ids=MARKER_IDS,
        make_id=Counter(),
        encoding=harmony_encoding(),
    )


def weather(arguments: str = '{"city":"Paris"}', index: int = 1) -> ToolCall:
    return ToolCall(f"call_{index}", "get_weather", arguments)


def test_the_format_keeps_special_tokens_and_names_its_markers() -> None:
    fmt = format_named("gpt_oss")
    assert fmt.keeps_special_tokens
    vocab = {"<|message|>": 7, "<|end|>": 8, "hello": 9}
    assert fmt.marker_ids(vocab) == {"<|message|>": 7, "<|end|>": 8}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            ANALYSIS + NEXT + FINAL,
            ReasoningOutput(THOUGHT, "It is sunny in Paris.", (), len(THOUGHT)),
            id="analysis-then-final",
        ),
        pytest.param(
            ANALYSIS + NEXT + FINAL.removesuffix("<|return|>"),
            ReasoningOutput(THOUGHT, "It is sunny in Paris.", (), len(THOUGHT)),
            id="end-of-generation-token-stripped",
        ),
        pytest.param(
            ANALYSIS + NEXT + CALL,
            ReasoningOutput(THOUGHT, "", (weather(),), len(THOUGHT)),
            id="analysis-then-tool-call",
        ),
        pytest.param(
            ANALYSIS
            + "<|start|>assistant to=functions.get_weather<|channel|>commentary json"
            + '<|message|>{"city": "Oslo"}<|call|>',
            ReasoningOutput(THOUGHT, "", (weather('{"city":"Oslo"}'),), len(THOUGHT)),
            id="recipient-after-the-role",
        ),
        pytest.param(
            ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}<|call|>',
            ReasoningOutput(None, "", (weather('{"city":"Oslo"}'),), 0),
            id="recipient-right-after-the-prompts-role",
        ),
        pytest.param(
            "<|channel|><|message|>Header without a channel name.<|end|>" + NEXT + FINAL,
            ReasoningOutput(None, "Header without a channel name.\nIt is sunny in Paris.", (), 0),
            id="a-header-the-library-cannot-read-makes-its-body-content",
        ),
        pytest.param(
            ANALYSIS + NEXT + "<|channel|>final<|message|>Left open" + NEXT + FINAL,
            ReasoningOutput(THOUGHT, "Left open\nIt is sunny in Paris.", (), len(THOUGHT)),
            id="a-body-left-open-ends-at-the-next-header",
        ),
        pytest.param(
            "<|channel|>commentary<|message|>Checking the weather.<|end|>" + NEXT + CALL,
            ReasoningOutput(None, "Checking the weather.", (weather(),), 0),
            id="preamble-is-content",
        ),
        pytest.param(
            ANALYSIS
            + NEXT
            + CALL.removesuffix("<|call|>")
            + "<|end|>"
            + NEXT
            + CALL.replace("Paris", "Rome"),
            ReasoningOutput(THOUGHT, "", (weather(), weather('{"city":"Rome"}', 2)), len(THOUGHT)),
            id="two-calls",
        ),
        pytest.param(
            "<|channel|>analysis<|message|>First.<|end|>"
            + NEXT
            + "<|channel|>analysis<|message|>Second.<|end|>"
            + NEXT
            + "<|channel|>final<|message|>Done.",
            ReasoningOutput("First.\nSecond.", "Done.", (), 13),
            id="two-analysis-messages-joined-by-a-newline",
        ),
        pytest.param(
            '<|channel|>analysis to=browser.search <|constrain|>json<|message|>{"q": "x"}<|call|>',
            ReasoningOutput('{"q": "x"}', "", (), 10),
            id="built-in-tool-call-is-reasoning",
        ),
        pytest.param(
            "Plain text from a model that ignores the format.",
            ReasoningOutput(None, "Plain text from a model that ignores the format.", (), 0),
            id="no-header-is-content",
        ),
        pytest.param(
            ANALYSIS + "\n" + NEXT + "<|channel|>final<|end|>" + NEXT + FINAL + "\n",
            ReasoningOutput(THOUGHT, "It is sunny in Paris.", (), len(THOUGHT)),
            id="whitespace-between-messages-and-an-empty-header-are-dropped",
        ),
        pytest.param(
            ANALYSIS + NEXT + "<|channel|>final<|message|>Cut in the midd",
            ReasoningOutput(THOUGHT, "Cut in the midd", (), len(THOUGHT)),
            id="cut-by-the-token-limit",
        ),
        pytest.param(
            "<|channel|>analysis<|message|>Thinking and cut",
            ReasoningOutput("Thinking and cut", "", (), 16),
            id="cut-while-thinking",
        ),
    ],
)
def test_channels_go_to_reasoning_content_and_tool_calls(text: str, expected: ReasoningOutput) -> None:
    assert parse(text) == expected


def test_a_tool_call_is_announced_at_its_header_and_its_arguments_stream() -> None:
    parser = format_named("gpt_oss").parser(
        marker_ids=MARKER_IDS, make_id=Counter(), encoding=harmony_encoding()
    )
    steps = [
        "<|channel|>analysis<|message|>Need weather",
        ".<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather",
        " <|constrain|>json<|message|>",
        '{"city": ',
        '"Paris"}<|',
        "call|>",
    ]
    assert [parser.feed(step) for step in steps] == [
        [ReasoningDelta("Need weather")],
        [ReasoningDelta(".")],
        [ToolCallStart(0, "call_1", "get_weather")],
        [ToolCallArguments(0, '{"city":')],
        [ToolCallArguments(0, '"Paris"}')],
        [],
    ]
    assert parser.finish() == []
    assert parser.tool_calls == 1


# ---------------------------------------------------------------- any split


def normalized(events: list[ReasoningEvent]) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for event in events:
        if isinstance(event, ReasoningDelta | ContentDelta):
            kind = "reasoning" if isinstance(event, ReasoningDelta) else "content"
            assert event.text
            if out and out[-1][0] == kind:
                out[-1] = (kind, str(out[-1][1]) + event.text)
            else:
                out.append((kind, event.text))
        elif isinstance(event, ToolCallStart):
            out.append(("call", (event.index, event.id, event.name)))
        else:
            key = f"arguments{event.index}"
            assert event.arguments
            if out and out[-1][0] == key:
                out[-1] = (key, str(out[-1][1]) + event.arguments)
            else:
                out.append((key, event.arguments))
    return out


def stream(text: str, cuts: list[int]) -> tuple[list[ReasoningEvent], int]:
    tokens = tokenize(text)
    parser = format_named("gpt_oss").parser(
        marker_ids=MARKER_IDS, make_id=Counter(), encoding=harmony_encoding()
    )
    events: list[ReasoningEvent] = []
    start = 0
    for end in [*sorted(set(cuts)), len(tokens)]:
        chunk = tokens[start:end]
        events += parser.feed("".join(t for t, _ in chunk), ids_of(chunk))
        start = max(start, end)
    events += parser.finish()
    return events, parser.reasoning_tokens


_body = st.text(alphabet=st.sampled_from('ab {}":<|>\n你🙂'), min_size=1, max_size=12).filter(
    lambda s: s.strip() and "<|" not in s
)
_message = st.tuples(st.sampled_from(["analysis", "final", "commentary", "call"]), _body)


@given(messages=st.lists(_message, min_size=1, max_size=4), returned=st.booleans(), data=st.data())
def test_any_split_of_a_harmony_reply_gives_its_channels(
    messages: list[tuple[str, str]], returned: bool, data: st.DataObject
) -> None:
    parts: list[str] = []
    for i, (channel, body) in enumerate(messages):
        head = "" if i == 0 else "<|start|>assistant"
        if channel == "call":
            header = "<|channel|>commentary to=functions.f <|constrain|>json"
        else:
            header = f"<|channel|>{channel}"
        last = i == len(messages) - 1
        end = ("<|return|>" if returned else "") if last else ("<|call|>" if channel == "call" else "<|end|>")
        parts.append(head + header + "<|message|>" + body + end)
    text = "".join(parts)

    whole = parse(text)
    thoughts = [body for channel, body in messages if channel == "analysis"]
    answers = [body for channel, body in messages if channel in ("final", "commentary")]
    calls = [body for channel, body in messages if channel == "call"]
    assert whole.reasoning == ("\n".join(thoughts) or None)
    assert whole.content == "\n".join(answers)
    assert [(c.name, c.arguments) for c in whole.tool_calls] == [("f", json_prefix(body)) for body in calls]
    assert whole.reasoning_tokens == sum(len(body) for body in thoughts)

    cuts = data.draw(st.lists(st.integers(0, len(tokenize(text))), max_size=10))
    events, tokens = stream(text, cuts)
    assert normalized(events) == normalized(stream(text, [])[0])
    assert tokens == whole.reasoning_tokens


_pieces = st.sampled_from(
    [
        "a",
        " ",
        "\n",
        "<|",
        "|>",
        "<|start|>",
        "assistant",
        "<|channel|>",
        "analysis",
        "final",
        "commentary",
        " to=functions.f",
        "<|constrain|>",
        "json",
        "<|message|>",
        "<|end|>",
        "<|call|>",
        "<|return|>",
        "<|mess",
        "age|>",
    ]
)


@given(pieces=st.lists(_pieces, max_size=30), data=st.data())
def test_any_split_of_arbitrary_text_gives_the_same_events(pieces: list[str], data: st.DataObject) -> None:
    text = "".join(pieces)
    whole, tokens = stream(text, [])
    cuts = data.draw(st.lists(st.integers(0, len(tokenize(text))), max_size=10))
    split, split_tokens = stream(text, cuts)
    assert normalized(split) == normalized(whole)
    assert split_tokens == tokens


def json_prefix(body: str) -> str:
    """The arguments a call's body gives: its JSON object text as far as it goes, compact."""
    return JsonScanner(object_only=True).feed(body)


@pytest.mark.parametrize(
    ("body", "arguments"),
    [
        pytest.param(
            '\n{"a": [1, 2],\n "b": "x y"}\n', '{"a":[1,2],"b":"x y"}', id="whitespace-between-tokens"
        ),
        pytest.param('{"city": "Par', '{"city":"Par', id="cut"),
        pytest.param("{not json", "{", id="stops-being-json"),
        pytest.param("not json", "", id="not-an-object"),
    ],
)
def test_arguments_are_read_as_the_tool_call_parsers_read_them(body: str, arguments: str) -> None:
    out = parse(f"<|channel|>commentary to=functions.f<|message|>{body}<|call|>")
    assert out.tool_calls == (ToolCall("call_1", "f", arguments),)
