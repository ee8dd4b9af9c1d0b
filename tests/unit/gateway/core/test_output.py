"""The output plan of a request: which guide the engine gets (response_format, vLLM's
structured_outputs, a forced tool call) and how the reply is parsed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.core.output import plan_output
from gateway.errors import InvalidRequestError, UnsupportedParameterError

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CLOCK: Any = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


def plan(**fields: Any) -> Any:
    args: dict[str, Any] = {
        "tools": None,
        "tool_choice": None,
        "parallel_tool_calls": None,
        "response_format": None,
        "model_tool_format": "hermes",
        "guided_decoding": True,
    }
    return plan_output(**(args | fields))


@pytest.mark.parametrize(
    ("spec", "guide"),
    [
        ({"regex": "<tool_call>.*"}, ("regex", "<tool_call>.*")),
        ({"grammar": 'root ::= "a"'}, ("ebnf_grammar", 'root ::= "a"')),
        ({"json": {"type": "object"}}, ("json_schema", '{"type": "object"}')),
        ({"json": '{"type": "object"}'}, ("json_schema", '{"type": "object"}')),
        ({"choice": ["yes", "a.b"]}, ("regex", "(yes)|(a\\.b)")),
    ],
)
def test_structured_outputs_become_the_engines_guide(spec: dict[str, Any], guide: tuple[str, str]) -> None:
    assert plan(structured_outputs=spec).guide == guide


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"structured_outputs": {"json": "not json"}}, "structured_outputs.json"),
        ({"structured_outputs": {"regex": 3}}, "structured_outputs.regex"),
        (
            {"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
            "structured_outputs",
        ),
        (
            {"structured_outputs": {"regex": "a"}, "tools": [WEATHER], "tool_choice": "required"},
            "structured_outputs",
        ),
    ],
)
def test_bad_structured_outputs_are_a_400_naming_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        plan(**fields)
    assert caught.value.param == param


def test_structured_outputs_need_guided_decoding() -> None:
    with pytest.raises(UnsupportedParameterError):
        plan(structured_outputs={"regex": "a"}, guided_decoding=False)


def test_a_forced_call_is_planned_as_one_with_its_function_when_it_is_known() -> None:
    named = plan(tools=[WEATHER, CLOCK], tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert (named.forced, named.forced_name, named.tool_format) == (True, "get_time", "json")
    required = plan(tools=[WEATHER, CLOCK], tool_choice="required")
    assert (required.forced, required.forced_name) == (True, None)
    only = plan(tools=[WEATHER], tool_choice="required")
    assert (only.forced, only.forced_name) == (True, "get_weather")
    auto = plan(tools=[WEATHER, CLOCK])
    assert (auto.forced, auto.forced_name, auto.tool_format) == (False, None, "hermes")
    # The parameters schemas go to parsers that type text values by them (qwen3_coder).
    assert auto.tool_parameters == {
        "get_weather": WEATHER["function"]["parameters"],
        "get_time": {"type": "object"},
    }
    # Without guided decoding a forced call cannot be enforced: refused, never silently unforced.
    with pytest.raises(UnsupportedParameterError) as refused:
        plan(tools=[WEATHER], tool_choice="required", guided_decoding=False)
    assert refused.value.param == "tool_choice"
    assert json.loads(named.guide[1])["properties"]["name"] == {"type": "string", "enum": ["get_time"]}


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
@pytest.mark.parametrize("tool_format", ["none", "hermes"])
def test_a_forced_call_on_a_template_without_tools_is_guided_and_renders_no_tools(
    tool_choice: Any, tool_format: str
) -> None:
    out = plan(
        tools=[WEATHER],
        tool_choice=tool_choice,
        model_tool_format=tool_format,
        template_renders_tools=False,
    )
    assert out.template_tools is None
    assert out.forced and out.tool_format == "json"
    assert out.guide is not None and out.guide[0] == "json_schema"
    assert "get_weather" in out.guide[1]
    # The same choice on a template that renders tools shows them to the model too.
    shown = plan(tools=[WEATHER], tool_choice=tool_choice, model_tool_format=tool_format)
    assert shown.template_tools is not None and shown.guide == out.guide


def test_auto_on_a_template_without_tools_still_hands_them_to_the_template() -> None:
    # The template (and so the tokenizer's 400) decides: the model would never see the tools.
    out = plan(tools=[WEATHER], tool_choice="auto", template_renders_tools=False)
    assert out.template_tools is not None and not out.forced
