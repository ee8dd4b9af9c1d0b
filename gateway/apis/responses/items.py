"""Input items -> the chat messages a chat template takes. Pure.

`parse_input` checks each item and names the bad one (`input[2].content[0].type`); `to_messages`
turns instructions and items into chat-template messages: function_call items become an
assistant turn's `tool_calls`, function_call_output items `tool` messages, and the text of a
reasoning item handed back goes to the next assistant turn's `reasoning_content` (the key the
reasoning models' templates read). `truncate` drops the oldest items for `truncation: auto`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from pydantic import TypeAdapter, ValidationError

from gateway.apis.responses.protocol import (
    FunctionCall,
    FunctionCallOutput,
    InputItem,
    ItemReference,
    Message,
    Reasoning,
)
from gateway.core.prompt import template_arguments, template_content
from gateway.errors import InvalidRequestError, UnsupportedParameterError
from gateway.media import ImageRef

_ADAPTERS: Final[dict[str, TypeAdapter[Any]]] = {
    "message": TypeAdapter(Message),
    "function_call": TypeAdapter(FunctionCall),
    "function_call_output": TypeAdapter(FunctionCallOutput),
    "reasoning": TypeAdapter(Reasoning),
    "item_reference": TypeAdapter(ItemReference),
}

# Item types the spec has that this gateway cannot take (hosted tools' calls, other tool kinds).
_SPEC_ONLY_ITEMS: Final = frozenset(
    {
        "file_search_call",
        "computer_call",
        "computer_call_output",
        "web_search_call",
        "tool_search_call",
        "tool_search_output",
        "additional_tools",
        "compaction",
        "compaction_trigger",
        "image_generation_call",
        "code_interpreter_call",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "mcp_call",
        "custom_tool_call",
        "custom_tool_call_output",
        "program",
        "program_output",
    }
)

# Content part types the spec allows in a message, and which of them are text.
_TEXT_PARTS: Final = {"input_text": "text", "output_text": "text", "refusal": "refusal"}
_MEDIA_PARTS: Final = frozenset({"input_file", "input_audio"})
# Where input_image parts are taken: input messages (not an assistant's) and function call outputs.
_IMAGE_ROLES: Final = frozenset({"user", "system", "developer"})


_TYPE_NAMES: Final = frozenset({"str", "int", "float", "bool", "dict", "list"})


def _param(base: str, loc: Sequence[int | str]) -> str:
    out = base
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _first_error(exc: ValidationError, base: str) -> InvalidRequestError:
    err = exc.errors(include_url=False)[0]
    # A union's branches appear in the location as type names (`str`, `list[...]`): not fields.
    loc = [p for p in err["loc"] if isinstance(p, int) or (p not in _TYPE_NAMES and "[" not in p)]
    param = _param(base, loc)
    if err["type"] == "missing":
        return InvalidRequestError(f"Missing required parameter: '{param}'.", param=param)
    return InvalidRequestError(f"Invalid '{param}': {err['msg']}.", param=param)


def parse_input(raw: str | Sequence[Mapping[str, Any]] | None) -> list[InputItem]:
    """The request's `input` as items; a string is one user message."""
    if raw is None:
        return []
    if isinstance(raw, str):
        return [Message(role="user", content=raw)]
    items: list[InputItem] = []
    for i, obj in enumerate(raw):
        where = f"input[{i}]"
        kind = obj.get("type")
        if kind is None:
            # A message may leave its type out (EasyInputMessage); nothing else may.
            if "role" not in obj:
                raise InvalidRequestError(
                    f"Missing required parameter: '{where}.type'.", param=f"{where}.type"
                )
            kind = "message"
        if not isinstance(kind, str) or (kind not in _ADAPTERS and kind not in _SPEC_ONLY_ITEMS):
            raise InvalidRequestError(
                f"Invalid value for '{where}.type': {kind!r} is not an input item type.",
                param=f"{where}.type",
            )
        if kind in _SPEC_ONLY_ITEMS:
            raise UnsupportedParameterError(
                f"Input items of type '{kind}' are not supported by this server ({where}).",
                param=f"{where}.type",
            )
        try:
            item = _ADAPTERS[kind].validate_python(obj)
        except ValidationError as exc:
            raise _first_error(exc, where) from None
        _check_parts(item, where)
        items.append(item)
    return items


def _check_parts(item: InputItem, where: str) -> None:
    parts: Any = None
    if isinstance(item, Message) and isinstance(item.content, list):
        parts, base = item.content, f"{where}.content"
    elif isinstance(item, FunctionCallOutput) and isinstance(item.output, list):
        parts, base = item.output, f"{where}.output"
    if parts is None:
        return
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, Mapping) else None
        at = f"{base}[{j}]"
        if kind in _MEDIA_PARTS:
            raise UnsupportedParameterError(
                f"Content parts of type '{kind}' are not supported by this model ({at}).", param=f"{at}.type"
            )
        if kind == "input_image":
            _check_image(part, item, at)
            continue
        if kind not in _TEXT_PARTS:
            raise InvalidRequestError(
                f"Invalid value for '{at}.type': {kind!r} is not a content part type.", param=f"{at}.type"
            )
        if kind == "refusal" and isinstance(item, FunctionCallOutput):
            raise InvalidRequestError(f"'{at}' must be an input_text part.", param=f"{at}.type")
        key = _TEXT_PARTS[kind]
        if not isinstance(part.get(key), str):
            raise InvalidRequestError(f"Missing required parameter: '{at}.{key}'.", param=f"{at}.{key}")


