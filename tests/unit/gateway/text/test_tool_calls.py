from __future__ import annotations

import itertools
import json
from typing import Any

import jiter
import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidRequestError, ServerConfigError
from gateway.text.tool_calls import (
    ContentDelta,
    FunctionTool,
    ParsedOutput,
    StreamingToolParser,
    ToolCallArguments,
    ToolCallEvent,
    ToolCallStart,
    ToolChoice,
    finish_reason,
    new_tool_call_id,
    output_format,
    parse_tool_calls,
    resolve_tool_choice,
    tool_call_json_schema,
    validate_tools,
)


def calls_of(parsed: ParsedOutput) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]


def parse(text: str, fmt: str, **kwargs: Any) -> tuple[str | None, list[tuple[str, Any]]]:
    parsed = parse_tool_calls(text, fmt, **kwargs)
    return parsed.content, calls_of(parsed)


def counter_ids() -> Any:
    numbers = itertools.count()
    return lambda: f"call_{next(numbers)}"


NESTED = {"filter": {"tags": ["a", "b"], "range": {"min": 1, "max": 2.5}}, "flag": True, "none": None}
UNICODE = {"city": "Zürich", "greeting": "你好 👋", "quote": 'say "hi"\n'}
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


# ---------------------------------------------------------------- the formats, table-driven


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        pytest.param(
            '{"name": "get_weather", "parameters": {"city": "Paris"}}',
            None,
            [("get_weather", {"city": "Paris"})],
            id="single call",
        ),
        pytest.param(
            '<|python_tag|>{"name": "get_weather", "arguments": {"city": "Paris"}}',
            None,
            [("get_weather", {"city": "Paris"})],
            id="python tag and arguments key",
        ),
        pytest.param(
            '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}};'
            '{"name": "c", "parameters": {}}',
            None,
            [("a", {"x": 1}), ("b", {}), ("c", {})],
            id="several calls separated by semicolons",
        ),
        pytest.param(
            'Let me check. <|python_tag|>{"name": "a", "parameters": {}}',
            "Let me check.",
            [("a", {})],
            id="content then a tagged call",
        ),
        pytest.param(
            '\n {"name": "a", "parameters": {"x": 1}}\n\nThat is all.',
            "That is all.",
            [("a", {"x": 1})],
            id="whitespace around the call is not content",
        ),
        pytest.param(
            'Here is JSON: {"name": "a", "parameters": {}}',
            'Here is JSON: {"name": "a", "parameters": {}}',
            [],
            id="a bare object inside prose is prose",
        ),
        pytest.param(
            '{"name": "Bob", "age": 3}',
            '{"name": "Bob", "age": 3}',
            [],
            id="an untagged object without arguments is an answer",
        ),
        pytest.param(
            "{'name': 'a', 'parameters': {}}",
            "{'name': 'a', 'parameters': {}}",
            [],
            id="malformed JSON stays content",
        ),
        pytest.param(
            '{"name": "a", "parameters": {"x": 1}',
            None,
            [("a", {"x": 1})],
            id="a call cut after its arguments is a call",
        ),
        pytest.param(
            '{"name": "a", "param',
            '{"name": "a", "param',
            [],
            id="a call cut before its arguments open stays content",
        ),
        pytest.param(
            '{"name": "a", "parameters": {}}; {"name": oops}',
            '; {"name": oops}',
            [("a", {})],
            id="a malformed second call stays content",
        ),
        pytest.param(
            "<|python_tag|>import sys; print(sys.version)",
            "<|python_tag|>import sys; print(sys.version)",
            [],
            id="the code interpreter is not a function call",
        ),
        pytest.param(
            json.dumps({"name": "a", "parameters": UNICODE}, ensure_ascii=False),
            None,
            [("a", UNICODE)],
            id="unicode in arguments",
        ),
        pytest.param(
            json.dumps({"name": "a", "parameters": UNICODE}),
            None,
            [("a", UNICODE)],
            id="escaped unicode in arguments",
        ),
        pytest.param(
            json.dumps({"name": "a", "parameters": NESTED}), None, [("a", NESTED)], id="nested arguments"
        ),
        pytest.param(
            '{"name": "a", "parameters": "{\\"x\\": 1}"}',
            None,
            [("a", {"x": 1})],
            id="arguments as a JSON string",
        ),
        pytest.param(
            '{"name": "a", "parameters": NaN}',
            '{"name": "a", "parameters": NaN}',
            [],
            id="NaN is not JSON",
        ),
    ],
)
def test_llama3_json_output(text: str, content: str | None, calls: list[tuple[str, Any]]) -> None:
    assert parse(text, "llama3_json") == (content, calls)


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        pytest.param(HERMES_CALL, None, [("get_weather", {"city": "Paris"})], id="single call"),
        pytest.param(
            HERMES_CALL + "\n" + HERMES_CALL.replace("Paris", "Rome"),
            None,
            [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})],
            id="several calls",
        ),
        pytest.param(
            "I'll look that up.\n" + HERMES_CALL,
            "I'll look that up.",
            [("get_weather", {"city": "Paris"})],
            id="content then a call",
        ),
        pytest.param(
            # Whitespace next to a call is dropped on both sides, even between two pieces of text.
            "Before " + HERMES_CALL + "\nafter",
            "Beforeafter",
            [("get_weather", {"city": "Paris"})],
            id="content on both sides",
        ),
        pytest.param(
            '<tool_call>{"name": "f", "arguments": {"x": 1}}',
            None,
            [("f", {"x": 1})],
            id="a complete call missing its closing tag at the end",
        ),
        pytest.param(
            '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool',
            None,
            [("f", {"x": 1})],
            id="a half-written closing tag at the end belongs to the call",
        ),
        pytest.param(
            '<tool_call>\n{"name": f, "arguments": {"x": 1}}\n</tool_call>',
            '<tool_call>\n{"name": f, "arguments": {"x": 1}}\n</tool_call>',
            [],
            id="malformed JSON before the arguments stays content",
        ),
        pytest.param(
            "Use <tool_call> tags to call tools.",
            "Use <tool_call> tags to call tools.",
            [],
            id="the tag in prose",
        ),
        pytest.param(
            '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\ntrailing</tool_call>',
            "trailing</tool_call>",
            [("f", {"x": 1})],
            id="text between the object and the closing tag is content",
        ),
        pytest.param(
            '<tool_call>{"name": "f", "arguments": {"x": "</tool_call>"}}</tool_call>',
            None,
            [("f", {"x": "</tool_call>"})],
            id="the closing tag inside an argument string",
        ),
        pytest.param(
            "<tool_call>oops " + HERMES_CALL,
            "<tool_call>oops",
            [("get_weather", {"city": "Paris"})],
            id="a valid call after a broken tag",
        ),
        pytest.param(
            '<tool_call>\n{"name": "f"}\n</tool_call>',
            None,
            [("f", {})],
            id="a tagged call without arguments",
        ),
        pytest.param(
            "<tool_call>\n"
            + json.dumps({"name": "f", "arguments": UNICODE}, ensure_ascii=False)
            + "\n</tool_call>",
            None,
            [("f", UNICODE)],
            id="unicode in arguments",
        ),
        pytest.param(
            "<tool_call>\n" + json.dumps({"name": "f", "arguments": NESTED}) + "\n</tool_call>",
            None,
            [("f", NESTED)],
            id="nested arguments",
        ),
        pytest.param(
            '<tool_call>\n{"name": "f", "arguments": [1, 2]}\n</tool_call>',
            '<tool_call>\n{"name": "f", "arguments": [1, 2]}\n</tool_call>',
            [],
            id="arguments must be an object",
        ),
    ],
)
def test_hermes_output(text: str, content: str | None, calls: list[tuple[str, Any]]) -> None:
    assert parse(text, "hermes") == (content, calls)


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        pytest.param(
            '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
            None,
            [("get_weather", {"city": "Paris"})],
            id="single call, JSON array",
        ),
        pytest.param(
            '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}, "id": "abcDEF123"}, '
            '{"name": "b", "arguments": {}}]',
            None,
            [("a", {"x": 1}), ("b", {})],
            id="several calls, JSON array with ids",
        ),
        pytest.param(
            '[TOOL_CALLS]get_weather[ARGS]{"city": "Zürich"}',
            None,
            [("get_weather", {"city": "Zürich"})],
            id="single call, name and ARGS",
        ),
        pytest.param(
            '[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[ARGS]{"q": "café \\"best\\"", "f": {"t": ["a"]}}',
            None,
            [("a", {"x": 1}), ("b", {"q": 'café "best"', "f": {"t": ["a"]}})],
            id="several calls, name and ARGS",
        ),
        pytest.param(
            '[TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS]{"city": "Bern"}',
            None,
            [("get_weather", {"city": "Bern"})],
            id="call id (tokenizer v11)",
        ),
        pytest.param(
            '[TOOL_CALLS]add{"a": 3.5, "b": 4}', None, [("add", {"a": 3.5, "b": 4})], id="name then object"
        ),
        pytest.param(
            'Sure. [TOOL_CALLS]a[ARGS]{"x": 1}',
            "Sure.",
            [("a", {"x": 1})],
            id="content then a call",
        ),
        pytest.param(
            '[TOOL_CALLS][{"name": a, "arguments": {"x": 1}}]',
            '[TOOL_CALLS][{"name": a, "arguments": {"x": 1}}]',
            [],
            id="malformed JSON stays content",
        ),
        pytest.param(
            '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}]',
            None,
            [("a", {"x": 1})],
            id="a call missing its closing brace is a call",
        ),
        pytest.param(
            "[TOOL_CALLS] is the marker",
            "[TOOL_CALLS] is the marker",
            [],
            id="the marker in prose",
        ),
        pytest.param(
            "[TOOL_CALLS]a[ARGS]" + json.dumps(NESTED), None, [("a", NESTED)], id="nested arguments"
        ),
        pytest.param(
            "[TOOL_CALLS]a[ARGS]" + json.dumps(UNICODE, ensure_ascii=False),
            None,
            [("a", UNICODE)],
            id="unicode in arguments",
        ),
    ],
)
def test_mistral_output(text: str, content: str | None, calls: list[tuple[str, Any]]) -> None:
    assert parse(text, "mistral") == (content, calls)


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        pytest.param('{"name": "a", "arguments": {"x": 1}}', None, [("a", {"x": 1})], id="one call"),
        pytest.param(
            ' [{"name": "a", "arguments": {}}, {"name": "b", "parameters": {"y": [1]}}]\n',
            None,
            [("a", {}), ("b", {"y": [1]})],
            id="an array of calls",
        ),
        pytest.param("[]", "[]", [], id="an empty array is not a call"),
        pytest.param("Sorry, no.", "Sorry, no.", [], id="prose"),
    ],
)
def test_guided_json_output(text: str, content: str | None, calls: list[tuple[str, Any]]) -> None:
    assert parse(text, "json") == (content, calls)


