"""Input items -> chat-template messages, item errors naming the item, truncation."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.apis.responses.items import parse_input, to_messages, truncate
from gateway.apis.responses.protocol import Reasoning
from gateway.errors import InvalidRequestError


def no_reasoning(item: Reasoning, position: int) -> str | None:
    return "".join(part.text for part in item.content or ())


def messages(raw: Any, instructions: str | None = None) -> list[dict[str, Any]]:
    return to_messages(parse_input(raw), instructions, reasoning_text=no_reasoning)


def test_a_string_is_one_user_message_after_the_instructions() -> None:
    assert messages("hi", "be brief") == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ({"role": "user", "content": "a"}, {"role": "user", "content": "a"}),
        ({"type": "message", "role": "developer", "content": "d"}, {"role": "system", "content": "d"}),
        (
            {"role": "system", "content": [{"type": "input_text", "text": "s"}]},
            {"role": "system", "content": "s"},
        ),
        (
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
            },
            {"role": "user", "content": "ab"},
        ),
        (
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "done", "annotations": []}],
            },
            {"role": "assistant", "content": "done"},
        ),
        (
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
            {"role": "assistant", "content": "no"},
        ),
    ],
)
def test_messages_of_every_role_and_part(item: dict[str, Any], expected: dict[str, Any]) -> None:
    assert messages([item]) == [expected]


def test_a_function_call_round_trip_becomes_tool_calls_and_a_tool_message() -> None:
    raw = [
        {"role": "user", "content": "weather?"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "hmm"}],
        },
        {"type": "function_call", "call_id": "c1", "name": "get", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "read", "namespace": "fs", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "x"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "It is sunny."}]},
    ]
    assert messages(raw) == [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "hmm",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get", "arguments": {"city": "Paris"}}},
                {"id": "c2", "type": "function", "function": {"name": "fs__read", "arguments": {}}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "x"},
        {"role": "assistant", "content": "It is sunny."},
    ]


def test_calls_after_an_assistant_message_join_its_turn() -> None:
    raw = [
        {"role": "assistant", "content": "Let me look."},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "not json"},
    ]
    assert messages(raw) == [
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "not json"}}
            ],
        }
    ]


def test_handed_back_reasoning_goes_to_the_next_assistant_turn() -> None:
    raw = [
        {"role": "user", "content": "q"},
        {"type": "reasoning", "summary": [], "encrypted_content": "sealed"},
        {"role": "assistant", "content": "a"},
    ]
    seen = []

    def unseal(item: Reasoning, position: int) -> str:
        seen.append((item.encrypted_content, position))
        return "thought"

    out = to_messages(parse_input(raw), None, reasoning_text=unseal)
    assert out[1] == {"role": "assistant", "content": "a", "reasoning_content": "thought"}
    assert seen == [("sealed", 1)]


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ([{"type": "banana"}], "input[0].type"),
        ([{"content": "no role, no type"}], "input[0].type"),
        ([{"type": "web_search_call", "id": "ws", "status": "completed"}], "input[0].type"),
        ([{"role": "user", "content": "ok"}, {"role": "robot", "content": "x"}], "input[1].role"),
        ([{"role": "user"}], "input[0].content"),
        (
            [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}],
            "input[0].content[0].file_id",
        ),
        ([{"role": "user", "content": [{"type": "input_image"}]}], "input[0].content[0].image_url"),
        (
            [{"role": "assistant", "content": [{"type": "input_image", "image_url": "http://x"}]}],
            "input[0].content[0].type",
        ),
        ([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}], "input[0].content[0].type"),
        ([{"role": "user", "content": [{"type": "input_text"}]}], "input[0].content[0].text"),
        ([{"role": "user", "content": [{"type": "bogus", "text": "x"}]}], "input[0].content[0].type"),
        ([{"type": "function_call", "name": "f", "arguments": "{}"}], "input[0].call_id"),
        ([{"type": "function_call_output", "call_id": "c"}], "input[0].output"),
        (
            [
                {
                    "type": "function_call_output",
                    "call_id": "c",
                    "output": [{"type": "input_image", "file_id": "u"}],
                }
            ],
            "input[0].output[0].file_id",
        ),
        ([{"type": "reasoning", "summary": "not a list"}], "input[0].summary"),
    ],
)
def test_bad_items_are_a_400_naming_the_field(raw: list[dict[str, Any]], param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_input(raw)
    assert info.value.param == param
    assert info.value.status_code == 400


def test_truncation_drops_the_oldest_items_and_never_starts_inside_a_tool_round() -> None:
    raw = [
        {"role": "user", "content": "1"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "r"},
        {"role": "user", "content": "2"},
        {"role": "user", "content": "3"},
    ]
    items = parse_input(raw)
    checked: list[int] = []

    def fits(kept: Any) -> bool:
        checked.append(len(kept))
        return len(kept) <= 3

    kept = truncate(items, fits)
    assert [getattr(i, "content", None) for i in kept] == ["2", "3"]
    assert truncate(items, lambda kept: True) == items
    with pytest.raises(InvalidRequestError) as info:
        truncate(items, lambda kept: False)
    assert info.value.param == "input"
