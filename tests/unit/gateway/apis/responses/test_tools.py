"""Responses tools -> chat tools: function and namespace tools, tools the gateway cannot run,
tool_choice, text.format."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.apis.responses.protocol import TextParam
from gateway.apis.responses.tools import plan_tools, response_format
from gateway.errors import InvalidRequestError

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}
# What the Codex CLI sends: functions, a namespace of functions, a hosted tool.
CODEX_TOOLS = [
    {
        "type": "function",
        "name": "shell",
        "parameters": {"type": "object", "properties": {}},
        "strict": False,
    },
    {
        "type": "namespace",
        "name": "mcp",
        "description": "MCP tools",
        "tools": [{"type": "function", "name": "search", "parameters": None}],
    },
    {"type": "web_search", "external_web_access": False},
]


def test_function_tools_become_chat_tools() -> None:
    plan = plan_tools([WEATHER], None, strict=False)
    assert plan.chat_tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather",
                "parameters": WEATHER["parameters"],
                "strict": True,
            },
        }
    ]
    assert plan.chat_tool_choice is None and plan.skipped == ()
    assert plan.names == {"get_weather": (None, "get_weather")}


def test_namespace_tools_are_flattened_and_hosted_tools_left_out() -> None:
    plan = plan_tools(CODEX_TOOLS, "auto", strict=False)
    assert [t["function"]["name"] for t in plan.chat_tools or ()] == ["shell", "mcp__search"]
    assert plan.names["mcp__search"] == ("mcp", "search")
    assert plan.skipped == ("web_search",)
    assert plan.chat_tool_choice == "auto"


def test_hosted_tools_are_a_400_naming_them_when_strict() -> None:
    with pytest.raises(InvalidRequestError) as info:
        plan_tools(CODEX_TOOLS, "auto", strict=True)
    assert info.value.param == "tools[2].type" and "web_search" in info.value.message


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ([{"type": "teleport"}], "tools[0].type"),
        ([{"name": "f"}], "tools[0].type"),
        (["f"], "tools[0]"),
        ([{"type": "function"}], "tools[0].name"),
        ([{"type": "function", "name": "bad name"}], "tools[0].name"),
        ([{"type": "function", "name": "f", "parameters": {"type": "array"}}], "tools[0].parameters"),
        ([{"type": "function", "name": "f", "strict": "yes"}], "tools[0].strict"),
        ([WEATHER, WEATHER], "tools[1].name"),
        ([{"type": "namespace", "name": "ns", "tools": []}], "tools[0].tools"),
        ([{"type": "namespace", "name": "ns", "tools": [{"type": "web_search"}]}], "tools[0].tools[0].type"),
    ],
)
def test_bad_tools_are_a_400_naming_the_field(tools: list[Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        plan_tools(tools, None, strict=False)
    assert info.value.param == param


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("none", "none"),
        ("required", "required"),
        (
            {"type": "function", "name": "get_weather"},
            {"type": "function", "function": {"name": "get_weather"}},
        ),
        ({"type": "function", "name": "search"}, {"type": "function", "function": {"name": "mcp__search"}}),
        (
            {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "search"}]},
            "required",
        ),
    ],
)
def test_tool_choice(choice: Any, expected: Any) -> None:
    plan = plan_tools([WEATHER, CODEX_TOOLS[1]], choice, strict=False)
    assert plan.chat_tool_choice == expected


def test_allowed_tools_offers_only_those() -> None:
    choice = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "get_weather"}]}
    plan = plan_tools([WEATHER, CODEX_TOOLS[1]], choice, strict=False)
    assert [t["function"]["name"] for t in plan.chat_tools or ()] == ["get_weather"]
    assert plan.chat_tool_choice == "auto"


@pytest.mark.parametrize(
    ("choice", "param"),
    [
        ({"type": "function", "name": "nope"}, "tool_choice.name"),
        ({"type": "function"}, "tool_choice.name"),
        ({"type": "web_search_preview"}, "tool_choice.type"),
        ({"type": "mystery"}, "tool_choice.type"),
        ({"type": "allowed_tools", "mode": "sometimes", "tools": []}, "tool_choice.mode"),
        (
            {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "x"}]},
            "tool_choice.tools[0]",
        ),
        (42, "tool_choice"),
    ],
)
def test_bad_tool_choice_is_a_400_naming_it(choice: Any, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        plan_tools([WEATHER], choice, strict=False)
    assert info.value.param == param


def test_required_without_tools_is_a_400() -> None:
    with pytest.raises(InvalidRequestError) as info:
        plan_tools(None, "required", strict=False)
    assert info.value.param == "tool_choice"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, None),
        ({"format": {"type": "text"}}, None),
        ({"format": {"type": "json_object"}}, {"type": "json_object"}),
        (
            {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": True}},
            {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True},
            },
        ),
    ],
)
def test_text_format_becomes_response_format(text: Any, expected: Any) -> None:
    param = TextParam.model_validate(text) if text is not None else None
    assert response_format(param) == expected


def test_json_schema_format_needs_its_schema() -> None:
    with pytest.raises(InvalidRequestError) as info:
        response_format(TextParam.model_validate({"format": {"type": "json_schema", "name": "x"}}))
    assert info.value.param == "text.format.schema"