@pytest.mark.parametrize(
    ("fmt", "text", "content", "calls"),
    [
        pytest.param(
            "hermes",
            '<tool_call>\n{"name": "f", "arguments": {"city": "Par',
            None,
            [("f", '{"city":"Par')],
            id="a call cut inside its arguments keeps what was written",
        ),
        pytest.param(
            "mistral",
            '[TOOL_CALLS]f[ARGS]{"a": [1, 2',
            None,
            [("f", '{"a":[1,2')],
            id="a mistral call cut inside its arguments",
        ),
        pytest.param(
            "json",
            '[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {"b": "x',
            None,
            [("f", '{"a":1}'), ("g", '{"b":"x')],
            id="the second call of an array cut",
        ),
        pytest.param(
            "hermes",
            '<tool_call>\n{"name": "f", "arguments": {"x": 1, y: 2}}\n</tool_call>after',
            "after",
            [("f", '{"x":1,')],
            id="arguments that stop being JSON end there and the rest of the call is dropped",
        ),
        pytest.param(
            "llama3_json",
            '{"name": "a", "parameters": {"x": NaN}}',
            None,
            [("a", '{"x":')],
            id="NaN ends the arguments",
        ),
        pytest.param(
            "hermes",
            '<tool_call>{"name": "f", "arguments": {"a": "\\u00e9 ",\n "b": 1.50E+2, "c": [ ]}}</tool_call>',
            None,
            [("f", '{"a":"\\u00e9 ","b":1.50E+2,"c":[]}')],
            id="the model's escapes and number spellings are kept, whitespace between tokens is not",
        ),
        pytest.param(
            "hermes",
            '<tool_call>{"name": "f", "arguments": {"a": 1}, "id": [7]}</tool_call>',
            None,
            [("f", '{"a":1}')],
            id="members after the arguments are not arguments",
        ),
        pytest.param(
            "hermes",
            '<tool_call>{"arguments": {"a": [1, 2]}, "name": "f"}</tool_call>',
            None,
            [("f", '{"a":[1,2]}')],
            id="arguments before the name are reported whole",
        ),
        pytest.param(
            "llama3_json",
            '{"name": "a", "parameters": "{\\"x\\": [1, 2]}"}',
            None,
            [("a", '{"x":[1,2]}')],
            id="arguments written as a JSON string are decoded",
        ),
        pytest.param(
            "mistral",
            '[TOOL_CALLS]f[ARGS]{"a": tru} then',
            "then",
            [("f", '{"a":tru')],
            id="mistral arguments that stop being JSON",
        ),
    ],
)
def test_arguments_are_the_models_json_text_as_far_as_it_goes(
    fmt: str, text: str, content: str | None, calls: list[tuple[str, str]]
) -> None:
    parsed = parse_tool_calls(text, fmt)
    assert parsed.content == content
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == calls


