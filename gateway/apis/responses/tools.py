"""Responses `tools`, `tool_choice` and `text.format` -> what chat completions takes (chat-shaped
tools, tool choice and response format, which the core checks and plans). Pure.

Function tools pass through; a `namespace` tool's functions are offered as `<namespace>__<name>`
and mapped back when the model calls one. Tools the gateway cannot run (hosted tools such as
web_search, file_search, code_interpreter, computer use, mcp, and custom/shell/patch tools) are
left out of what the model sees and reported in `ToolPlan.skipped`; with `strict` they are a 400
naming them."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gateway.apis.responses.items import tool_name
from gateway.apis.responses.protocol import TextParam
from gateway.errors import InvalidRequestError, UnsupportedParameterError

# Every other tool type in the spec's `Tool` union: valid, but not something this gateway runs.
UNRUNNABLE_TOOLS: Final = frozenset(
    {
        "file_search",
        "computer",
        "computer_use",
        "computer_use_preview",
        "web_search",
        "web_search_2025_08_26",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "mcp",
        "code_interpreter",
        "programmatic_tool_calling",
        "image_generation",
        "local_shell",
        "shell",
        "custom",
        "tool_search",
        "apply_patch",
    }
)

_NAME_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True, slots=True)
class ToolPlan:
    # Chat-shaped tools ({"type": "function", "function": {...}}), as the core takes them.
    chat_tools: list[dict[str, Any]] | None
    chat_tool_choice: str | dict[str, Any] | None
    # The name the model calls -> (namespace or None, function name), to map calls back.
    names: Mapping[str, tuple[str | None, str]]
    # Tool types left out (not runnable here), in request order, for the log and the metric.
    skipped: tuple[str, ...]


def _str(obj: Mapping[str, Any], key: str, where: str, *, required: bool) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise InvalidRequestError(f"Missing required parameter: '{where}.{key}'.", param=f"{where}.{key}")
        return None
    if not isinstance(value, str):
        raise InvalidRequestError(
            f"Invalid type for '{where}.{key}': expected a string.", param=f"{where}.{key}"
        )
    return value


def _function(obj: Mapping[str, Any], where: str, namespace: str | None) -> tuple[str, dict[str, Any]]:
    name = _str(obj, "name", where, required=True)
    assert name is not None
    if not _NAME_RE.fullmatch(name):
        raise InvalidRequestError(
            f"Invalid '{where}.name': must be 1 to 64 letters, digits, underscores or dashes.",
            param=f"{where}.name",
        )
    function: dict[str, Any] = {"name": tool_name(name, namespace)}
    description = _str(obj, "description", where, required=False)
    if description is not None:
        function["description"] = description
    parameters = obj.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, Mapping) or (parameters and parameters.get("type") != "object"):
            raise InvalidRequestError(
                f"Invalid '{where}.parameters': must be a JSON schema of type 'object'.",
                param=f"{where}.parameters",
            )
        function["parameters"] = dict(parameters)
    strict = obj.get("strict")
    if strict is not None:
        if not isinstance(strict, bool):
            raise InvalidRequestError(
                f"Invalid type for '{where}.strict': expected a boolean.", param=f"{where}.strict"
            )
        function["strict"] = strict
    return name, function


def plan_tools(tools: Sequence[Any] | None, tool_choice: object, *, strict: bool) -> ToolPlan:
    chat_tools: list[dict[str, Any]] = []
    names: dict[str, tuple[str | None, str]] = {}
    skipped: list[str] = []

    def add(function: dict[str, Any], namespace: str | None, name: str, where: str) -> None:
        flat = function["name"]
        if flat in names:
            raise InvalidRequestError(
                f"Duplicate function name {flat!r} in 'tools': names must be unique.", param=f"{where}.name"
            )
        names[flat] = (namespace, name)
        chat_tools.append({"type": "function", "function": function})

    for i, tool in enumerate(tools or ()):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise InvalidRequestError(f"Invalid type for '{where}': expected an object.", param=where)
        kind = tool.get("type")
        if kind == "function":
            name, function = _function(tool, where, None)
            add(function, None, name, where)
        elif kind == "namespace":
            namespace = _str(tool, "name", where, required=True)
            assert namespace is not None
            if not _NAME_RE.fullmatch(namespace):
                raise InvalidRequestError(
                    f"Invalid '{where}.name': must be 1 to 64 letters, digits, underscores or dashes.",
                    param=f"{where}.name",
                )
            members = tool.get("tools")
            if not isinstance(members, list) or not members:
                raise InvalidRequestError(
                    f"Invalid '{where}.tools': expected a non-empty array of tools.", param=f"{where}.tools"
                )
            for j, member in enumerate(members):
                inner = f"{where}.tools[{j}]"
                member_kind = member.get("type") if isinstance(member, Mapping) else None
                if member_kind == "custom":
                    skipped.append("custom")
                    if strict:
                        raise _unrunnable("custom", inner)
                    continue
                if member_kind != "function":
                    raise InvalidRequestError(
                        f"Invalid value for '{inner}.type': a namespace holds function or custom tools.",
                        param=f"{inner}.type",
                    )
                name, function = _function(member, inner, namespace)
                add(function, namespace, name, inner)
        elif isinstance(kind, str) and kind in UNRUNNABLE_TOOLS:
            if strict:
                raise _unrunnable(kind, where)
            skipped.append(kind)
        else:
            raise InvalidRequestError(
                f"Invalid value for '{where}.type': {kind!r} is not a tool type.", param=f"{where}.type"
            )
    choice = _tool_choice(tool_choice, names)
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        # Only the allowed functions are offered; the mode becomes chat's "auto" or "required".
        allowed = set(choice["names"])
        chat_tools = [t for t in chat_tools if t["function"]["name"] in allowed]
        choice = choice["mode"]
    return ToolPlan(chat_tools or None, choice, names, tuple(skipped))


def _unrunnable(kind: str, where: str) -> UnsupportedParameterError:
    return UnsupportedParameterError(
        f"Tools of type '{kind}' are not supported by this server ({where}).", param=f"{where}.type"
    )


def _tool_choice(choice: object, names: Mapping[str, tuple[str | None, str]]) -> str | dict[str, Any] | None:
    if choice is None or choice in ("none", "auto", "required"):
        if choice in ("auto", "required") and not names:
            raise InvalidRequestError(
                f"tool_choice {choice!r} needs at least one function tool in 'tools'.", param="tool_choice"
            )
        return choice
    if not isinstance(choice, Mapping):
        raise InvalidRequestError("Invalid 'tool_choice'.", param="tool_choice")
    kind = choice.get("type")
    if kind == "function":
        name = choice.get("name")
        if not isinstance(name, str):
            raise InvalidRequestError(
                "Missing required parameter: 'tool_choice.name'.", param="tool_choice.name"
            )
        flat = _resolve(name, names)
        if flat is None:
            raise InvalidRequestError(
                f"Invalid 'tool_choice': function {name!r} is not in 'tools'.", param="tool_choice.name"
            )
        return {"type": "function", "function": {"name": flat}}
    if kind == "allowed_tools":
        mode = choice.get("mode")
        allowed = choice.get("tools")
        if mode not in ("auto", "required"):
            raise InvalidRequestError(
                "Invalid 'tool_choice.mode': expected 'auto' or 'required'.", param="tool_choice.mode"
            )
        if not isinstance(allowed, list):
            raise InvalidRequestError(
                "Missing required parameter: 'tool_choice.tools'.", param="tool_choice.tools"
            )
        return {"type": "allowed_tools", "mode": mode, "names": _allowed(allowed, names)}
    if kind in UNRUNNABLE_TOOLS or kind in ("mcp", "custom"):
        raise UnsupportedParameterError(
            f"tool_choice cannot require a '{kind}' tool: this server does not run it.",
            param="tool_choice.type",
        )
    raise InvalidRequestError(f"Invalid value for 'tool_choice.type': {kind!r}.", param="tool_choice.type")


def _resolve(name: str, names: Mapping[str, tuple[str | None, str]]) -> str | None:
    if name in names:
        return name
    # A bare function name picks a namespaced function when only one has it.
    matches = [flat for flat, (_, bare) in names.items() if bare == name]
    return matches[0] if len(matches) == 1 else None


def _allowed(allowed: list[Any], names: Mapping[str, tuple[str | None, str]]) -> list[str]:
    out = []
    for j, tool in enumerate(allowed):
        where = f"tool_choice.tools[{j}]"
        if (
            not isinstance(tool, Mapping)
            or tool.get("type") != "function"
            or not isinstance(tool.get("name"), str)
        ):
            raise InvalidRequestError(
                f"Invalid '{where}': this server allows function tools only.", param=where
            )
        flat = _resolve(tool["name"], names)
        if flat is None:
            raise InvalidRequestError(
                f"Invalid '{where}': function {tool['name']!r} is not in 'tools'.", param=where
            )
        out.append(flat)
    return out


def response_format(text: TextParam | None) -> dict[str, Any] | None:
    """`text.format` as chat's `response_format`."""
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.json_schema is None:
        raise InvalidRequestError(
            "Missing required parameter: 'text.format.schema'.", param="text.format.schema"
        )
    if not fmt.name:
        raise InvalidRequestError("Missing required parameter: 'text.format.name'.", param="text.format.name")
    spec: dict[str, Any] = {"name": fmt.name, "schema": fmt.json_schema}
    if fmt.strict is not None:
        spec["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": spec}
