"""Finding tool calls in model output, whole or streamed, for the formats chat models are trained on.

Formats (what the model writes; the marker strings are special tokens in most of these
tokenizers, so the text must be detokenized with special tokens kept for the parser to see them):

- ``llama3_json`` (Llama 3.1-3.3): the whole reply is ``{"name": ..., "parameters": {...}}``
  (``"arguments"`` also accepted), optionally after ``<|python_tag|>``; several calls are
  separated by ``;``. A bare ``{`` opens a call only at the very start of the reply, so a JSON
  example inside prose stays prose; ``<|python_tag|>`` opens one anywhere.
- ``hermes`` (Hermes 2 Pro, Qwen 2.5/3): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
  blocks, possibly several, possibly after some text.
- ``mistral``: ``[TOOL_CALLS]`` then a JSON array of ``{"name", "arguments"}`` (tokenizer v3/v7),
  or one ``[TOOL_CALLS]name[ARGS]{...}`` per call (v13+; v11 puts ``[CALL_ID]id`` before ``[ARGS]``).
- ``json``: the reply is one call object or an array of them, nothing else; this is what the
  model writes under the schema from `tool_call_json_schema` (guided decoding), whatever its
  native format.
- ``none``: no parsing; everything is content.

A call is only reported once its text is complete and valid: an object with a string ``name``
(one of the declared tools, when they are given) and an object of arguments. Anything else that
merely looks like a call is left in the content, character for character. Whitespace next to a
call is not content. `parse_tool_calls` is the streaming parser fed the whole text at once, so
the two interfaces cannot disagree.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Final, Protocol

from gateway.errors import ServerConfigError

FORMATS: Final = ("llama3_json", "hermes", "mistral", "json", "none")

_ID_ALPHABET = string.ascii_letters + string.digits


def new_tool_call_id() -> str:
    """An id shaped like OpenAI's: ``call_`` and 24 random letters and digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


def check_format(name: str) -> str:
    """The format name, if it is one this module parses (a per-model setting, checked at start-up)."""
    if name not in FORMATS:
        raise ServerConfigError(f"Unknown tool call format {name!r}; expected one of {', '.join(FORMATS)}")
    return name


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


def _load(text: str) -> Any:
    """The parsed value, or `_INVALID_JSON` (a sentinel, since null is a value)."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return _INVALID_JSON


_INVALID_JSON: Final = object()


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _skip_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i].isspace():
        i += 1
    return i


class _Span:
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


_Call = tuple[str, str]  # (name, arguments as compact JSON)


def _call_from(obj: Any, names: Collection[str] | None, *, require_arguments: bool) -> _Call | None:
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
        args = _load(args)
    if not isinstance(args, dict):
        return None
    return name, _dump(args)


def _calls_from(
    raw: str, names: Collection[str] | None, *, allow_array: bool, require_arguments: bool
) -> tuple[_Call, ...] | None:
    value = _load(raw)
    items = value if allow_array and isinstance(value, list) else [value]
    if not items:
        return None
    calls = []
    for item in items:
        call = _call_from(item, names, require_arguments=require_arguments)
        if call is None:
            return None
        calls.append(call)
    return tuple(calls)


# ---------------------------------------------------------------- regions


@dataclass(frozen=True, slots=True)
class _Complete:
    calls: tuple[_Call, ...]
    end: int  # characters of the region text the calls took, opener and closer included


class _Rejected:
    pass


_REJECT: Final = _Rejected()

# None: the text so far could still become a valid region; wait for more.
_Outcome = _Complete | _Rejected | None


class _Region(Protocol):
    def step(self, text: str, final: bool) -> _Outcome:
        """`text` is everything from the region's first character on; it only ever grows."""
        ...


class _ValueRegion:
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
        self._span: _Span | None = None
        self._calls: tuple[_Call, ...] | None = None

    def step(self, text: str, final: bool) -> _Outcome:
        if self._span is None:
            i = _skip_ws(text, self._opener_len)
            if i == len(text):
                return _REJECT if final else None
            if text[i] != "{" and not (self._allow_array and text[i] == "["):
                return _REJECT
            self._span = _Span(i)
        end = self._span.end(text)
        if end is None:
            return _REJECT if final else None
        if self._calls is None:
            self._calls = _calls_from(
                text[self._span.start : end],
                self._names,
                allow_array=self._allow_array,
                require_arguments=self._require_arguments,
            )
            if self._calls is None:
                return _REJECT
        closer = self._closer
        if closer is None:
            return _Complete(self._calls, end)
        j = _skip_ws(text, end)
        if text.startswith(closer, j):
            return _Complete(self._calls, j + len(closer))
        if not closer.startswith(text[j:]):
            return _REJECT
        if not final:
            return None
        # The reply ended after a complete call with no closing tag (a stop string, say): still a
        # call. A half-written closing tag is not dropped silently; the region stays content.
        return _Complete(self._calls, len(text)) if j == len(text) else _REJECT


