"""The reasoning formats by name: adding a format is adding its file under `formats/` and one line
here. The per-model setting's allowed values (`reasoning_parser`) come from here."""

from __future__ import annotations

from typing import Final

from gateway.errors import ServerConfigError
from gateway.text.reasoning.base import ReasoningFormat
from gateway.text.reasoning.formats import deepseek_r1, gpt_oss, qwen3

_BY_NAME: Final[dict[str, ReasoningFormat]] = {
    f.name: f for f in (deepseek_r1.FORMAT, qwen3.FORMAT, gpt_oss.FORMAT)
}

# vLLM's names for the same formats (`--reasoning-parser`), so its flags carry over.
_ALIASES: Final = {"openai_gptoss": "gpt_oss"}

# The registered formats.
FORMATS: Final = tuple(_BY_NAME)
# What a model may be configured with: "none" (no parsing: the whole reply is content) or a format.
MODEL_FORMATS: Final = ("none", *FORMATS, *_ALIASES)


def check_format(name: str) -> str:
    """The format's own name, if a model may be configured with `name` (a per-model setting,
    checked at start-up)."""
    if name not in MODEL_FORMATS:
        raise ServerConfigError(
            f"Unknown reasoning parser {name!r}; expected one of {', '.join(MODEL_FORMATS)}"
        )
    return _ALIASES.get(name, name)


def get_format(name: str) -> ReasoningFormat | None:
    """The format called `name` (None for "none")."""
    return _BY_NAME.get(check_format(name))
