"""``mistral``: ``[TOOL_CALLS]`` then a JSON array of ``{"name", "arguments"}`` (tokenizer v3/v7),
or one ``[TOOL_CALLS]name[ARGS]{...}`` per call (v13+; v11 puts ``[CALL_ID]id`` before ``[ARGS]``)."""

from __future__ import annotations

import string
from collections.abc import Collection, Mapping
from typing import Any, Final

from gateway.text.tool_calls.base import (
    REJECT,
    CallArray,
    CallStart,
    Complete,
    Outcome,
    Piece,
    Region,
    Rejected,
    ToolCallFormat,
    accepted,
    is_partial_marker,
)
from gateway.text.tool_calls.json_text import DONE, SCANNING, JsonScanner, Span, skip_ws

_MISTRAL_MARKER: Final = "[TOOL_CALLS]"
_MISTRAL_CALL_ID: Final = "[CALL_ID]"
_MISTRAL_ARGS: Final = "[ARGS]"
_NAME_CHARS: Final = frozenset(string.ascii_letters + string.digits + "_-.")


class MistralRegion:
    """``[TOOL_CALLS]`` then either a JSON array of calls or ``name[CALL_ID]id[ARGS]{...}``, where
    ``[CALL_ID]id`` and ``[ARGS]`` are each optional (older parsers saw ``name{...}``). The second
    form commits on the arguments' ``{`` when the name is a declared tool, and streams them."""

    __slots__ = ("_args", "_array", "_names", "_pos", "_span", "pieces")

    def __init__(self, names: Collection[str] | None) -> None:
        self._names = names
        self._array: CallArray | None = None
        self._args: JsonScanner | None = None
        self._span: Span | None = None
        self._pos = 0
        self.pieces: list[Piece] = []

    def step(self, text: str, final: bool) -> Outcome:
        if self._array is None and self._args is None:
            if self._header(text) is REJECT:
                return REJECT
            if self._array is None and self._args is None:
                return REJECT if final else None
        if self._array is not None:
            end = self._array.step(text, final)
            if end is None or isinstance(end, Rejected):
                return end
            return Complete(end)
        args = self._args
        assert args is not None and self._span is not None
        if args.state == SCANNING:
            fragment = args.feed(text[self._pos :])
            self._pos += args.consumed
            if fragment:
                self.pieces.append(fragment)
            if args.state == SCANNING:
                return Complete(len(text)) if final else None
        if args.state == DONE:
            return Complete(self._pos)
        # Arguments that stopped being JSON: the call's text runs to their closing bracket.
        end = self._span.end(text)
        if end is None:
            return Complete(len(text)) if final else None
        return Complete(end)

    def _header(self, text: str) -> Rejected | None:
        """Reads up to the JSON value and starts its span; None while the header is incomplete."""
        n = len(text)
        i = skip_ws(text, len(_MISTRAL_MARKER))
        if i == n:
            return None
        if text[i] == "[":
            self._array = CallArray(i, self._names, self.pieces, require_arguments=False)
            return None
        j = i
        while j < n and text[j] in _NAME_CHARS:
            j += 1
        if j == i:
            return REJECT
        if j == n:
            return None
        name = text[i:j]
        if text.startswith(_MISTRAL_CALL_ID, j):
            k = j = j + len(_MISTRAL_CALL_ID)
            while j < n and text[j].isascii() and text[j].isalnum():
                j += 1
            if j == n:
                return None
            if j == k:
                return REJECT
        if text.startswith(_MISTRAL_ARGS, j):
            j += len(_MISTRAL_ARGS)
        elif is_partial_marker(text[j:], _MISTRAL_ARGS) or is_partial_marker(text[j:], _MISTRAL_CALL_ID):
            return None
        j = skip_ws(text, j)
        if j == n:
            return None
        if text[j] != "{" or not accepted(name, self._names):
            return REJECT
        self.pieces.append(CallStart(name))
        self._args = JsonScanner(object_only=True)
        self._pos = j
        self._span = Span(j)
        return None


def _region(opener: str, names: Collection[str] | None, parameters: Mapping[str, Any]) -> Region:
    return MistralRegion(names)


# Mistral's templates (and its API) take only ids of 9 letters and digits.
FORMAT = ToolCallFormat("mistral", (_MISTRAL_MARKER,), "", None, _region, call_id_length=9)
