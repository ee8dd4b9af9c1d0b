"""The tool-call formats by name: adding a format is adding its file under `formats/` and one
line here. The per-model setting's allowed values (`tool_parser`) come from here; the names are
vLLM's (`--tool-call-parser`), so a vLLM deployment's flags carry over."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Final

from gateway.errors import ServerConfigError
from gateway.text.tool_calls.base import ToolCallFormat, new_tool_call_id
from gateway.text.tool_calls.formats import deepseek_v3, hermes, json, llama3_json, mistral, qwen3_coder

_BY_NAME: Final[dict[str, ToolCallFormat]] = {
    f.name: f
    for f in (
        llama3_json.FORMAT,
        hermes.FORMAT,
        qwen3_coder.FORMAT,
        mistral.FORMAT,
        deepseek_v3.FORMAT,
        json.FORMAT,
    )
}

# gpt-oss's harmony format: its calls are messages on the commentary channel, read with the rest
# of the reply by the harmony channel parser (`gateway.text.reasoning.formats.gpt_oss`), which a
# model with this tool parser gets whatever its reasoning_parser says.
HARMONY: Final = "openai"

# Other names vLLM accepts for the same formats.
_ALIASES: Final = {"qwen3_xml": "qwen3_coder"}

# Every name a parser accepts: each format's, harmony's, and "none" (no parsing; everything is content).
FORMATS: Final = (*_BY_NAME, HARMONY, *_ALIASES, "none")
# What a model may be configured with: "none" or a model family's format (not the guided "json").
MODEL_FORMATS: Final = ("none", *(name for name in FORMATS if name not in ("json", "none")))


def check_format(name: str) -> str:
    """The format's own name, if `name` is one of the registered formats or their aliases (a
    per-model setting, checked at start-up)."""
    if name not in FORMATS:
        raise ServerConfigError(f"Unknown tool call format {name!r}; expected one of {', '.join(FORMATS)}")
    return _ALIASES.get(name, name)


def get_format(name: str) -> ToolCallFormat | None:
    """The format called `name` (None for "none", and for harmony, whose calls come from the
    reply's channel parser)."""
    return _BY_NAME.get(check_format(name))


def needs_special_tokens(name: str, skipped: Collection[str]) -> bool:
    """Whether a reply parsed with format `name` must be decoded with special tokens kept: its
    markers are among `skipped`, the tokens a default decode leaves out (Llama 3.1's
    ``<|python_tag|>``, Mistral's ``[TOOL_CALLS]``; Qwen's and DeepSeek's are ordinary added tokens)."""
    fmt = get_format(name)
    return fmt is not None and any(marker in skipped for marker in fmt.markers)


def call_id_maker(name: str) -> Callable[[], str]:
    """How the gateway names the calls a model with format `name` writes (vLLM's ids for the same
    format: OpenAI's shape, Mistral's 9 letters and digits)."""
    fmt = get_format(name) if name in FORMATS else None
    return fmt.new_call_id if fmt is not None else new_tool_call_id


def template_call_ids(name: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with the call ids handed back (assistant `tool_calls[].id`, a tool turn's
    `tool_call_id`) in the form the format's template takes (`ToolCallFormat.template_call_id`)."""
    fmt = get_format(name) if name in FORMATS else None
    if fmt is None or fmt.call_id_length is None:
        return messages
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        result = message.get("tool_call_id")
        if not calls and not isinstance(result, str):
            out.append(message)
            continue
        message = dict(message)
        if calls:
            message["tool_calls"] = [
                {**call, "id": fmt.template_call_id(call["id"])} if isinstance(call.get("id"), str) else call
                for call in calls
            ]
        if isinstance(result, str):
            message["tool_call_id"] = fmt.template_call_id(result)
        out.append(message)
    return out