def _check_image(part: Mapping[str, Any], item: InputItem, at: str) -> None:
    if isinstance(item, Message) and item.role not in _IMAGE_ROLES:
        raise InvalidRequestError(
            f"Invalid value for '{at}.type': an {item.role} message cannot contain input_image parts.",
            param=f"{at}.type",
        )
    if part.get("file_id") is not None:
        raise UnsupportedParameterError(
            f"'{at}.file_id' is not supported: this server has no Files API; send the image as "
            "image_url (an http(s) URL or a data: URI).",
            param=f"{at}.file_id",
        )
    if not isinstance(part.get("image_url"), str):
        raise InvalidRequestError(f"Missing required parameter: '{at}.image_url'.", param=f"{at}.image_url")
    detail = part.get("detail")
    if detail is not None and detail not in ("auto", "low", "high", "original"):
        raise InvalidRequestError(
            f"Invalid value for '{at}.detail': {detail!r} is not one of auto, low, high.",
            param=f"{at}.detail",
        )


def _text(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(part[_TEXT_PARTS[part["type"]]] for part in content)


def _content(
    content: str | list[dict[str, Any]], at: str, images: list[ImageRef] | None
) -> str | list[dict[str, Any]]:
    """A message's (or function output's) content for the template: text parts joined, image
    parts in place (the Hugging Face convention) with their references appended to `images`."""
    if isinstance(content, str):
        return content
    parts: list[str | ImageRef] = []
    for j, part in enumerate(content):
        if part["type"] == "input_image":
            parts.append(ImageRef(part["image_url"], f"{at}[{j}].image_url"))
        else:
            parts.append(part[_TEXT_PARTS[part["type"]]])
    if images is None:
        images = []
    return template_content(parts, images)


def tool_name(name: str, namespace: str | None) -> str:
    """The name the model sees for a function, namespaced ones included (see tools.py)."""
    return f"{namespace}__{name}" if namespace else name


def to_messages(
    items: Sequence[InputItem],
    instructions: str | None,
    *,
    reasoning_text: Callable[[Reasoning, int], str | None],
    images: list[ImageRef] | None = None,
) -> list[dict[str, Any]]:
    """Chat-template messages for the instructions and items. `reasoning_text(item, position)`
    gives a handed-back reasoning item's text (its content, or its sealed content unsealed).
    Image parts become the template's image parts, their references appended to `images` in
    prompt order."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    reasoning: list[str] = []
    # The assistant message that function calls join, while nothing else came after it.
    open_turn: dict[str, Any] | None = None

    def assistant(content: str) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            message["reasoning_content"] = "\n".join(reasoning)
            reasoning.clear()
        messages.append(message)
        return message

    for position, item in enumerate(items):
        if isinstance(item, Message):
            if item.role == "assistant":
                open_turn = assistant(_text(item.content))
                continue
            role = "system" if item.role == "developer" else item.role
            messages.append(
                {"role": role, "content": _content(item.content, f"input[{position}].content", images)}
            )
        elif isinstance(item, FunctionCall):
            if open_turn is None:
                open_turn = assistant("")
            elif reasoning:
                # Reasoning between two calls of one turn belongs to the same turn.
                open_turn["reasoning_content"] = (
                    open_turn.get("reasoning_content", "") + "\n" + "\n".join(reasoning)
                ).lstrip("\n")
                reasoning.clear()
            open_turn.setdefault("tool_calls", []).append(
                {
                    "id": item.call_id,
                    "type": "function",
                    "function": {
                        "name": tool_name(item.name, item.namespace),
                        "arguments": template_arguments(item.arguments),
                    },
                }
            )
            continue
        elif isinstance(item, FunctionCallOutput):
            output = _content(item.output, f"input[{position}].output", images)
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
        elif isinstance(item, Reasoning):
            text = reasoning_text(item, position)
            if text:
                reasoning.append(text)
            continue
        else:  # ItemReference: resolved before translation
            raise InvalidRequestError(
                f"Item reference {item.id!r} was not found.", param=f"input[{position}].id"
            )
        open_turn = None
    return messages


def truncate(items: Sequence[InputItem], fits: Callable[[Sequence[InputItem]], bool]) -> list[InputItem]:
    """The longest suffix of `items` that `fits` (dropping the oldest items first, as OpenAI's
    `truncation: auto` does), never starting with a tool result or call whose turn was cut.
    `fits` must be monotonic: fewer items never fit worse. Raises when not even the last fits."""
    items = list(items)
    lo, hi = 0, len(items)  # the answer (items to drop) lies in [lo, hi]
    if fits(items):
        return items
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(_clean_start(items[mid:])):
            hi = mid
        else:
            lo = mid + 1
    kept = _clean_start(items[lo:])
    if not kept or not fits(kept):
        raise InvalidRequestError(
            "The input exceeds the model's context length even with older items dropped.", param="input"
        )
    return kept


def _clean_start(items: list[InputItem]) -> list[InputItem]:
    # A conversation cut inside a tool round must not start with its calls' results.
    start = 0
    while start < len(items) and isinstance(items[start], (FunctionCallOutput, FunctionCall, Reasoning)):
        start += 1
    return items[start:]
