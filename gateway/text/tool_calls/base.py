"""What every tool-call format shares: the values the parsers report, the regions a format's call
text is read with, and when text becomes a call (see `formats/` for each format, `parsing` for the
state machine that drives them, `json_text` for the JSON scanning).

When a call is committed. Text that may open a call (a format's marker, or an unmarked ``{``
where the format allows one) is held back. A call commits, and its start (id and name) goes out,
as soon as its text reaches the brace that opens its arguments written in the usual order,
``{"name": "<declared tool>", "arguments": {`` (or ``"parameters"``; Mistral's ``name[ARGS]{``);
from there the arguments stream as the model writes them, as vLLM and OpenAI stream them. A
committed call is never taken back:

- a reply that ends inside the arguments (token limit, stop string) keeps the call, with the
  arguments written so far (a finish reason of "length" tells the client they were cut);
- arguments that stop being JSON end there, and the rest of the call's text, up to its closing
  bracket, is dropped: what went out stays a prefix of valid JSON;
- text after the call object that is not its closing tag is left to what follows (content).

A call written otherwise (arguments before the name, other members first, arguments as a
JSON-encoded string, no arguments) is reported once its object is complete and valid, its
arguments in one piece. Text that never committed and turns out not to be a call (a name that is
not a declared tool, malformed JSON before the arguments, a reply that ends before they open) is
left in the content, character for character.

The arguments, streamed or not: the model's own JSON text of the arguments object with the
whitespace between tokens removed (its escapes and number spellings kept; an object written as a
JSON string is decoded first). The fragments of one call concatenate to exactly the non-streamed
``arguments``, which is the same parser fed the whole reply; they are always a prefix of valid JSON,
the whole object unless the call was cut.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from gateway.text.tool_calls.json_text import (
    DONE,
    SCANNING,
    JsonScanner,
    Span,
    compact_object,
    load_json,
    object_members,
    skip_json_ws,
    skip_ws,
    string_end,
)

_ID_ALPHABET = string.ascii_letters + string.digits


def new_tool_call_id() -> str:
    """An id shaped like OpenAI's: ``call_`` and 24 random letters and digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


# ---------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    # What OpenAI puts in `function.arguments`: the model's JSON text of the arguments object,
    # whitespace between tokens removed (see the module docstring; cut short if the reply was).
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    # None when the reply was only tool calls (OpenAI sends `content: null` then).
    content: str | None
    tool_calls: tuple[ToolCall, ...]


@dataclass(frozen=True, slots=True)
class ContentDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """The first delta of a call: everything but the arguments."""

    index: int
    id: str
    name: str

    def to_openai(self) -> dict[str, Any]:
        """One entry of a chunk's `delta.tool_calls`, as OpenAI streams it."""
        return {
            "index": self.index,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": ""},
        }


@dataclass(frozen=True, slots=True)
class ToolCallArguments:
    """A fragment of a call's arguments string; the fragments of one index concatenate to it."""

    index: int
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {"index": self.index, "function": {"arguments": self.arguments}}


ToolCallEvent = ContentDelta | ToolCallStart | ToolCallArguments


def finish_reason(reason: str, tool_calls: int) -> str:
    """OpenAI's finish reason for a choice: "tool_calls" when the model stopped after calling at
    least one tool. A "length" cut stays "length": the reply was truncated, and a client
    needs to know that more than it needs the calls named again."""
    return "tool_calls" if tool_calls and reason == "stop" else reason


# ---------------------------------------------------------------- what regions report


@dataclass(frozen=True, slots=True)
class CallStart:
    """A region has committed to a call of `name`; its arguments follow as text pieces."""

    name: str


# What a region hands the state machine as it goes: a new call, or more of the last call's arguments.
Piece = CallStart | str


@dataclass(frozen=True, slots=True)
class Complete:
    end: int  # characters of the region text the calls took, opener and closer included


class Rejected:
    pass


REJECT: Final = Rejected()

# None: the text so far could still become (or still is) a call; wait for more.
Outcome = Complete | Rejected | None


class Region(Protocol):
    # Pieces found by the last `step`, for the state machine to take (and clear).
    pieces: list[Piece]

    def step(self, text: str, final: bool) -> Outcome:
        """`text` is everything from the region's first character on; it only ever grows. Once a
        piece has been reported the region never rejects, and with `final` it never waits."""
        ...


def accepted(name: object, names: Collection[str] | None) -> bool:
    return isinstance(name, str) and bool(name) and (names is None or name in names)