def test_format_none_leaves_everything_as_content() -> None:
    assert parse(HERMES_CALL, "none") == (HERMES_CALL, [])


def test_calls_to_undeclared_functions_stay_content() -> None:
    text = HERMES_CALL + '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    content, calls = parse(text, "hermes", tool_names=["get_weather"])
    assert calls == [("get_weather", {"city": "Paris"})]
    assert content == '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'


def test_arguments_are_compact_json_with_unicode_kept() -> None:
    parsed = parse_tool_calls(
        '<tool_call>{"name": "f", "arguments": {"a": "é", "b": [1, 2]}}</tool_call>', "hermes"
    )
    assert parsed.tool_calls[0].arguments == '{"a":"é","b":[1,2]}'


def test_tool_call_ids_look_like_openai_ones() -> None:
    ids = {new_tool_call_id() for _ in range(50)}
    assert len(ids) == 50
    for call_id in ids:
        assert call_id.startswith("call_")
        assert len(call_id) == 29
        assert call_id[5:].isascii() and call_id[5:].isalnum()


def test_an_unknown_format_is_a_configuration_error() -> None:
    with pytest.raises(ServerConfigError):
        StreamingToolParser("functionary")


@pytest.mark.parametrize(
    ("reason", "calls", "expected"),
    [("stop", 1, "tool_calls"), ("stop", 0, "stop"), ("length", 2, "length"), ("length", 0, "length")],
)
def test_finish_reason_is_tool_calls_when_the_model_stopped_after_calling(
    reason: str, calls: int, expected: str
) -> None:
    assert finish_reason(reason, calls) == expected


