"""Messages requests into chat-template messages, tools and controls (pure, table-driven)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.apis.messages.protocol import MessageCreateRequest
from gateway.apis.messages.translate import Reasoning, to_chat
from gateway.errors import InvalidRequestError

WEATHER = {
    "name": "get_weather",
    "description": "Current weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def request(**fields: Any) -> MessageCreateRequest:
    body = {"model": "tiny", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}], **fields}
    return MessageCreateRequest.model_validate(body)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, [{"role": "user", "content": "Hi"}]),
        (
            {"system": "Be brief."},
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        ),
        (
            {"system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B", "cache_control": {}}]},
            [{"role": "system", "content": "A\n\nB"}, {"role": "user", "content": "Hi"}],
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    },
                    {"role": "assistant", "content": "ok"},
                    {"role": "system", "content": "Reminder."},
                    {"role": "user", "content": "c"},
                ]
            },
            [
                {"role": "user", "content": "ab"},
                {"role": "assistant", "content": "ok"},
                {"role": "system", "content": "Reminder."},
                {"role": "user", "content": "c"},
            ],
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "Weather?"},
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "thinking", "thinking": "Need a tool.", "signature": "sig"},
                            {"type": "redacted_thinking", "data": "opaque"},
                            {"type": "text", "text": "Checking."},
                            {
                                "type": "tool_use",
                                "id": "toolu_1",
                                "name": "get_weather",
                                "input": {"city": "Paris"},
                            },
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                            {"type": "text", "text": "And now?"},
                        ],
                    },
                ],
                "tools": [WEATHER],
            },
            [
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": "Checking.",
                    "reasoning_content": "Need a tool.",
                    "tool_calls": [
                        {
                            "id": "toolu_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
                {"role": "user", "content": "And now?"},
            ],
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "tool_use", "id": "a", "name": "get_weather", "input": {}},
                            {"type": "tool_use", "id": "b", "name": "get_weather", "input": {}},
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "b",
                                "content": [
                                    {"type": "text", "text": "found:\n"},
                                    {"type": "tool_reference", "tool_name": "mcp__docs__search"},
                                ],
                            },
                            {"type": "tool_result", "tool_use_id": "a", "is_error": True, "content": "boom"},
                        ],
                    },
                ]
            },
            [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {}}},
                        {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": {}}},
                    ],
                },
                {"role": "tool", "tool_call_id": "b", "content": "found:\nmcp__docs__search\n"},
                {"role": "tool", "tool_call_id": "a", "content": "Error: boom"},
            ],
        ),
    ],
)
def test_conversations_become_chat_template_messages(
    fields: dict[str, Any], expected: list[dict[str, Any]]
) -> None:
    assert to_chat(request(**fields)).messages == expected


def test_claude_codes_billing_header_block_does_not_reach_the_prompt() -> None:
    def system(version: str) -> list[dict[str, Any]]:
        return [
            {
                "type": "text",
                "text": f"x-anthropic-billing-header: cc_version={version}; cc_entrypoint=cli; cch=1;",
            },
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        ]

    first = to_chat(request(system=system("2.1.3.abc")))
    second = to_chat(request(system=system("2.1.4.def")))
    assert first.messages == second.messages
    assert first.messages[0] == {"role": "system", "content": "You are Claude Code."}
    only = to_chat(request(system="x-anthropic-billing-header: cc_version=1;"))
    assert only.messages == [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    ("fields", "tools", "tool_choice", "parallel"),
    [
        ({"tools": [WEATHER]}, 1, None, None),
        ({"tools": [WEATHER], "tool_choice": {"type": "auto"}}, 1, "auto", None),
        ({"tools": [WEATHER], "tool_choice": {"type": "any"}}, 1, "required", None),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather"}},
            1,
            {"type": "function", "function": {"name": "get_weather"}},
            None,
        ),
        ({"tools": [WEATHER], "tool_choice": {"type": "none"}}, 1, "none", None),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "any", "disable_parallel_tool_use": True}},
            1,
            "required",
            False,
        ),
        ({"tools": [{**WEATHER, "type": "custom", "cache_control": {"type": "ephemeral"}}]}, 1, None, None),
    ],
)
def test_tools_and_tool_choice_map_onto_openai_shapes(
    fields: dict[str, Any], tools: int, tool_choice: Any, parallel: bool | None
) -> None:
    chat = to_chat(request(**fields))
    assert chat.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER["input_schema"],
                "description": "Current weather",
            },
        }
    ]
    assert chat.tool_choice == tool_choice
    assert chat.parallel_tool_calls is parallel


@pytest.mark.parametrize(
    ("fields", "reasoning", "kwargs"),
    [
        ({}, Reasoning(), {}),
        (
            {"thinking": {"type": "disabled"}},
            Reasoning(enabled=False),
            {"enable_thinking": False, "thinking": False},
        ),
        (
            {"thinking": {"type": "adaptive"}, "output_config": {"effort": "xhigh"}},
            Reasoning(enabled=True, effort="high"),
            {"enable_thinking": True, "thinking": True, "reasoning_effort": "high"},
        ),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 2048}, "max_tokens": 4096},
            Reasoning(enabled=True, budget_tokens=2048),
            {"enable_thinking": True, "thinking": True},
        ),
        (
            {"thinking": {"type": "between_tools"}},
            Reasoning(enabled=True),
            {"enable_thinking": True, "thinking": True},
        ),
        ({"output_config": {"effort": "low"}}, Reasoning(effort="low"), {"reasoning_effort": "low"}),
    ],
)
def test_thinking_and_effort_become_reasoning_controls(
    fields: dict[str, Any], reasoning: Reasoning, kwargs: dict[str, Any]
) -> None:
    req = request(**fields)
    chat = to_chat(req, max_tokens=req.max_tokens)
    assert chat.reasoning == reasoning
    assert chat.template_kwargs() == kwargs


def test_output_format_becomes_a_json_schema_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = to_chat(request(output_config={"format": {"type": "json_schema", "schema": schema}}))
    assert chat.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema},
    }


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}],
                    }
                ]
            },
            "messages.0.content.0: unexpected `tool_use_id` found in `tool_result` blocks: nope",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "a", "name": "t", "input": {}}],
                    },
                    {"role": "user", "content": "no result"},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a"}]},
                ]
            },
            "messages.2.content.0: unexpected `tool_use_id`",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}],
                    }
                ]
            },
            "messages.0.content.0.source: `file` image sources are not supported",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages.0.content.0: `document` content blocks are not supported",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "a", "name": "t", "input": {}}],
                    },
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "a",
                                "content": [{"type": "document", "source": {}}],
                            }
                        ],
                    },
                ]
            },
            "messages.1.content.0.content.0: `document` content blocks are not supported",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "t", "input": {}}]}
                ]
            },
            "messages.0.content.0: a `user` message cannot contain `tool_use` blocks",
        ),
        ({"tools": [{"name": "bad name", "input_schema": {"type": "object"}}]}, "tools.0.name"),
        ({"tools": [WEATHER, WEATHER]}, "Tool names must be unique"),
        ({"tools": [{"name": "t"}]}, "tools.0.input_schema: Field required"),
        (
            {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "tools.0.type: `web_search_20250305`",
        ),
        ({"tool_choice": {"type": "any"}}, "tool_choice: `any` needs `tools`"),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "other"}}, "tool_choice.name"),
        ({"thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking.budget_tokens"),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 2048}, "max_tokens": 2048},
            "`max_tokens` must be greater",
        ),
    ],
)
def test_bad_conversations_are_invalid_requests_naming_the_place(
    fields: dict[str, Any], message: str
) -> None:
    req = request(**fields)
    with pytest.raises(InvalidRequestError) as raised:
        to_chat(req, max_tokens=req.max_tokens)
    assert raised.value.status_code == 400
    assert message in raised.value.message