_MISTRAL_MARKER: Final = "[TOOL_CALLS]"
_MISTRAL_CALL_ID: Final = "[CALL_ID]"
_MISTRAL_ARGS: Final = "[ARGS]"
_NAME_CHARS: Final = frozenset(string.ascii_letters + string.digits + "_-.")


def _is_partial(rest: str, token: str) -> bool:
    return len(rest) < len(token) and token.startswith(rest)


class _MistralRegion:
    """``[TOOL_CALLS]`` then either a JSON array of calls or ``name[CALL_ID]id[ARGS]{...}``, where
    ``[CALL_ID]id`` and ``[ARGS]`` are each optional (older parsers saw ``name{...}``)."""

    __slots__ = ("_array", "_calls", "_name", "_names", "_span")

    def __init__(self, names: Collection[str] | None) -> None:
        self._names = names
        self._span: _Span | None = None
        self._array = False
        self._name = ""
        self._calls: tuple[_Call, ...] | None = None

    def step(self, text: str, final: bool) -> _Outcome:
        if self._span is None:
            if self._header(text) is _REJECT:
                return _REJECT
            if self._span is None:
                return _REJECT if final else None
        end = self._span.end(text)
        if end is None:
            return _REJECT if final else None
        if self._calls is None:
            raw = text[self._span.start : end]
            if self._array:
                self._calls = _calls_from(raw, self._names, allow_array=True, require_arguments=False)
            else:
                call = _call_from(
                    {"name": self._name, "arguments": _load(raw)}, self._names, require_arguments=True
                )
                self._calls = (call,) if call is not None else None
            if self._calls is None:
                return _REJECT
        return _Complete(self._calls, end)

    def _header(self, text: str) -> _Rejected | None:
        """Reads up to the JSON value and starts its span; None while the header is incomplete."""
        n = len(text)
        i = _skip_ws(text, len(_MISTRAL_MARKER))
        if i == n:
            return None
        if text[i] == "[":
            self._array = True
            self._span = _Span(i)
            return None
        j = i
        while j < n and text[j] in _NAME_CHARS:
            j += 1
        if j == i:
            return _REJECT
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
                return _REJECT
        if text.startswith(_MISTRAL_ARGS, j):
            j += len(_MISTRAL_ARGS)
        elif _is_partial(text[j:], _MISTRAL_ARGS) or _is_partial(text[j:], _MISTRAL_CALL_ID):
            return None
        j = _skip_ws(text, j)
        if j == n:
            return None
        if text[j] != "{":
            return _REJECT
        self._name = name
        self._span = _Span(j)
        return None


# ---------------------------------------------------------------- formats


@dataclass(frozen=True, slots=True)
class _Format:
    # Strings that open a region anywhere in the reply.
    markers: tuple[str, ...]
    # Characters that open an unmarked region when they are the reply's first non-space character.
    start_openers: str
    # Text that opens another region right after a call (Llama's `;` between calls).
    continuation: str | None
    region: Callable[[str, Collection[str] | None], _Region]


def _llama_region(opener: str, names: Collection[str] | None) -> _Region:
    return _ValueRegion(opener, names, require_arguments=opener == "")


def _json_region(opener: str, names: Collection[str] | None) -> _Region:
    return _ValueRegion(opener, names, allow_array=True, require_arguments=True)


def _hermes_region(opener: str, names: Collection[str] | None) -> _Region:
    return _ValueRegion(opener, names, closer="</tool_call>")


def _mistral_region(opener: str, names: Collection[str] | None) -> _Region:
    return _MistralRegion(names)


_FORMATS: Final[dict[str, _Format]] = {
    "llama3_json": _Format(("<|python_tag|>",), "{", ";", _llama_region),
    "hermes": _Format(("<tool_call>",), "", None, _hermes_region),
    "mistral": _Format((_MISTRAL_MARKER,), "", None, _mistral_region),
    "json": _Format((), "{[", None, _json_region),
}


def _partial_marker_length(text: str, markers: tuple[str, ...]) -> int:
    # The longest suffix of `text` that is a proper prefix of a marker.
    best = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text)), best, -1):
            if marker.startswith(text[len(text) - k :]):
                best = k
                break
    return best


# ---------------------------------------------------------------- the state machine


