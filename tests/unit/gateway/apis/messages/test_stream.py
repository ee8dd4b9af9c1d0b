"""The Messages API's event writer and assembler, without a server: exact event sequences, every
frame valid for the official SDK's event types, and the SDK's own accumulator rebuilding from
the stream exactly the message the assembler builds."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

import orjson
import pydantic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message as SdkMessage
from anthropic.types import RawMessageStreamEvent
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.apis.messages.errors import error_event
from gateway.apis.messages.stream import (
    PING,
    MessageAssembler,
    MessageStreamWriter,
    ReplyRouter,
    frame,
    ping_event,
    stop_reason,
    tool_input,
)
from gateway.errors import EngineError
from gateway.text.reasoning import ReasoningParser
from gateway.text.reply import ReplyParser
from gateway.text.tool_calls import StreamingToolParser

EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)


def parse(stream: bytes) -> list[dict]:
    """The events of an SSE byte stream, checking each frame's event name against its type."""
    events = []
    for chunk in stream.split(b"\n\n"):
        if not chunk:
            continue
        name_line, data_line = chunk.split(b"\n")
        assert name_line.startswith(b"event: ") and data_line.startswith(b"data: ")
        event = json.loads(data_line[len(b"data: ") :])
        assert name_line[len(b"event: ") :].decode() == event["type"]
        events.append(event)
    return events


def sequence(events: list[dict]) -> list[str]:
    out = []
    for e in events:
        label = e["type"]
        if e["type"] == "content_block_start":
            label += f"[{e['index']}]:{e['content_block']['type']}"
        elif e["type"] == "content_block_delta":
            label += f"[{e['index']}]:{e['delta']['type']}"
        elif e["type"] == "content_block_stop":
            label += f"[{e['index']}]"
        out.append(label)
    return out


def ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"toolu_{next(counter)}"


def reply_parser(
    tool_format: str, *, make_id: Callable[[], str], reasoning: ReasoningParser | None = None
) -> ReplyParser:
    tools = None
    if tool_format != "none":
        tools = StreamingToolParser(tool_format, tool_names={"get_weather"}, make_id=make_id)
    return ReplyParser(reasoning=reasoning, tools=tools)


def run(
    pieces: list[tuple[str, str]],
    *,
    tool_format: str = "hermes",
    finish: str = "stop",
    stop: str | None = None,
    cached: int | None = None,
) -> tuple[bytes, SdkMessage]:
    """Feed the same reply to a writer and an assembler; return the stream and the whole message."""
    writer = MessageStreamWriter("msg_1", "tiny")
    assembler = MessageAssembler()
    routers = [ReplyRouter(sink, reply_parser(tool_format, make_id=ids())) for sink in (writer, assembler)]
    out = writer.start(7, cached)
    for kind, text in pieces:
        out += routers[0].thinking(text) if kind == "thinking" else routers[0].text(text)
        _ = routers[1].thinking(text) if kind == "thinking" else routers[1].text(text)
    out += routers[0].finish()
    routers[1].finish()
    reason = stop_reason(finish, tool_calls=routers[0].tool_calls, stop_sequence=stop)
    out += writer.finish(reason, stop, prompt_tokens=7, output_tokens=5, cached_tokens=cached)
    message = assembler.message(
        "msg_1", "tiny", reason, stop, prompt_tokens=7, output_tokens=5, cached_tokens=cached
    )
    return out, SdkMessage.model_validate(message.model_dump())


def accumulate(stream: bytes) -> SdkMessage:
    snapshot = None
    bufs: dict[int, bytes] = {}
    for event in parse(stream):
        snapshot = accumulate_event(
            event=EVENT.validate_python(event), current_snapshot=snapshot, json_bufs=bufs
        )
    assert snapshot is not None
    return SdkMessage.model_validate(snapshot.model_dump())


def test_a_text_reply_is_one_text_block_between_message_start_and_message_stop() -> None:
    stream, message = run([("text", "Hello"), ("text", " world")])
    events = parse(stream)
    assert sequence(events) == [
        "message_start",
        "content_block_start[0]:text",
        "content_block_delta[0]:text_delta",
        "content_block_delta[0]:text_delta",
        "content_block_stop[0]",
        "message_delta",
        "message_stop",
    ]
    assert events[0] == {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "tiny",
            "stop_reason": None,
            "stop_sequence": None,
            # The engine did not report its KV cache reuse: unknown, null as Anthropic's schema allows.
            "usage": {
                "input_tokens": 7,
                "output_tokens": 0,
                "cache_creation_input_tokens": None,
                "cache_read_input_tokens": None,
            },
        },
    }
    assert events[1]["content_block"] == {"type": "text", "text": ""}
    assert [e["delta"] for e in events[2:4]] == [
        {"type": "text_delta", "text": "Hello"},
        {"type": "text_delta", "text": " world"},
    ]
    assert events[5] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {
            "input_tokens": 7,
            "output_tokens": 5,
            "cache_creation_input_tokens": None,
            "cache_read_input_tokens": None,
        },
    }
    assert message.content[0].model_dump(exclude_none=True) == {"type": "text", "text": "Hello world"}


