"""``deepseek_v3`` (DeepSeek V3 and R1): ``<｜tool▁calls▁begin｜>`` then one or more
``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`` + a fenced JSON block (```` ```json ````) of the
arguments + ``<｜tool▁call▁end｜>``, separated by newlines, closed by ``<｜tool▁calls▁end｜>``.

The V3.1 spelling, ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`` (no type,
no fence), is read too. A call commits on the arguments' ``{`` when its name is a declared tool, and
its arguments stream from there; the markers are added tokens that a default decode keeps.
"""

from __future__ import annotations

import string
from collections.abc import Collection, Mapping
from typing import Any, Final

from gateway.text.tool_calls.base import (
    REJECT,
    CallStart,
    Complete,
    Outcome,
    Piece,
    Region,
    ToolCallFormat,
    accepted,
    is_partial_marker,
)
from gateway.text.tool_calls.json_text import DONE, SCANNING, JsonScanner, skip_ws

CALLS_BEGIN: Final = "<｜tool▁calls▁begin｜>"
CALLS_END: Final = "<｜tool▁calls▁end｜>"
CALL_BEGIN: Final = "<｜tool▁call▁begin｜>"
CALL_END: Final = "<｜tool▁call▁end｜>"
SEP: Final = "<｜tool▁sep｜>"
_FENCE: Final = "```"
_FENCE_JSON: Final = "```json"
_NAME_CHARS: Final = frozenset(string.ascii_letters + string.digits + "_-.")
# A call's type or name longer than this is not a header the format writes.
_MAX_HEADER: Final = 128

_NEXT: Final = 0  # before a call (or the block's end)
_HEAD: Final = 1  # after CALL_BEGIN: type, separator, name, fence
_ARGS: Final = 2  # committed: the arguments stream
_TAIL: Final = 3  # after the arguments: closing fence and CALL_END
_SKIP: Final = 4  # arguments that stopped being JSON: up to CALL_END


class DeepSeekRegion:
    __slots__ = ("_args", "_committed", "_end", "_names", "_pos", "_stage", "pieces")

    def __init__(self, opener: str, names: Collection[str] | None) -> None:
        self._names = names
        self._pos = len(CALLS_BEGIN) if opener == CALLS_BEGIN else 0
        self._stage = _NEXT
        self._args: JsonScanner | None = None
        self._committed = False
        self._end = 0  # where the last complete call ended
        self.pieces: list[Piece] = []

    def step(self, text: str, final: bool) -> Outcome:
        while True:
            stage = self._stage
            if stage == _NEXT:
                j = skip_ws(text, self._pos)
                rest = text[j:]
                if rest.startswith(CALL_BEGIN):
                    self._pos = j + len(CALL_BEGIN)
                    self._stage = _HEAD
                    continue
                if self._committed and rest.startswith(CALLS_END):
                    return Complete(j + len(CALLS_END))
                if not final and (
                    not rest or is_partial_marker(rest, CALL_BEGIN) or is_partial_marker(rest, CALLS_END)
                ):
                    return None
                # Anything else ends the block: after a call it is what follows, before one the
                # text was not a call.
                if not self._committed:
                    return REJECT
                return Complete(len(text) if final and not rest.strip() else self._end)
            if stage == _HEAD:
                outcome = self._head(text, final)
                if outcome is not True:
                    return outcome  # type: ignore[return-value]
                continue
            if stage == _ARGS:
                args = self._args
                assert args is not None
                fragment = args.feed(text[self._pos :])
                self._pos += args.consumed
                if fragment:
                    self.pieces.append(fragment)
                if args.state == SCANNING:
                    return Complete(len(text)) if final else None
                self._stage = _TAIL if args.state == DONE else _SKIP
                continue
            if stage == _TAIL:
                j = skip_ws(text, self._pos)
                if text.startswith(_FENCE, j):
                    j = skip_ws(text, j + len(_FENCE))
                rest = text[j:]
                if rest.startswith(CALL_END):
                    self._pos = self._end = j + len(CALL_END)
                    self._stage = _NEXT
                    continue
                if not rest or is_partial_marker(rest, CALL_END) or is_partial_marker(rest, _FENCE):
                    return Complete(len(text)) if final else None
                # Something else after the arguments: the call ends with them.
                return Complete(self._pos)
            # _SKIP: the rest of a broken call, up to its end marker.
            at = text.find(CALL_END, self._pos)
            if at == -1:
                return Complete(len(text)) if final else None
            self._pos = self._end = at + len(CALL_END)
            self._stage = _NEXT

    def _head(self, text: str, final: bool) -> Outcome | bool:
        """`TYPE<sep>NAME\\n```json\\n{` (V3) or `NAME<sep>{` (V3.1), up to the arguments' brace."""
        start = self._pos
        sep = text.find(SEP, start)
        if sep == -1:
            if final or len(text) - start > _MAX_HEADER or "\n" in text[start:]:
                return self._not_a_call(text)
            return None
        kind = text[start:sep].strip()
        j = sep + len(SEP)
        if kind == "function":
            newline = text.find("\n", j)
            if newline == -1:
                if final or len(text) - j > _MAX_HEADER:
                    return self._not_a_call(text)
                return None
            name = text[j:newline].strip()
            j = skip_ws(text, newline)
            if text.startswith(_FENCE_JSON, j):
                j = skip_ws(text, j + len(_FENCE_JSON))
            elif is_partial_marker(text[j:], _FENCE_JSON) and not final:
                return None  # the fence, or its language, is still being written
            elif text.startswith(_FENCE, j):
                j = skip_ws(text, j + len(_FENCE))
        else:
            name = kind
            j = skip_ws(text, j)
        if j == len(text):
            return self._not_a_call(text) if final else None
        if text[j] != "{" or not set(name) <= _NAME_CHARS or not accepted(name, self._names):
            return self._not_a_call(text)
        self.pieces.append(CallStart(name))
        self._committed = True
        self._args = JsonScanner(object_only=True)
        self._pos = j
        self._stage = _ARGS
        return True

    def _not_a_call(self, text: str) -> Outcome:
        # Before any call, the text was not a call; after one, the block ends with that call.
        return Complete(self._end) if self._committed else REJECT


def _region(opener: str, names: Collection[str] | None, parameters: Mapping[str, Any]) -> Region:
    return DeepSeekRegion(opener, names)


# A model that leaves out the block's opener still starts each call with CALL_BEGIN.
FORMAT = ToolCallFormat("deepseek_v3", (CALLS_BEGIN, CALL_BEGIN), "", None, _region)