# ---------------------------------------------------------------- streaming


def stream(fmt: str, pieces: list[str], **kwargs: Any) -> list[list[ToolCallEvent]]:
    parser = StreamingToolParser(fmt, make_id=counter_ids(), **kwargs)
    out = [parser.feed(p) for p in pieces]
    out.append(parser.finish())
    return out


def test_a_streamed_call_is_announced_then_its_arguments_follow_as_written() -> None:
    pieces = [
        "Checking",
        " now.\n<tool",
        '_call>\n{"name": "f", ',
        '"arguments": {"x"',
        ': 1, "y": "é',
        '"}}\n</tool_',
        "call>",
    ]
    assert stream("hermes", pieces) == [
        [ContentDelta("Checking")],
        [ContentDelta(" now.")],
        [],
        [ToolCallStart(0, "call_0", "f"), ToolCallArguments(0, '{"x"')],
        [ToolCallArguments(0, ':1,"y":"é')],
        [ToolCallArguments(0, '"}')],
        [],
        [],
    ]


def test_a_call_in_another_order_is_announced_once_complete() -> None:
    pieces = ['<tool_call>{"arguments": {"x": ', '1}, "name": "f"', "}</tool_call>"]
    assert stream("hermes", pieces) == [
        [],
        [],
        [ToolCallStart(0, "call_0", "f"), ToolCallArguments(0, '{"x":1}')],
        [],
    ]


