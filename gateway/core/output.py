"""Structured output and tool calls (checked with the rest of a request, see validation): which
guide the engine gets, which tools the chat template sees, and how the reply is parsed. Pure; no
I/O; API-neutral (each API passes its own tools, tool choice and response format)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import InvalidRequestError, UnsupportedParameterError
from gateway.text.tool_calls import (
    FunctionTool,
    ToolChoice,
    output_format,
    resolve_tool_choice,
    tool_call_json_schema,
    validate_tools,
)


@dataclass(frozen=True, slots=True)
class OutputPlan:
    guide: tuple[str, str] | None
    # Tools as the chat template wants them (OpenAI's shape), or None to render none.
    template_tools: list[dict[str, Any]] | None
    # How to parse the reply for tool calls ("none": plain content).
    tool_format: str
    tool_names: frozenset[str]
    # Each declared tool's parameters schema (formats that write values as text type them by it).
    tool_parameters: Mapping[str, Any] = field(default_factory=dict)
    # True when guided decoding forces the reply to be a call (parsed as one from its first token),
    # and `forced_name` the function it must be when that is known before the model writes it.
    forced: bool = False
    forced_name: str | None = None


def plan_output(
    *,
    tools: object,
    tool_choice: object,
    parallel_tool_calls: bool | None,
    response_format: dict[str, Any] | None,
    model_tool_format: str,
    guided_decoding: bool,
    structured_outputs: dict[str, Any] | None = None,
    template_renders_tools: bool = True,
) -> OutputPlan:
    """`template_renders_tools`: whether the model's chat template shows `tools` to the model.
    Where it does not, a call forced by guided decoding is still served (the guide's schema, not
    the prompt, makes the reply a valid call, as vLLM does), with no tools given to the template;
    `auto` stays the template's 400, since the model would never know the tools exist."""
    checked = validate_tools(tools)
    choice = resolve_tool_choice(tool_choice, checked)
    guide = _response_format_guide(response_format, guided_decoding)
    structured = _structured_outputs_guide(structured_outputs, guided_decoding)
    if structured is not None:
        if guide is not None:
            raise InvalidRequestError(
                "structured_outputs cannot be combined with response_format", param="structured_outputs"
            )
        guide = structured
    if choice.mode == "none" or not checked:
        return OutputPlan(guide, None, "none", frozenset())
    forced = choice.mode in ("required", "function")
    if forced and not guided_decoding:
        # Only guided decoding makes a reply a tool call; a model asked nicely may answer in prose.
        raise UnsupportedParameterError(
            f"this model has no guided decoding, so tool_choice {_choice_name(choice)} cannot be enforced "
            "(use tool_choice auto)",
            param="tool_choice",
        )
    if model_tool_format == "none" and not (forced and guided_decoding):
        raise UnsupportedParameterError(
            "this model has no tool-call parser configured (set tool_parser for it), so it cannot return "
            "tool calls" + ("" if guided_decoding else " and has no guided decoding to force one"),
            param="tools",
        )
    if forced and guided_decoding:
        if guide is not None:
            param = "structured_outputs" if structured is not None else "response_format"
            raise InvalidRequestError(
                f"{param} cannot be combined with a required or named tool_choice", param=param
            )
        schema = tool_call_json_schema(
            checked, choice, parallel_tool_calls, _schema_format(model_tool_format)
        )
        assert schema is not None  # required/named always have one
        guide = ("json_schema", json.dumps(schema))
    parse = output_format(
        model_tool_format if model_tool_format != "none" else "json",
        choice,
        guided=forced and guided_decoding,
    )
    offered = _offered(checked, choice)
    guided_call = forced and guided_decoding
    return OutputPlan(
        guide,
        [_template_tool(t) for t in offered] if template_renders_tools or not guided_call else None,
        parse,
        frozenset(t.name for t in checked),
        {t.name: t.parameters for t in checked if t.parameters},
        forced=guided_call,
        forced_name=offered[0].name if guided_call and len(offered) == 1 else None,
    )


def _choice_name(choice: ToolChoice) -> str:
    return repr(choice.name) if choice.mode == "function" else repr(choice.mode)


def _schema_format(model_tool_format: str) -> str:
    # The schema's argument key follows the model's own format; "json" when it has none.
    return model_tool_format if model_tool_format != "none" else "json"


def _offered(tools: tuple[FunctionTool, ...], choice: ToolChoice) -> tuple[FunctionTool, ...]:
    if choice.mode == "function":
        return tuple(t for t in tools if t.name == choice.name)
    return tools


def _template_tool(tool: FunctionTool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    function["parameters"] = (
        dict(tool.parameters) if tool.parameters else {"type": "object", "properties": {}}
    )
    return {"type": "function", "function": function}


def _response_format_guide(fmt: dict[str, Any] | None, guided_decoding: bool) -> tuple[str, str] | None:
    if fmt is None:
        return None
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind not in ("json_object", "json_schema"):
        raise InvalidRequestError(
            f"response_format type {kind!r} is not supported", param="response_format.type"
        )
    if not guided_decoding:
        raise UnsupportedParameterError(
            "this model has no guided decoding, so response_format cannot be enforced",
            param="response_format",
        )
    if kind == "json_object":
        return ("json", "")
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise InvalidRequestError(
            "response_format.json_schema.schema must be a JSON schema object",
            param="response_format.json_schema",
        )
    return ("json_schema", json.dumps(schema))


# vLLM's `structured_outputs` kinds, as the engine's guide types.
_STRUCTURED_KINDS = ("json", "regex", "choice", "grammar")


def _structured_outputs_guide(spec: dict[str, Any] | None, guided_decoding: bool) -> tuple[str, str] | None:
    """vLLM's `structured_outputs` (one of `json`: a JSON schema, `regex`, `choice`: a list of
    strings, `grammar`: EBNF) as an engine guide; None when the request has none."""
    if spec is None:
        return None
    given = [kind for kind in _STRUCTURED_KINDS if spec.get(kind) is not None]
    if len(given) != 1:
        raise InvalidRequestError(
            "structured_outputs must give exactly one of " + ", ".join(_STRUCTURED_KINDS),
            param="structured_outputs",
        )
    if not guided_decoding:
        raise UnsupportedParameterError(
            "this model has no guided decoding, so structured_outputs cannot be enforced",
            param="structured_outputs",
        )
    kind = given[0]
    value = spec[kind]
    where = f"structured_outputs.{kind}"
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise InvalidRequestError(f"{where} must be a JSON schema", param=where) from None
        if not isinstance(value, dict):
            raise InvalidRequestError(f"{where} must be a JSON schema object", param=where)
        return ("json_schema", json.dumps(value))
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise InvalidRequestError(f"{where} must be a non-empty list of strings", param=where)
        return ("regex", "|".join(f"({re.escape(c)})" for c in value))
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{where} must be a non-empty string", param=where)
    return ("regex", value) if kind == "regex" else ("ebnf_grammar", value)
