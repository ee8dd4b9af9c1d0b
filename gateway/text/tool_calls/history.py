"""Earlier tool calls as a chat template is given them: the arguments as an object, which is what
templates that serialize them (``arguments | tojson``: Qwen, Llama 3.1, Hermes) index into, and
which still writes out as the client's own JSON text where a template pastes them in as a string
(DeepSeek V3's ``'```json\\n' + arguments + '\\n```'``). Either way they appear once, never encoded twice."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class TemplateArguments(dict[str, Any]):
    """A call's arguments object that is also its JSON text: `tojson` and indexing see the object;
    string concatenation (``+``, ``~``) and ``{{ arguments }}`` see the text the client sent."""

    __slots__ = ("text",)

    def __init__(self, value: Mapping[str, Any], text: str) -> None:
        super().__init__(value)
        self.text = text

    def __str__(self) -> str:
        return self.text

    def __add__(self, other: object) -> str:
        if isinstance(other, str):
            return self.text + other
        return NotImplemented

    def __radd__(self, other: object) -> str:
        if isinstance(other, str):
            return other + self.text
        return NotImplemented


def template_arguments(raw: str | Mapping[str, Any]) -> Any:
    """A call's arguments for the chat template: `raw` is the JSON text a client sent (OpenAI) or
    the object (Anthropic's `input`). Text that is not a JSON object is passed on as it is."""
    if isinstance(raw, Mapping):
        return TemplateArguments(raw, json.dumps(raw, ensure_ascii=False))
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return TemplateArguments(value, raw) if isinstance(value, dict) else raw
