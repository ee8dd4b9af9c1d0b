"""The tool-call formats by name: adding a format is adding its file under `formats/` and one
line here. The per-model setting's allowed values (`tool_parser`) come from here."""

from __future__ import annotations

from typing import Final

from gateway.errors import ServerConfigError
from gateway.text.tool_calls.base import ToolCallFormat
from gateway.text.tool_calls.formats import hermes, json, llama3_json, mistral

_BY_NAME: Final[dict[str, ToolCallFormat]] = {
    f.name: f for f in (llama3_json.FORMAT, hermes.FORMAT, mistral.FORMAT, json.FORMAT)
}

# Every name a parser accepts: each format's, and "none" (no parsing; everything is content).
FORMATS: Final = (*_BY_NAME, "none")
# What a model may be configured with: "none" or a model family's format (not the guided "json").
MODEL_FORMATS: Final = ("none", *(name for name in _BY_NAME if name != "json"))


def check_format(name: str) -> str:
    """The format name, if it is one of the registered formats (a per-model setting, checked at start-up)."""
    if name not in FORMATS:
        raise ServerConfigError(f"Unknown tool call format {name!r}; expected one of {', '.join(FORMATS)}")
    return name


def get_format(name: str) -> ToolCallFormat | None:
    """The format called `name` (None for "none")."""
    return _BY_NAME.get(check_format(name))
