"""A toy tokenization for the reasoning parser tests: each marker is one token, every other character
one token, so tests can check reasoning-token counts and feed the same ids split any way."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.text.reasoning import ReasoningFormat, get_format, think
from gateway.text.reasoning.formats import gpt_oss

MARKERS = (*think.MARKERS, *gpt_oss.FORMAT.markers, gpt_oss.CONSTRAIN)
MARKER_IDS = {marker: 10 + i for i, marker in enumerate(MARKERS)}


def tokenize(text: str) -> list[tuple[str, int]]:
    """(token text, id) pairs whose texts concatenate to `text`."""
    tokens: list[tuple[str, int]] = []
    i = 0
    while i < len(text):
        marker = next((m for m in MARKERS if text.startswith(m, i)), None)
        if marker is not None:
            tokens.append((marker, MARKER_IDS[marker]))
            i += len(marker)
        else:
            tokens.append((text[i], 1000 + ord(text[i])))
            i += 1
    return tokens


def ids_of(tokens: Sequence[tuple[str, int]]) -> list[int]:
    return [token_id for _, token_id in tokens]


class Counter:
    """Deterministic tool-call ids."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> str:
        self.n += 1
        return f"call_{self.n}"


def format_named(name: str) -> ReasoningFormat:
    fmt = get_format(name)
    assert fmt is not None
    return fmt