def test_held_back_text_is_released_when_it_is_not_a_marker() -> None:
    assert stream("hermes", ["a <tool", "s> b "]) == [
        [ContentDelta("a")],
        [ContentDelta(" <tools> b")],
        [ContentDelta(" ")],
    ]


def test_what_is_held_back_at_the_end_is_released_by_finish() -> None:
    assert stream("mistral", ["Done. \n", "[TOOL_"]) == [
        [ContentDelta("Done.")],
        [],
        [ContentDelta(" \n[TOOL_")],
    ]


def test_a_call_split_inside_its_marker_and_arguments_streams_as_written() -> None:
    pieces = [
        "<|py",
        "thon_tag|>",
        '{"name": "f", "parameters": {"q": "a',
        '"}}',
        "; ",
        '{"name": "g", "parameters": {}}',
    ]
    assert stream("llama3_json", pieces) == [
        [],
        [],
        [ToolCallStart(0, "call_0", "f"), ToolCallArguments(0, '{"q":"a')],
        [ToolCallArguments(0, '"}')],
        [],
        [ToolCallStart(1, "call_1", "g"), ToolCallArguments(1, "{}")],
        [],
    ]


def test_a_mistral_call_streams_its_arguments() -> None:
    pieces = ["[TOOL_CALLS]get_", "weather[ARGS]", '{"city": ', '"Bern"}']
    assert stream("mistral", pieces, tool_names=["get_weather"]) == [
        [],
        [],
        [ToolCallStart(0, "call_0", "get_weather"), ToolCallArguments(0, '{"city":')],
        [ToolCallArguments(0, '"Bern"}')],
        [],
    ]


def test_a_call_cut_by_the_token_limit_is_finished_by_finish() -> None:
    pieces = ['<tool_call>\n{"name": "f", "arguments": {"city": "Pa', "r"]
    assert stream("hermes", pieces) == [
        [ToolCallStart(0, "call_0", "f"), ToolCallArguments(0, '{"city":"Pa')],
        [ToolCallArguments(0, "r")],
        [],
    ]


def test_a_broken_call_is_released_as_content_once_it_cannot_be_one() -> None:
    assert stream("hermes", ["<tool_call>\n", "{'name'", ": 'f'}", "</tool_call>"]) == [
        [],
        [],
        [ContentDelta("<tool_call>\n{'name': 'f'}")],
        [ContentDelta("</tool_call>")],
        [],
    ]


def test_stream_events_serialise_as_openai_tool_call_deltas() -> None:
    assert ToolCallStart(2, "call_x", "f").to_openai() == {
        "index": 2,
        "id": "call_x",
        "type": "function",
        "function": {"name": "f", "arguments": ""},
    }
    assert ToolCallArguments(2, '{"a":1}').to_openai() == {"index": 2, "function": {"arguments": '{"a":1}'}}
    call = parse_tool_calls(HERMES_CALL, "hermes", make_id=lambda: "call_y").tool_calls[0]
    assert call.to_openai() == {
        "id": "call_y",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    }


def test_the_parser_counts_its_calls() -> None:
    parser = StreamingToolParser("llama3_json")
    parser.feed('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {}}')
    parser.finish()
    assert parser.tool_calls == 2


# Fragments that, concatenated in any order, exercise markers, near-markers, valid and broken calls.
FRAGMENTS = {
    "hermes": [
        "Hi ",
        "\n",
        " ",
        "<tool_call>",
        "</tool_call>",
        "<tool",
        '{"name": "f", "arguments": {"x": [1, {"y": "é}"}]}}',
        '{"name": "g", "arguments": {}}',
        '{"name": "f"',
        "{bad}",
        "你好",
        HERMES_CALL,
    ],
    "llama3_json": [
        "<|python_tag|>",
        "<|python",
        '{"name": "f", "parameters": {"x": [1, {"y": "é}"}]}}',
        '{"name": "g", "arguments": {}}',
        "; ",
        ";",
        " ",
        "\n",
        "{",
        "}",
        "text ",
        '"',
    ],
    "mistral": [
        "[TOOL_CALLS]",
        "[TOOL_",
        "f",
        "[ARGS]",
        "[CALL_ID]abc9",
        "[AR",
        '{"x": [1, {"y": "é]"}]}',
        '[{"name": "g", "arguments": {}}]',
        " ",
        "ok ",
        "{",
        "]",
        '[TOOL_CALLS]f[ARGS]{"x": 1}',
        '[TOOL_CALLS][{"name": "g", "arguments": {"y": "[TOOL_CALLS]"}}]',
    ],
    "json": ["{", "}", "[", "]", '{"name": "f", "arguments": {"a": 1}}', ", ", " ", "no", '"'],
}