def whole_call(raw: str, names: Collection[str] | None, *, require_arguments: bool) -> tuple[str, str] | None:
    """The name and compact arguments of a complete call object `raw`, if it is a valid call."""
    obj = load_json(raw)
    if not isinstance(obj, dict) or not accepted(obj.get("name"), names):
        return None
    has_arguments, has_parameters = "arguments" in obj, "parameters" in obj
    if has_arguments and has_parameters:
        return None  # ambiguous: no way to tell which the model meant
    if not has_arguments and not has_parameters:
        # Without a marker, {"name": ...} alone is too likely to be an ordinary JSON answer.
        return None if require_arguments else (obj["name"], "{}")
    members = object_members(raw)
    value = members.get("arguments" if has_arguments else "parameters") if members is not None else None
    if value is None:
        return None
    if value.startswith('"'):
        # Some fine-tunes write the arguments object as a JSON-encoded string.
        decoded = load_json(value)
        value = compact_object(decoded) if isinstance(decoded, str) else None
        if value is None or not isinstance(load_json(value), dict):
            return None
    elif not value.startswith("{") or not isinstance(load_json(value), dict):
        return None
    return obj["name"], value


# The head of a call written in the usual order, `{"name": "<name>", "arguments": {`, in stages.
_KEY_NAME: Final = 0
_COLON_1: Final = 1
_NAME: Final = 2
_COMMA: Final = 3
_KEY_ARGUMENTS: Final = 4
_COLON_2: Final = 5
_OPEN: Final = 6
_ARGS: Final = 7  # committed: the arguments stream
_TAIL: Final = 8  # committed: the rest of the call object
_WHOLE: Final = 9  # not in the usual order: decided once the object is complete
_ARGUMENT_KEYS: Final = ("arguments", "parameters")
_NEED_MORE: Final = object()


class CallObject:
    """One call object starting at `start` (its ``{``) in a region's text, reporting into `pieces`.

    Written in the usual order, it commits on the ``{`` that opens its arguments (with the name
    one of the declared tools) and streams them from there (`JsonScanner`). Otherwise it waits
    for the whole object and is a call only if that is valid (`whole_call`). `step` returns where
    the object ends, REJECT or None (wait)."""

    __slots__ = (
        "_args",
        "_name",
        "_names",
        "_pos",
        "_require_arguments",
        "_span",
        "_stage",
        "committed",
        "pieces",
    )

    def __init__(
        self, start: int, names: Collection[str] | None, pieces: list[Piece], *, require_arguments: bool
    ) -> None:
        self._names = names
        self._require_arguments = require_arguments
        self.pieces = pieces
        self._span = Span(start)
        self._pos = start + 1
        self._stage = _KEY_NAME
        self._name = ""
        self._args = JsonScanner(object_only=True)
        self.committed = False

    def step(self, text: str, final: bool) -> int | Rejected | None:
        if self._stage < _ARGS:
            while self._stage < _ARGS:
                found = self._head(text)
                if found is _NEED_MORE:
                    return REJECT if final else None
                if found is None:
                    self._stage = _WHOLE
                    break
        if self._stage == _WHOLE:
            end = self._span.end(text)
            if end is None:
                return REJECT if final else None
            raw = text[self._span.start : end]
            call = whole_call(raw, self._names, require_arguments=self._require_arguments)
            if call is None:
                return REJECT
            self.pieces += [CallStart(call[0]), call[1]]
            self.committed = True
            return end
        args = self._args
        if self._stage == _ARGS:
            fragment = args.feed(text[self._pos :])
            self._pos += args.consumed
            if fragment:
                self.pieces.append(fragment)
            if args.state == SCANNING:
                return len(text) if final else None
            self._stage = _TAIL
        if args.state == DONE:
            # After valid arguments: the object's end, more members, or something else (which ends
            # the call here and is left to what follows).
            j = skip_json_ws(text, self._pos)
            if j == len(text):
                return len(text) if final else None
            if text[j] == "}":
                return j + 1
            if text[j] != ",":
                return self._pos
        # Other members after the arguments, or arguments that stopped being JSON: the call's
        # text runs to its closing bracket.
        end = self._span.end(text)
        if end is None:
            return len(text) if final else None
        return end

    def _head(self, text: str) -> object:
        """Reads the next stage of the head: True when it matched, `_NEED_MORE`, or None when the
        object is not written in the usual order. Commits on the arguments' opening brace."""
        i = skip_json_ws(text, self._pos)
        if i == len(text):
            return _NEED_MORE
        stage, c = self._stage, text[i]
        if stage in (_KEY_NAME, _NAME, _KEY_ARGUMENTS):
            if c != '"':
                return None
            end = string_end(text, i)
            if end is None:
                return _NEED_MORE
            value = load_json(text[i:end])
            if stage == _KEY_NAME and value != "name":
                return None
            if stage == _KEY_ARGUMENTS and value not in _ARGUMENT_KEYS:
                return None
            if stage == _NAME:
                if not accepted(value, self._names):
                    return None  # decided on the whole object, as json.loads reads it
                assert isinstance(value, str)
                self._name = value
            self._pos = end
        else:
            expected = {_COLON_1: ":", _COMMA: ",", _COLON_2: ":", _OPEN: "{"}[stage]
            if c != expected:
                return None
            self._pos = i if stage == _OPEN else i + 1
        self._stage += 1
        if self._stage == _ARGS:
            self.pieces.append(CallStart(self._name))
            self.committed = True
        return True


