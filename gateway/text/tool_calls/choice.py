"""Checking a request's `tools` and `tool_choice`, and the JSON schema that makes a model call a tool.

How the schema is used: JSON-schema guided decoding can only shape JSON, not the tags around
it (``<tool_call>``, ``[TOOL_CALLS]``, ``<|python_tag|>``). So when a request is guided by
`tool_call_json_schema`, the model's whole reply is the bare call JSON, whatever its native
format, and the reply must be parsed with the ``json`` format (`output_format` says which
format to parse with). The schema still follows the model's training where it can: Llama's
calls name their arguments ``parameters``, the others ``arguments``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from gateway.errors import InvalidRequestError
from gateway.text.tool_calls.registry import check_format

# OpenAI's rule for function names.
_NAME_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True, slots=True)
class FunctionTool:
    name: str
    description: str | None = None
    # The JSON schema of the arguments object; None when the request gave none.
    parameters: Mapping[str, Any] | None = None
    strict: bool = False


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: Literal["none", "auto", "required", "function"]
    # The function the model must call, for mode "function".
    name: str | None = None


def validate_tools(tools: object) -> tuple[FunctionTool, ...]:
    """The request's `tools`, checked. Errors name the offending field, e.g. ``tools[1].function.name``."""
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise InvalidRequestError("'tools' must be an array of tools.", param="tools")
    out: list[FunctionTool] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise InvalidRequestError(f"'{where}' must be an object.", param=where)
        if tool.get("type") != "function":
            raise InvalidRequestError(
                f"'{where}.type' must be 'function'; other tool types are not supported.",
                param=f"{where}.type",
            )
        function = tool.get("function")
        if not isinstance(function, Mapping):
            raise InvalidRequestError(f"'{where}.function' must be an object.", param=f"{where}.function")
        name = function.get("name")
        if name is None:
            raise InvalidRequestError(
                f"Missing required parameter: '{where}.function.name'.", param=f"{where}.function.name"
            )
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise InvalidRequestError(
                f"Invalid '{where}.function.name': must be 1 to 64 letters, digits, underscores or dashes.",
                param=f"{where}.function.name",
            )
        if name in seen:
            raise InvalidRequestError(
                f"Duplicate function name {name!r} in 'tools': names must be unique.",
                param=f"{where}.function.name",
            )
        seen.add(name)
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise InvalidRequestError(
                f"'{where}.function.description' must be a string.", param=f"{where}.function.description"
            )
        parameters = function.get("parameters")
        if parameters is not None and not _is_object_schema(parameters):
            raise InvalidRequestError(
                f"Invalid '{where}.function.parameters': must be a JSON schema of type 'object'.",
                param=f"{where}.function.parameters",
            )
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise InvalidRequestError(
                f"'{where}.function.strict' must be a boolean.", param=f"{where}.function.strict"
            )
        out.append(FunctionTool(name, description, parameters, bool(strict)))
    return tuple(out)


def _is_object_schema(schema: object) -> bool:
    # `{}` is accepted as "any arguments object": some clients send it for functions without parameters.
    return isinstance(schema, Mapping) and (not schema or schema.get("type") == "object")


def resolve_tool_choice(tool_choice: object, tools: Sequence[FunctionTool]) -> ToolChoice:
    """The request's `tool_choice`, checked against its tools. Absent means "auto" when there are
    tools and "none" otherwise, as in OpenAI's API."""
    if tool_choice is None:
        return ToolChoice("auto" if tools else "none")
    if tool_choice in ("none", "auto", "required"):
        mode: Literal["none", "auto", "required"] = tool_choice
        if mode != "none" and not tools:
            raise InvalidRequestError(
                f"tool_choice {mode!r} is only allowed when 'tools' are specified.", param="tool_choice"
            )
        return ToolChoice(mode)
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if tool_choice.get("type") != "function" or not isinstance(name, str):
            raise InvalidRequestError(
                'Invalid \'tool_choice\': expected {"type": "function", "function": {"name": ...}}.',
                param="tool_choice",
            )
        if not any(tool.name == name for tool in tools):
            raise InvalidRequestError(
                f"Invalid 'tool_choice': function {name!r} is not in 'tools'.",
                param="tool_choice.function.name",
            )
        return ToolChoice("function", name)
    raise InvalidRequestError(
        "Invalid 'tool_choice': expected 'none', 'auto', 'required' or a function.", param="tool_choice"
    )


def tool_call_json_schema(
    tools: Sequence[FunctionTool],
    tool_choice: ToolChoice,
    parallel_tool_calls: bool | None,
    format: str,
) -> dict[str, Any] | None:
    """A JSON schema that only admits a valid call (or, with parallel calls allowed, a non-empty
    array of them) for "required" and a named function; None for "none" and "auto", where the
    model may answer in prose, which no JSON schema can express.

    Guide the generation with it (guided_decoding_guide_type "json_schema") and parse the reply
    with the "json" format (see `output_format`); the parser accepts both shapes.
    """
    check_format(format)
    if tool_choice.mode in ("none", "auto"):
        return None
    candidates = [t for t in tools if tool_choice.mode == "required" or t.name == tool_choice.name]
    if not candidates:
        raise InvalidRequestError("tool_choice requires a tool, but 'tools' is empty.", param="tool_choice")
    variants = [_call_schema(t, arguments_key(format)) for t in candidates]
    call = variants[0] if len(variants) == 1 else {"anyOf": variants}
    # A named function is one call to it. Otherwise parallel calls are allowed unless the request
    # says no (OpenAI's default), at most one per offered tool: a guided model that never wants to
    # stop would otherwise write calls until it runs out of tokens.
    if tool_choice.mode == "function" or parallel_tool_calls is False:
        return call
    return {"type": "array", "items": call, "minItems": 1, "maxItems": len(candidates)}


def arguments_key(format: str) -> str:
    """The key a guided call's JSON gives its arguments under: the model's own format's (Llama 3's
    JSON calls write `parameters`), else "arguments"."""
    return "parameters" if format == "llama3_json" else "arguments"


def _call_schema(tool: FunctionTool, key: str) -> dict[str, Any]:
    parameters = dict(tool.parameters) if tool.parameters else {"type": "object"}
    return {
        "type": "object",
        # "name" first: guided decoders emit properties in order, so the model picks the
        # function before it writes arguments for it.
        "properties": {"name": {"type": "string", "enum": [tool.name]}, key: parameters},
        "required": ["name", key],
        "additionalProperties": False,
    }


def output_format(model_format: str, tool_choice: ToolChoice, *, guided: bool) -> str:
    """Which format to parse a reply with: nothing for "none" (the model was asked not to call),
    bare JSON when `tool_call_json_schema` guided the reply, else the model's own format."""
    check_format(model_format)
    if tool_choice.mode == "none":
        return "none"
    if guided and tool_choice.mode in ("required", "function"):
        return "json"
    return model_format