@st.composite
def texts_and_splits(draw: st.DrawFn, fmt: str) -> tuple[str, list[str]]:
    text = "".join(draw(st.lists(st.sampled_from(FRAGMENTS[fmt]), max_size=10)))
    cuts = sorted(set(draw(st.lists(st.integers(0, len(text)), max_size=12))))
    bounds = [0, *cuts, len(text)]
    return text, [text[a:b] for a, b in itertools.pairwise(bounds)]


def collect(events: list[ToolCallEvent]) -> tuple[str, dict[int, tuple[str, str, str]]]:
    """Content, and per call index (id, name, arguments), checking OpenAI's order: a call's start
    comes before its arguments, and calls start in index order."""
    content = ""
    calls: dict[int, tuple[str, str, str]] = {}
    for e in events:
        if isinstance(e, ContentDelta):
            assert e.text
            content += e.text
        elif isinstance(e, ToolCallStart):
            assert e.index == len(calls)
            calls[e.index] = (e.id, e.name, "")
        else:
            call_id, name, arguments = calls[e.index]
            calls[e.index] = (call_id, name, arguments + e.arguments)
    return content, calls


@pytest.mark.parametrize("fmt", sorted(FRAGMENTS))
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_any_split_of_a_reply_streams_the_same_content_and_calls(fmt: str, data: st.DataObject) -> None:
    text, pieces = data.draw(texts_and_splits(fmt))
    parser = StreamingToolParser(fmt, make_id=counter_ids())
    events = [e for p in pieces for e in parser.feed(p)] + parser.finish()
    content, calls = collect(events)
    whole = parse_tool_calls(text, fmt, make_id=counter_ids())
    assert content == (whole.content or "")
    assert [(i, name) for i, (_, name, _) in calls.items()] == [
        (i, c.name) for i, c in enumerate(whole.tool_calls)
    ]
    for index, (call_id, _, arguments) in calls.items():
        assert call_id == whole.tool_calls[index].id
        # Exactly the non-streamed arguments, and always JSON as far as it goes.
        assert arguments == whole.tool_calls[index].arguments
        jiter.from_json(arguments.encode(), partial_mode=True)
    if not whole.tool_calls:
        # Never lose text: a reply without calls is its content, unchanged.
        assert whole.content == text


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
CALLS = st.lists(
    st.tuples(
        st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,15}", fullmatch=True),
        st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=4),
    ),
    min_size=1,
    max_size=3,
)


def render(
    fmt: str, calls: list[tuple[str, dict[str, Any]]], ascii_only: bool, compact: bool = False
) -> tuple[str, list[tuple[int, int]]]:
    """The calls as `fmt` writes them, and where each call's arguments are in that text."""

    def dump(value: Any) -> str:
        separators = (",", ":") if compact else None
        return json.dumps(value, ensure_ascii=ascii_only, separators=separators)

    text = ""
    spans = []

    def add_call(head: str, name: str, arguments: dict[str, Any], tail: str) -> None:
        nonlocal text
        text += head.format(name=dump(name))
        spans.append((len(text), len(text) + len(dump(arguments))))
        text += dump(arguments) + tail

    for i, (name, arguments) in enumerate(calls):
        if fmt == "hermes":
            add_call(
                "\n" * bool(i) + '<tool_call>\n{{"name": {name}, "arguments": ',
                name,
                arguments,
                "}\n</tool_call>",
            )
        elif fmt == "llama3_json":
            add_call(
                ("<|python_tag|>" if i == 0 else "; ") + '{{"name": {name}, "parameters": ',
                name,
                arguments,
                "}",
            )
        elif fmt == "mistral":
            text += f"[TOOL_CALLS]{name}[ARGS]"
            spans.append((len(text), len(text) + len(dump(arguments))))
            text += dump(arguments)
        else:
            add_call(("[" if i == 0 else ", ") + '{{"name": {name}, "arguments": ', name, arguments, "}")
    if fmt == "json":
        text += "]"
    return text, spans