@pytest.mark.parametrize("cached", [0, 4])
def test_cache_reads_leave_input_tokens_as_anthropic_counts_them(cached: int) -> None:
    stream, message = run([("text", "Hi")], cached=cached)
    events = parse(stream)
    expected = {
        "input_tokens": 7 - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }
    assert events[0]["message"]["usage"] == {**expected, "output_tokens": 0}
    assert events[-2]["usage"] == {**expected, "output_tokens": 5}
    assert message.usage.model_dump(include=set(expected)) == expected
    assert accumulate(stream).usage.model_dump(include=set(expected)) == expected


def test_thinking_then_text_then_a_tool_call_are_three_blocks_in_order() -> None:
    stream, message = run(
        [
            ("thinking", "Let me "),
            ("thinking", "check."),
            ("text", "Checking. "),
            ("text", '<tool_call>{"name": "get_weather", '),
            ("text", '"arguments": {"city": "Paris"}}</tool_call>'),
        ]
    )
    events = parse(stream)
    assert sequence(events) == [
        "message_start",
        "content_block_start[0]:thinking",
        "content_block_delta[0]:thinking_delta",
        "content_block_delta[0]:thinking_delta",
        "content_block_stop[0]",
        "content_block_start[1]:text",
        "content_block_delta[1]:text_delta",
        "content_block_stop[1]",
        "content_block_start[2]:tool_use",
        "content_block_delta[2]:input_json_delta",
        "content_block_stop[2]",
        "message_delta",
        "message_stop",
    ]
    assert events[1]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert events[8]["content_block"] == {
        "type": "tool_use",
        "id": "toolu_0",
        "name": "get_weather",
        "input": {},
    }
    assert events[9]["delta"] == {"type": "input_json_delta", "partial_json": '{"city":"Paris"}'}
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[2].input == {"city": "Paris"}  # type: ignore[union-attr]
    assert message.stop_reason == "tool_use"


def test_an_empty_reply_has_no_blocks() -> None:
    stream, message = run([("text", "")], finish="length")
    assert sequence(parse(stream)) == ["message_start", "message_delta", "message_stop"]
    assert message.content == []
    assert message.stop_reason == "max_tokens"


@pytest.mark.parametrize(
    ("finish", "tool_calls", "stop", "expected"),
    [
        ("stop", 0, None, "end_turn"),
        ("stop", 2, None, "tool_use"),
        ("stop", 0, "###", "stop_sequence"),
        ("length", 0, None, "max_tokens"),
        # A cut reply is reported as cut even after a call: the client needs to know.
        ("length", 1, None, "max_tokens"),
    ],
)
def test_stop_reasons(finish: str, tool_calls: int, stop: str | None, expected: str) -> None:
    assert stop_reason(finish, tool_calls=tool_calls, stop_sequence=stop) == expected


def test_a_stop_sequence_is_named_in_message_delta() -> None:
    stream, message = run([("text", "abc")], stop="###")
    delta = parse(stream)[-2]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "###"}
    assert message.stop_sequence == "###"


def test_every_frame_is_a_valid_sdk_event_and_the_preformatted_ones_equal_the_dumped_dict() -> None:
    stream, _ = run(
        [("thinking", 'a "quoted" 🙂'), ("text", "tab\tnew\nline \u2028 日本"), ("text", "<tool_call>x")],
        tool_format="hermes",
    )
    for chunk in stream.split(b"\n\n"):
        if chunk:
            data = orjson.loads(chunk.split(b"\n")[1][len(b"data: ") :])
            EVENT.validate_python(data)
            assert chunk + b"\n\n" == frame(data)


def test_ping_and_error_frames() -> None:
    assert parse(PING) == [{"type": "ping"}]
    # What sse-starlette's keep-alive sends between events is exactly PING.
    assert ping_event().encode() == PING
    assert parse(error_event(EngineError("Triton failed"))) == [
        {"type": "error", "error": {"type": "api_error", "message": "Triton failed"}}
    ]