class CallArray:
    """A JSON array of call objects starting at `start`. It commits with its first call; after
    that, anything that is not another call ends it (and is left to what follows)."""

    __slots__ = ("_item", "_names", "_pos", "_require_arguments", "committed", "pieces")

    def __init__(
        self, start: int, names: Collection[str] | None, pieces: list[Piece], *, require_arguments: bool
    ) -> None:
        self._names = names
        self._require_arguments = require_arguments
        self.pieces = pieces
        self._pos = start + 1  # after the last thing read: "[" or a complete call
        self._item: CallObject | None = None
        self.committed = False

    def step(self, text: str, final: bool) -> int | Rejected | None:
        while True:
            item = self._item
            if item is not None:
                end = item.step(text, final)
                if end is None:
                    return None
                if isinstance(end, Rejected):
                    return self._pos if self.committed else REJECT
                self.committed = True
                self._item = None
                self._pos = end
            j = skip_ws(text, self._pos)
            if j == len(text):
                return (len(text) if self.committed else REJECT) if final else None
            c = text[j]
            if not self.committed:
                if c != "{":
                    return REJECT  # an empty array, or one that is not of calls
            elif c == "]":
                return j + 1
            elif c == ",":
                j = skip_ws(text, j + 1)
                if j == len(text):
                    return len(text) if final else None
                if text[j] != "{":
                    return self._pos
            else:
                return self._pos
            self._item = CallObject(j, self._names, self.pieces, require_arguments=self._require_arguments)


class ValueRegion:
    """An opener (marker, separator or nothing), optional whitespace, a JSON call object (or an
    array of them), then optionally a closing tag."""

    __slots__ = ("_allow_array", "_closer", "_names", "_opener_len", "_require_arguments", "_value", "pieces")

    def __init__(
        self,
        opener: str,
        names: Collection[str] | None,
        *,
        closer: str | None = None,
        allow_array: bool = False,
        require_arguments: bool = False,
    ) -> None:
        self._opener_len = len(opener)
        self._names = names
        self._closer = closer
        self._allow_array = allow_array
        self._require_arguments = require_arguments
        self._value: CallObject | CallArray | None = None
        self.pieces: list[Piece] = []

    def step(self, text: str, final: bool) -> Outcome:
        if self._value is None:
            i = skip_ws(text, self._opener_len)
            if i == len(text):
                return REJECT if final else None
            if text[i] == "{":
                kind: type[CallObject | CallArray] = CallObject
            elif self._allow_array and text[i] == "[":
                kind = CallArray
            else:
                return REJECT
            self._value = kind(i, self._names, self.pieces, require_arguments=self._require_arguments)
        end = self._value.step(text, final)
        if end is None or isinstance(end, Rejected):
            return end
        closer = self._closer
        if closer is None:
            return Complete(end)
        j = skip_ws(text, end)
        if text.startswith(closer, j):
            return Complete(j + len(closer))
        if closer.startswith(text[j:]):
            # Whitespace or part of the closing tag so far; at the end of the reply (a stop string
            # or the token limit cut it) the call is complete without it.
            return Complete(len(text)) if final else None
        # Something else follows the call: the call ends with its object, the rest is what follows.
        return Complete(end)


# ---------------------------------------------------------------- formats


@dataclass(frozen=True, slots=True)
class ToolCallFormat:
    """How one model family writes tool calls (one file each under `formats/`)."""

    name: str
    # Strings that open a region anywhere in the reply.
    markers: tuple[str, ...]
    # Characters that open an unmarked region when they are the reply's first non-space character.
    start_openers: str
    # Text that opens another region right after a call (Llama's `;` between calls).
    continuation: str | None
    # (opener, the declared tools' names or None for any, each declared tool's parameters schema)
    # -> the region that reads one stretch of calls.
    region: Callable[[str, Collection[str] | None, Mapping[str, Any]], Region]
    # The length of the call ids the family's template takes back (Mistral's: 9 letters and digits),
    # or None for any id.
    call_id_length: int | None = None

    def new_call_id(self) -> str:
        """An id for a call the model wrote: OpenAI's shape, or the template's own length."""
        if self.call_id_length is None:
            return new_tool_call_id()
        return "".join(secrets.choice(_ID_ALPHABET) for _ in range(self.call_id_length))

    def template_call_id(self, call_id: str) -> str:
        """The id the template is given for a call handed back: a longer one (``call_...``,
        ``toolu_...``) cut to its last `call_id_length` characters, as vLLM cuts Mistral's; one
        that is too short goes as it is, for the template to refuse in its own words."""
        if self.call_id_length is None or len(call_id) <= self.call_id_length:
            return call_id
        return call_id[-self.call_id_length :]


def is_partial_marker(rest: str, marker: str) -> bool:
    """Whether `rest` is a proper prefix of `marker`: the marker may still be coming."""
    return len(rest) < len(marker) and marker.startswith(rest)


def partial_marker_length(text: str, markers: tuple[str, ...]) -> int:
    # The longest suffix of `text` that is a proper prefix of a marker.
    best = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text)), best, -1):
            if marker.startswith(text[len(text) - k :]):
                best = k
                break
    return best