def split(text: str, data: st.DataObject) -> list[str]:
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(text)), max_size=20))))
    return [text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])]


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "mistral", "json"])
@settings(max_examples=100, deadline=None)
@given(calls=CALLS, ascii_only=st.booleans(), data=st.data())
def test_rendered_calls_are_recovered_from_any_split(
    fmt: str, calls: list[tuple[str, dict[str, Any]]], ascii_only: bool, data: st.DataObject
) -> None:
    text, _ = render(fmt, calls, ascii_only)
    parser = StreamingToolParser(fmt)
    content, streamed = collect([e for p in split(text, data) for e in parser.feed(p)] + parser.finish())
    assert content == ""
    # The arguments are the model's JSON without the whitespace between tokens.
    assert [(name, arguments) for _, name, arguments in streamed.values()] == [
        (name, json.dumps(a, ensure_ascii=ascii_only, separators=(",", ":"))) for name, a in calls
    ]


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "mistral", "json"])
@settings(max_examples=100, deadline=None)
@given(calls=CALLS, ascii_only=st.booleans(), data=st.data())
def test_arguments_stream_as_they_are_written(
    fmt: str, calls: list[tuple[str, dict[str, Any]]], ascii_only: bool, data: st.DataObject
) -> None:
    """After every delta, each call's name is out once its arguments have begun, and its arguments
    are out as far as they have been written: nothing is held back until the call is complete."""
    text, spans = render(fmt, calls, ascii_only, compact=True)
    parser = StreamingToolParser(fmt)
    events: list[ToolCallEvent] = []
    seen = 0
    for piece in split(text, data):
        events += parser.feed(piece)
        seen += len(piece)
        _, streamed = collect(events)
        for index, (start, end) in enumerate(spans):
            if seen <= start:
                assert index not in streamed
                continue
            _, name, arguments = streamed[index]
            assert name == calls[index][0]
            assert arguments == text[start : min(seen, end)]


# ---------------------------------------------------------------- tools and tool_choice

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


def test_valid_tools_are_read() -> None:
    tools = validate_tools([WEATHER, TIME, {"type": "function", "function": {"name": "n", "parameters": {}}}])
    assert tools[0] == FunctionTool(
        "get_weather", "Current weather", WEATHER["function"]["parameters"], False
    )
    assert tools[1] == FunctionTool("get_time")
    assert validate_tools(None) == ()


def fn(**fields: Any) -> dict[str, Any]:
    return {"type": "function", "function": fields}


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        pytest.param({"a": 1}, "tools", id="not a list"),
        pytest.param([WEATHER, "x"], "tools[1]", id="not an object"),
        pytest.param(
            [{"type": "web_search", "function": {"name": "a"}}], "tools[0].type", id="not a function"
        ),
        pytest.param([{"type": "function"}], "tools[0].function", id="no function"),
        pytest.param([fn(description="x")], "tools[0].function.name", id="missing name"),
        pytest.param([fn(name="has space")], "tools[0].function.name", id="bad name"),
        pytest.param([fn(name="x" * 65)], "tools[0].function.name", id="name too long"),
        pytest.param([WEATHER, TIME, WEATHER], "tools[2].function.name", id="duplicate names"),
        pytest.param(
            [fn(name="a", parameters={"type": "string"})], "tools[0].function.parameters", id="string schema"
        ),
        pytest.param(
            [fn(name="a", parameters=[1])], "tools[0].function.parameters", id="schema not an object"
        ),
        pytest.param([fn(name="a", description=3)], "tools[0].function.description", id="bad description"),
        pytest.param([fn(name="a", strict="yes")], "tools[0].function.strict", id="bad strict"),
    ],
)
def test_invalid_tools_are_rejected_naming_the_field(tools: Any, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        validate_tools(tools)
    assert info.value.param == param
    assert info.value.status_code == 400


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (None, ToolChoice("auto")),
        ("none", ToolChoice("none")),
        ("auto", ToolChoice("auto")),
        ("required", ToolChoice("required")),
        ({"type": "function", "function": {"name": "get_time"}}, ToolChoice("function", "get_time")),
    ],
)
def test_tool_choice_is_resolved(choice: Any, expected: ToolChoice) -> None:
    assert resolve_tool_choice(choice, validate_tools([WEATHER, TIME])) == expected


