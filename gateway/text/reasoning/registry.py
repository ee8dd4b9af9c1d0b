"""The reasoning formats by name: the allowed values of a model's ``reasoning_parser`` setting."""

from __future__ import annotations

from typing import Final

from gateway.errors import ServerConfigError
from gateway.text.reasoning import deepseek_r1, gpt_oss, qwen3
from gateway.text.reasoning.base import ReasoningFormat

_REGISTRY: Final[dict[str, ReasoningFormat]] = {
    module.FORMAT.name: module.FORMAT for module in (deepseek_r1, qwen3, gpt_oss)
}

FORMATS: Final = tuple(_REGISTRY)


def get_format(name: str) -> ReasoningFormat:
    """The format called `name` (a per-model setting, checked at start-up)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ServerConfigError(
            f"Unknown reasoning parser {name!r}; expected one of {', '.join(FORMATS)}"
        ) from None
