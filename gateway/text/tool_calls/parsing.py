"""Finding tool calls in model output, whole or streamed, for the formats chat models are trained
on (one file each under `formats/`, listed in `registry`; the marker strings are special tokens in
most of these tokenizers, so the text must be detokenized with special tokens kept for the parser
to see them).

Whitespace next to a call is not content. A call's start goes out once the call is committed, and
its arguments as they are written (when a call commits, and what happens to text that looked like
one but is not: see `base`). `parse_tool_calls` is the streaming parser fed the whole text at once,
so the two interfaces cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from gateway.text.tool_calls.base import (
    CallStart,
    Complete,
    ContentDelta,
    ParsedOutput,
    Piece,
    Region,
    ToolCall,
    ToolCallArguments,
    ToolCallEvent,
    ToolCallFormat,
    ToolCallStart,
    new_tool_call_id,
    partial_marker_length,
    skip_ws,
)
from gateway.text.tool_calls.registry import get_format

# ---------------------------------------------------------------- the state machine


class StreamingToolParser:
    """Text deltas in, content and tool-call events out, for one choice.

    Text that might be the start of a call is held back, like a stop string, and released as
    content if it turns out not to be one. A call is announced (`ToolCallStart`) once it is
    committed, and its arguments follow as `ToolCallArguments` fragments as they are written, one
    per `feed` at most. Any split of the same text gives the same content, the same calls and the
    same arguments.

    `tool_names`, when given (the request's tools), limits calls to those functions: a "call" to
    anything else is left as content rather than handed to a client that cannot run it.
    `tool_parameters` (name -> the tool's parameters schema) types the values of formats that
    write them as text (``qwen3_coder``).
    """

    __slots__ = (
        "_after_call",
        "_at_start",
        "_calls",
        "_committed",
        "_format",
        "_make_id",
        "_names",
        "_parameters",
        "_pending",
        "_region",
        "_region_at",
    )

    def __init__(
        self,
        format: str,
        *,
        tool_names: Collection[str] | None = None,
        tool_parameters: Mapping[str, Any] | None = None,
        make_id: Callable[[], str] = new_tool_call_id,
    ) -> None:
        self._format = get_format(format)
        self._names = frozenset(tool_names) if tool_names is not None else None
        self._parameters: Mapping[str, Any] = tool_parameters or {}
        self._make_id = make_id
        self._pending = ""
        self._region: Region | None = None
        self._region_at = 0  # where the region starts in `_pending`; before it, held whitespace
        self._at_start = True
        self._after_call = False
        self._committed = False  # the current region has reported a call
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
                self._take(self._region.pieces, events)
                if outcome is None:
                    assert not final, "a region decides everything at the end of the reply"
                    break
                if isinstance(outcome, Complete):
                    self._pending = self._pending[self._region_at + outcome.end :]
                    self._after_call = True
                else:
                    assert not self._committed, "a committed call is never taken back"
                    # Not a call after all: its first character is content, and the search for a
                    # call resumes right after it (a real marker may follow inside the rejected text).
                    self._emit(self._pending[: self._region_at + 1], events)
                    self._pending = self._pending[self._region_at + 1 :]
                self._region = None
                self._committed = False
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
                self._region = fmt.region(
                    self._opener_at(fmt, self._region_at), self._names, self._parameters
                )
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

    def _find_start(self, fmt: ToolCallFormat) -> tuple[int | None, int]:
        """Where the next region opens, or (None, how many trailing characters to hold back)."""
        text = self._pending
        if self._after_call and fmt.continuation and text.startswith(fmt.continuation):
            return 0, 0
        if self._at_start and fmt.start_openers:
            i = skip_ws(text, 0)
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
        return None, partial_marker_length(text, fmt.markers)

    def _opener_at(self, fmt: ToolCallFormat, at: int) -> str:
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

    def _take(self, pieces: list[Piece], events: list[ToolCallEvent]) -> None:
        """The region's new pieces as events: a call's start, or more of its arguments (merged
        into one fragment per feed)."""
        for piece in pieces:
            if isinstance(piece, CallStart):
                self._committed = True
                events.append(ToolCallStart(self._calls, self._make_id(), piece.name))
                self._calls += 1
            elif piece:
                index = self._calls - 1
                last = events[-1] if events else None
                if isinstance(last, ToolCallArguments) and last.index == index:
                    events[-1] = ToolCallArguments(index, last.arguments + piece)
                else:
                    events.append(ToolCallArguments(index, piece))
        pieces.clear()


class ForcedToolParser:
    """The parser for a reply that guided decoding forced to be a call (`tool_call_json_schema`,
    parsed with the ``json`` format): the reply is a call from its first token, whatever cuts it.

    With the function known in advance (a named tool_choice, or "required" with one tool) the call
    is announced as soon as the reply has any text, and its arguments follow as written; a reply cut
    before its arguments opened is that call with no arguments written, never content. With
    several tools to choose from, a call is announced once its name is written; nothing of the
    reply is content (the guide admits nothing but the call JSON).
    """

    __slots__ = ("_inner", "_make_id", "_name", "_started")

    def __init__(
        self,
        *,
        name: str | None,
        tool_names: Collection[str] | None = None,
        make_id: Callable[[], str] = new_tool_call_id,
    ) -> None:
        self._inner = StreamingToolParser("json", tool_names=tool_names, make_id=make_id)
        self._name = name
        self._make_id = make_id
        self._started = False

    @property
    def tool_calls(self) -> int:
        return max(self._inner.tool_calls, 1 if self._started else 0)

    def feed(self, delta: str) -> list[ToolCallEvent]:
        events: list[ToolCallEvent] = []
        if self._name is not None and not self._started and delta.strip():
            self._started = True
            events.append(ToolCallStart(0, self._make_id(), self._name))
        return events + self._forward(self._inner.feed(delta))

    def finish(self) -> list[ToolCallEvent]:
        return self._forward(self._inner.finish())

    def _forward(self, events: list[ToolCallEvent]) -> list[ToolCallEvent]:
        out: list[ToolCallEvent] = []
        for event in events:
            if isinstance(event, ContentDelta):
                continue  # a call cut before it committed: the call (if announced) is all there is
            if isinstance(event, ToolCallStart) and self._started and event.index == 0:
                continue  # announced already
            out.append(event)
        return out


def parse_tool_calls(
    text: str,
    format: str,
    *,
    tool_names: Collection[str] | None = None,
    tool_parameters: Mapping[str, Any] | None = None,
    make_id: Callable[[], str] = new_tool_call_id,
) -> ParsedOutput:
    """The content and calls of a complete reply. With no calls found, content is `text` unchanged."""
    parser = StreamingToolParser(
        format, tool_names=tool_names, tool_parameters=tool_parameters, make_id=make_id
    )
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
