"""What every tool-call format shares: the values the parsers report, JSON scanning, and the
regions a format's call text is read with (see `formats/` for each format, `parsing` for the state
machine that drives them).

A call is only reported once its text is complete and valid: an object with a string ``name``
(one of the declared tools, when they are given) and an object of arguments. Anything else that
merely looks like a call is left in the content, character for character.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Final, Protocol

_ID_ALPHABET = string.ascii_letters + string.digits


def new_tool_call_id() -> str:
    """An id shaped like OpenAI's: ``call_`` and 24 random letters and digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


# ---------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    # A JSON object as a compact string: what OpenAI puts in `function.arguments`.
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


# ---------------------------------------------------------------- JSON helpers


def _reject_constant(name: str) -> Any:
    # json.loads accepts NaN and Infinity, which would not survive the round trip to a client.
    raise ValueError(f"{name} is not JSON")


def load_json(text: str) -> Any:
    """The parsed value, or `INVALID_JSON` (a sentinel, since null is a value)."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return INVALID_JSON


INVALID_JSON: Final = object()


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def skip_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i].isspace():
        i += 1
    return i


class Span:
    """Where a JSON object or array that starts at `start` ends. Resumable, so arguments streamed a
    token at a time are scanned once in all rather than once per token. It only balances brackets
    outside strings; `json.loads` on the span decides whether it is valid."""

    __slots__ = ("_depth", "_end", "_escaped", "_in_string", "_pos", "start")

    def __init__(self, start: int) -> None:
        self.start = start
        self._pos = start
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._end: int | None = None

    def end(self, text: str) -> int | None:
        if self._end is not None:
            return self._end
        depth, in_string, escaped = self._depth, self._in_string, self._escaped
        i, n = self._pos, len(text)
        while i < n:
            c = text[i]
            i += 1
            if in_string:
                if escaped:
                    escaped = False
                elif c == "\\":
                    escaped = True
                elif c == '"':
                    in_string = False
            elif c == '"':
                in_string = True
            elif c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    self._end = i
                    break
        self._pos, self._depth, self._in_string, self._escaped = i, depth, in_string, escaped
        return self._end


Call = tuple[str, str]  # (name, arguments as compact JSON)


def call_from(obj: Any, names: Collection[str] | None, *, require_arguments: bool) -> Call | None:
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name or (names is not None and name not in names):
        return None
    if "arguments" in obj and "parameters" in obj:
        return None  # ambiguous: no way to tell which the model meant
    if "arguments" in obj:
        args = obj["arguments"]
    elif "parameters" in obj:
        args = obj["parameters"]
    elif require_arguments:
        # Without a marker, {"name": ...} alone is too likely to be an ordinary JSON answer.
        return None
    else:
        args = {}
    if isinstance(args, str):
        # Some fine-tunes write the arguments object as a JSON-encoded string.
        args = load_json(args)
    if not isinstance(args, dict):
        return None
    return name, _dump(args)


def calls_from(
    raw: str, names: Collection[str] | None, *, allow_array: bool, require_arguments: bool
) -> tuple[Call, ...] | None:
    value = load_json(raw)
    items = value if allow_array and isinstance(value, list) else [value]
    if not items:
        return None
    calls = []
    for item in items:
        call = call_from(item, names, require_arguments=require_arguments)
        if call is None:
            return None
        calls.append(call)
    return tuple(calls)


# ---------------------------------------------------------------- regions


@dataclass(frozen=True, slots=True)
class Complete:
    calls: tuple[Call, ...]
    end: int  # characters of the region text the calls took, opener and closer included


class Rejected:
    pass


REJECT: Final = Rejected()

# None: the text so far could still become a valid region; wait for more.
Outcome = Complete | Rejected | None


class Region(Protocol):
    def step(self, text: str, final: bool) -> Outcome:
        """`text` is everything from the region's first character on; it only ever grows."""
        ...


class ValueRegion:
    """An opener (marker, separator or nothing), optional whitespace, a JSON call object (or an
    array of them), then optionally a closing tag."""

    __slots__ = ("_allow_array", "_calls", "_closer", "_names", "_opener_len", "_require_arguments", "_span")

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
        self._span: Span | None = None
        self._calls: tuple[Call, ...] | None = None

    def step(self, text: str, final: bool) -> Outcome:
        if self._span is None:
            i = skip_ws(text, self._opener_len)
            if i == len(text):
                return REJECT if final else None
            if text[i] != "{" and not (self._allow_array and text[i] == "["):
                return REJECT
            self._span = Span(i)
        end = self._span.end(text)
        if end is None:
            return REJECT if final else None
        if self._calls is None:
            self._calls = calls_from(
                text[self._span.start : end],
                self._names,
                allow_array=self._allow_array,
                require_arguments=self._require_arguments,
            )
            if self._calls is None:
                return REJECT
        closer = self._closer
        if closer is None:
            return Complete(self._calls, end)
        j = skip_ws(text, end)
        if text.startswith(closer, j):
            return Complete(self._calls, j + len(closer))
        if not closer.startswith(text[j:]):
            return REJECT
        if not final:
            return None
        # The reply ended after a complete call with no closing tag (a stop string, say): still a
        # call. A half-written closing tag is not dropped silently; the region stays content.
        return Complete(self._calls, len(text)) if j == len(text) else REJECT


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
    region: Callable[[str, Collection[str] | None], Region]


def partial_marker_length(text: str, markers: tuple[str, ...]) -> int:
    # The longest suffix of `text` that is a proper prefix of a marker.
    best = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text)), best, -1):
            if marker.startswith(text[len(text) - k :]):
                best = k
                break
    return best