@settings(max_examples=150, deadline=None)
@given(
    parts=st.lists(
        st.tuples(
            st.sampled_from(["text", "thinking"]),
            st.text(alphabet='ab {}"<>/_:tool_call\n日🙂', max_size=12),
        ),
        max_size=8,
    ),
    tool_format=st.sampled_from(["none", "hermes"]),
)
def test_the_sdk_accumulates_the_stream_into_the_assembled_message(
    parts: list[tuple[str, str]], tool_format: str
) -> None:
    stream, message = run(parts, tool_format=tool_format)
    assert accumulate(stream).model_dump() == message.model_dump()


def test_a_valid_tool_call_streamed_in_any_split_accumulates_to_the_same_message() -> None:
    reply = 'Sure.<tool_call>{"name": "get_weather", "arguments": {"city": "Tokyo"}}</tool_call>'
    whole_stream, whole = run([("text", reply)])
    for cut in range(1, len(reply)):
        stream, message = run([("text", reply[:cut]), ("text", reply[cut:])])
        assert message == whole
        assert accumulate(stream) == whole
    assert accumulate(whole_stream) == whole


def test_a_tool_call_cut_anywhere_accumulates_in_the_sdk_to_the_assembled_message() -> None:
    reply = 'Sure.<tool_call>{"name": "get_weather", "arguments": {"city": "Tokyo", "days": [1, 22]}}'
    for cut in range(1, len(reply) + 1):
        stream, message = run([("text", reply[:cut])])
        assert accumulate(stream) == message


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"city":"Tokyo","days":[1,22]}', {"city": "Tokyo", "days": [1, 22]}),
        ('{"city":"Tokyo","days":[1,2', {"city": "Tokyo", "days": [1, 2]}),
        ('{"city":"Tok', {}),
        ('{"a":{"b":1,"c":"x', {"a": {"b": 1}}),
        ("{", {}),
        ("", {}),
        ("[1]", {}),
        ("{oops", {}),
    ],
)
def test_a_tool_use_input_is_what_parsed_of_its_arguments(
    arguments: str, expected: dict[str, object]
) -> None:
    assert tool_input(arguments) == expected


def run_reasoning(
    text_pieces: list[str], fmt: str, *, prompt: str = "", show: bool = True
) -> tuple[bytes, SdkMessage]:
    from gateway.text.reasoning import get_format

    writer = MessageStreamWriter("msg_1", "tiny")
    assembler = MessageAssembler()
    routers = [
        ReplyRouter(
            sink,
            reply_parser("hermes", make_id=ids(), reasoning=get_format(fmt).parser(prompt=prompt)),
            show_thinking=show,
        )
        for sink in (writer, assembler)
    ]
    out = writer.start(3, None)
    for piece in text_pieces:
        out += routers[0].text(piece)
        routers[1].text(piece)
    out += routers[0].finish()
    routers[1].finish()
    reason = stop_reason("stop", tool_calls=routers[0].tool_calls, stop_sequence=None)
    out += writer.finish(reason, None, prompt_tokens=3, output_tokens=9, cached_tokens=None)
    message = assembler.message(
        "msg_1", "tiny", reason, None, prompt_tokens=3, output_tokens=9, cached_tokens=None
    )
    return out, SdkMessage.model_validate(message.model_dump())


def test_a_reasoning_model_s_thinking_is_a_thinking_block_before_the_answer_and_its_call() -> None:
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    reply = "<think>Weather needs a tool.</think>Checking." + call
    for cut in (1, 9, 20, 40, len(reply) - 3):
        stream, message = run_reasoning([reply[:cut], reply[cut:]], "deepseek_r1")
        assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
        assert message.content[0].thinking == "Weather needs a tool."  # type: ignore[union-attr]
        assert message.content[1].text == "Checking."  # type: ignore[union-attr]
        assert message.stop_reason == "tool_use"
        assert accumulate(stream) == message


def test_a_think_block_opened_by_the_template_is_thinking_from_the_first_token() -> None:
    stream, message = run_reasoning(
        ["still thinking", "</think>", "Done."], "qwen3", prompt="<|im_start|>assistant\n<think>\n"
    )
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in message.content] == [
        ("thinking", "still thinking"),
        ("text", "Done."),
    ]
    assert accumulate(stream) == message


def test_omitted_thinking_leaves_only_the_answer() -> None:
    stream, message = run_reasoning(["<think>secret</think>", "Answer."], "deepseek_r1", show=False)
    assert [b.type for b in message.content] == ["text"]
    assert b"secret" not in stream