class StreamingToolParser:
    """Text deltas in, content and tool-call events out, for one choice.

    Text that might be the start of a call is held back, like a stop string, and released as
    content if it turns out not to be one. A call is announced only when its text is complete
    and valid, so that text which fails to parse can still go out as content; its arguments
    then follow as one fragment. Any split of the same text gives the same content and calls.

    `tool_names`, when given (the request's tools), limits calls to those functions: a "call" to
    anything else is left as content rather than handed to a client that cannot run it.
    """

    __slots__ = (
        "_after_call",
        "_at_start",
        "_calls",
        "_format",
        "_make_id",
        "_names",
        "_pending",
        "_region",
        "_region_at",
    )

    def __init__(
        self,
        format: str,
        *,
        tool_names: Collection[str] | None = None,
        make_id: Callable[[], str] = new_tool_call_id,
    ) -> None:
        check_format(format)
        self._format = _FORMATS.get(format)
        self._names = frozenset(tool_names) if tool_names is not None else None
        self._make_id = make_id
        self._pending = ""
        self._region: _Region | None = None
        self._region_at = 0  # where the region starts in `_pending`; before it, held whitespace
        self._at_start = True
        self._after_call = False
        self._calls = 0

    @property
    def tool_calls(self) -> int:
        """How many calls have been announced so far."""
        return self._calls

    def feed(self, delta: str) -> list[ToolCallEvent]:
        if self._format is None:
            return [ContentDelta(delta)] if delta else []
        self._pending += delta
        return self._advance(final=False)

    def finish(self) -> list[ToolCallEvent]:
        """The reply is complete: decide everything still held back."""
        if self._format is None:
            return []
        return self._advance(final=True)

    def _advance(self, final: bool) -> list[ToolCallEvent]:
        fmt = self._format
        assert fmt is not None
        events: list[ToolCallEvent] = []
        while True:
            if self._region is not None:
                outcome = self._region.step(self._pending[self._region_at :], final)
                if outcome is None and not final:
                    break
                if isinstance(outcome, _Complete):
                    self._announce(outcome.calls, events)
                    self._pending = self._pending[self._region_at + outcome.end :]
                    self._after_call = True
                else:
                    # Not a call after all: its first character is content, and the search for a
                    # call resumes right after it (a real marker may follow inside the rejected text).
                    self._emit(self._pending[: self._region_at + 1], events)
                    self._pending = self._pending[self._region_at + 1 :]
                self._region = None
                self._at_start = False
                continue
            if self._after_call:
                # Whitespace after a call separates calls (or a call from later text); not content.
                self._pending = self._pending.lstrip()
            if not self._pending:
                break
            found, hold = self._find_start(fmt)
            if found is not None:
                # Whitespace just before a call is held with it: dropped if the call is valid.
                keep = len(self._pending[:found].rstrip())
                self._emit(self._pending[:keep], events)
                self._pending = self._pending[keep:]
                self._region_at = found - keep
                self._region = fmt.region(self._opener_at(fmt, self._region_at), self._names)
                continue
            if final:
                self._emit(self._pending, events)
                self._pending = ""
            else:
                # Trailing whitespace is held too: a call may follow it.
                keep = len(self._pending[: len(self._pending) - hold].rstrip())
                self._emit(self._pending[:keep], events)
                self._pending = self._pending[keep:]
            break
        return events

    def _find_start(self, fmt: _Format) -> tuple[int | None, int]:
        """Where the next region opens, or (None, how many trailing characters to hold back)."""
        text = self._pending
        if self._after_call and fmt.continuation and text.startswith(fmt.continuation):
            return 0, 0
        if self._at_start and fmt.start_openers:
            i = _skip_ws(text, 0)
            if i == len(text):
                return None, len(text)
            if text[i] in fmt.start_openers:
                return i, 0
        best = -1
        for marker in fmt.markers:
            at = text.find(marker)
            if at != -1 and (best == -1 or at < best):
                best = at
        if best != -1:
            return best, 0
        return None, _partial_marker_length(text, fmt.markers)

    def _opener_at(self, fmt: _Format, at: int) -> str:
        text = self._pending
        for marker in fmt.markers:
            if text.startswith(marker, at):
                return marker
        if fmt.continuation and text.startswith(fmt.continuation, at):
            return fmt.continuation
        return ""

    def _emit(self, text: str, events: list[ToolCallEvent]) -> None:
        if text:
            # One delta per feed, not one per decision: a rejected region is released piecewise.
            if events and isinstance(events[-1], ContentDelta):
                events[-1] = ContentDelta(events[-1].text + text)
            else:
                events.append(ContentDelta(text))
            self._at_start = False
            self._after_call = False

    def _announce(self, calls: tuple[_Call, ...], events: list[ToolCallEvent]) -> None:
        for name, arguments in calls:
            index = self._calls
            self._calls += 1
            events.append(ToolCallStart(index, self._make_id(), name))
            events.append(ToolCallArguments(index, arguments))


def parse_tool_calls(
    text: str,
    format: str,
    *,
    tool_names: Collection[str] | None = None,
    make_id: Callable[[], str] = new_tool_call_id,
) -> ParsedOutput:
    """The content and calls of a complete reply. With no calls found, content is `text` unchanged."""
    parser = StreamingToolParser(format, tool_names=tool_names, make_id=make_id)
    events = parser.feed(text) + parser.finish()
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    names: dict[int, tuple[str, str]] = {}
    arguments: dict[int, list[str]] = {}
    for e in events:
        if isinstance(e, ToolCallStart):
            names[e.index] = (e.id, e.name)
        elif isinstance(e, ToolCallArguments):
            arguments.setdefault(e.index, []).append(e.arguments)
    calls = tuple(
        ToolCall(call_id, name, "".join(arguments.get(index, ())))
        for index, (call_id, name) in sorted(names.items())
    )
    return ParsedOutput(content if content or not calls else None, calls)