def test_tool_choice_defaults_to_none_without_tools() -> None:
    assert resolve_tool_choice(None, ()) == ToolChoice("none")
    assert resolve_tool_choice("none", ()) == ToolChoice("none")


@pytest.mark.parametrize(
    ("choice", "tools", "param"),
    [
        pytest.param(
            {"type": "function", "function": {"name": "nope"}},
            [WEATHER],
            "tool_choice.function.name",
            id="unknown function",
        ),
        pytest.param({"type": "function"}, [WEATHER], "tool_choice", id="no function"),
        pytest.param(
            {"type": "tool", "function": {"name": "get_weather"}}, [WEATHER], "tool_choice", id="bad type"
        ),
        pytest.param("always", [WEATHER], "tool_choice", id="unknown mode"),
        pytest.param(3, [WEATHER], "tool_choice", id="not a string"),
        pytest.param("required", [], "tool_choice", id="required without tools"),
        pytest.param("auto", [], "tool_choice", id="auto without tools"),
    ],
)
def test_invalid_tool_choice_is_rejected_naming_the_field(choice: Any, tools: list[Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        resolve_tool_choice(choice, validate_tools(tools))
    assert info.value.param == param


def test_no_schema_when_the_model_may_answer_in_prose() -> None:
    tools = validate_tools([WEATHER])
    assert tool_call_json_schema(tools, ToolChoice("auto"), None, "hermes") is None
    assert tool_call_json_schema(tools, ToolChoice("none"), None, "hermes") is None


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "mistral"])
def test_required_schema_admits_calls_to_any_tool_and_nothing_else(fmt: str) -> None:
    tools = validate_tools([WEATHER, TIME])
    schema = tool_call_json_schema(tools, ToolChoice("required"), None, fmt)
    assert schema is not None
    jsonschema.Draft202012Validator.check_schema(schema)
    key = "parameters" if fmt == "llama3_json" else "arguments"
    good = [{"name": "get_weather", key: {"city": "Paris"}}, {"name": "get_time", key: {}}]
    jsonschema.validate(good, schema)
    for bad in [
        [],
        {"name": "get_time", key: {}},
        [{"name": "other", key: {}}],
        [{"name": "get_weather", key: {}}],
        [{"name": "get_time"}],
        [{"name": "get_time", key: {}, "extra": 1}],
        [*good, good[0]],  # more calls than tools offered
    ]:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    # What the guided model writes parses, with the format `output_format` picks.
    assert output_format(fmt, ToolChoice("required"), guided=True) == "json"
    assert parse(json.dumps(good), "json") == (None, [("get_weather", {"city": "Paris"}), ("get_time", {})])


@pytest.mark.parametrize("parallel", [None, True, False])
def test_a_named_schema_is_one_call_to_that_function(parallel: bool | None) -> None:
    tools = validate_tools([WEATHER, TIME])
    schema = tool_call_json_schema(tools, ToolChoice("function", "get_weather"), parallel, "hermes")
    assert schema == {
        "type": "object",
        "properties": {
            "name": {"type": "string", "enum": ["get_weather"]},
            "arguments": WEATHER["function"]["parameters"],
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    jsonschema.validate({"name": "get_weather", "arguments": {"city": "Oslo"}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_time", "arguments": {}}, schema)


@pytest.mark.parametrize(
    ("model_format", "choice", "guided", "expected"),
    [
        ("hermes", ToolChoice("none"), True, "none"),
        ("hermes", ToolChoice("auto"), True, "hermes"),
        ("hermes", ToolChoice("required"), False, "hermes"),
        ("mistral", ToolChoice("function", "f"), True, "json"),
        ("llama3_json", ToolChoice("required"), True, "json"),
    ],
)
def test_the_reply_is_parsed_in_the_format_it_was_written_in(
    model_format: str, choice: ToolChoice, guided: bool, expected: str
) -> None:
    assert output_format(model_format, choice, guided=guided) == expected
