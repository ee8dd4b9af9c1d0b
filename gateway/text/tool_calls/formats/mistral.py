"""``mistral``: ``[TOOL_CALLS]`` then a JSON array of ``{"name", "arguments"}`` (tokenizer v3/v7),
or one ``[TOOL_CALLS]name[ARGS]{...}`` per call (v13+; v11 puts ``[CALL_ID]id`` before ``[ARGS]``)."""

from __future__ import annotations

import string
from collections.abc import Collection
from typing import Final

from gateway.text.tool_calls.base import (
    REJECT,
    Call,
    Complete,
    Outcome,
    Region,
    Rejected,
    Span,
    ToolCallFormat,
    call_from,
    calls_from,
    load_json,
    skip_ws,
)

_MISTRAL_MARKER: Final = "[TOOL_CALLS]"
_MISTRAL_CALL_ID: Final = "[CALL_ID]"
_MISTRAL_ARGS: Final = "[ARGS]"
_NAME_CHARS: Final = frozenset(string.ascii_letters + string.digits + "_-.")


def _is_partial(rest: str, token: str) -> bool:
    return len(rest) < len(token) and token.startswith(rest)


class MistralRegion:
    """``[TOOL_CALLS]`` then either a JSON array of calls or ``name[CALL_ID]id[ARGS]{...}``, where
    ``[CALL_ID]id`` and ``[ARGS]`` are each optional (older parsers saw ``name{...}``)."""

    __slots__ = ("_array", "_calls", "_name", "_names", "_span")

    def __init__(self, names: Collection[str] | None) -> None:
        self._names = names
        self._span: Span | None = None
        self._array = False
        self._name = ""
        self._calls: tuple[Call, ...] | None = None

    def step(self, text: str, final: bool) -> Outcome:
        if self._span is None:
            if self._header(text) is REJECT:
                return REJECT
            if self._span is None:
                return REJECT if final else None
        end = self._span.end(text)
        if end is None:
            return REJECT if final else None
        if self._calls is None:
            raw = text[self._span.start : end]
            if self._array:
                self._calls = calls_from(raw, self._names, allow_array=True, require_arguments=False)
            else:
                call = call_from(
                    {"name": self._name, "arguments": load_json(raw)}, self._names, require_arguments=True
                )
                self._calls = (call,) if call is not None else None
            if self._calls is None:
                return REJECT
        return Complete(self._calls, end)

    def _header(self, text: str) -> Rejected | None:
        """Reads up to the JSON value and starts its span; None while the header is incomplete."""
        n = len(text)
        i = skip_ws(text, len(_MISTRAL_MARKER))
        if i == n:
            return None
        if text[i] == "[":
            self._array = True
            self._span = Span(i)
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
        elif _is_partial(text[j:], _MISTRAL_ARGS) or _is_partial(text[j:], _MISTRAL_CALL_ID):
            return None
        j = skip_ws(text, j)
        if j == n:
            return None
        if text[j] != "{":
            return REJECT
        self._name = name
        self._span = Span(j)
        return None


def _region(opener: str, names: Collection[str] | None) -> Region:
    return MistralRegion(names)


FORMAT = ToolCallFormat("mistral", (_MISTRAL_MARKER,), "", None, _region)
