"""``gpt_oss``: the harmony format of OpenAI's gpt-oss models, read by ``openai-harmony``'s own
parser (`openai_harmony.StreamableParser`).

The chat template ends the prompt with ``<|start|>assistant``; the reply is then one or more
messages ``<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>TYPE]<|message|>BODY<|end|>``, each
after the first opened by ``<|start|>assistant`` again (the recipient may also follow the role).
The last one ends with ``<|return|>`` (the answer) or ``<|call|>`` (a tool call); both are
end-of-generation tokens, so they may be missing from the text. Where each message goes:

- ``analysis``: the chain of thought, reasoning.
- a recipient ``functions.NAME`` (on the commentary channel): a call of the function NAME, the
  body its JSON arguments, streamed as they arrive and read as the tool-call parsers read
  arguments (the JSON text without whitespace between tokens, up to where it stops being a JSON
  object; see `gateway.text.tool_calls.base`); another recipient (the built-in ``browser`` or
  ``python`` tools, which the gateway does not run) is reasoning too.
- ``final``, and ``commentary`` with no recipient (a preamble the user may see): content.
- Text outside any message (a model that ignores the format) is content up to the next
  terminator or header. A header that never reaches ``<|message|>`` holds no text and is dropped;
  one the library cannot read makes its body content. Bodies of successive messages that go to
  the same field are joined with a newline.

The library parses token ids of its o200k-harmony encoding, which `gateway.text.harmony` builds
from the served model's tokenizer.json at start-up (`FORMAT.load`). It is fed the reply's *text*
re-encoded with that encoding, not the engine's ids: the reply parsers all read the text the
client gets (after the detokenizer and stop strings cut it, and on contracts that return only
text), and the re-encoded text gives the library the same markers and the same decoded bodies and
headers as the model's own ids, whatever the split. The text is decoded with special tokens kept;
a delta that ends in part of a marker is held back until the marker is whole. Each message gets a
parser of its own, started as the prompt leaves it (the assistant's header), so a model that
leaves out ``<|start|>assistant`` or a terminator is read message by message as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import openai_harmony

from gateway.text.harmony import MARKERS, load_encoding
from gateway.text.reasoning.base import ReasoningFormat, ReasoningParser, partial_marker_length
from gateway.text.tool_calls import JsonScanner, ToolCallArguments, ToolCallStart

START: Final = "<|start|>"
CHANNEL: Final = "<|channel|>"
MESSAGE: Final = "<|message|>"
CONSTRAIN: Final = "<|constrain|>"
END: Final = "<|end|>"
CALL: Final = "<|call|>"
RETURN: Final = "<|return|>"

# What opens a message where none is open: its role's start, its channel, or its recipient
# right after the role the prompt wrote.
_OPENERS: Final = (START, CHANNEL, "to=")
# Text outside a message ends at a terminator, or where a header starts.
_OUTSIDE_ENDS: Final = (END, CALL, RETURN, START, CHANNEL)
_TERMINATORS: Final = (END, CALL, RETURN)
# The only text the re-encoding reads as special tokens: the format's markers (any other special
# token's text stays text, as the body it sits in has it).
_SPECIAL: Final = frozenset(MARKERS)
_FUNCTIONS: Final = "functions."

# Where a body's text goes.
_TO_REASONING: Final = -1
_TO_CONTENT: Final = -2  # otherwise: the index of the tool call it is the arguments of

_OUTSIDE: Final = 0  # no message open (before the first, between two)
_STRAY: Final = 1  # text outside the format, content until a terminator or a header
_HEADER: Final = 2  # a message's header, read by the library
_BODY: Final = 3  # a message's body, decoded by the library


class HarmonyParser(ReasoningParser):
    __slots__ = (
        "_calls",
        "_count_body",
        "_encoding",
        "_end_ids",
        "_fresh",
        "_harmony",
        "_make_id",
        "_message",
        "_message_id",
        "_opening",
        "_pending",
        "_phase",
        "_scanners",
        "_segments",
        "_sink",
        "_sinks",
        "_start",
        "_stops",
        "_written",
    )

    def __init__(self, *, encoding: Any, marker_ids: Mapping[str, int], make_id: Callable[[], str]) -> None:
        super().__init__()
        if encoding is None:
            raise ValueError("the harmony parser needs the model's o200k-harmony encoding")
        self._encoding = encoding
        self._make_id = make_id
        ids = {
            m: encoding.encode(m, allowed_special={m}, disallowed_special=())[0]
            for m in (START, CHANNEL, MESSAGE, *_TERMINATORS)
        }
        self._start = ids[START]
        self._opening = frozenset((ids[START], ids[CHANNEL]))
        self._message = ids[MESSAGE]
        self._stops = frozenset(ids[m] for m in _TERMINATORS)
        self._harmony: Any = None  # the open message's library parser
        self._pending = ""  # text not decided yet: a possible partial marker, or opener
        self._phase = _OUTSIDE
        self._sink = _TO_CONTENT
        self._fresh = False  # no text of the current body has gone out yet
        self._written = {_TO_REASONING: False, _TO_CONTENT: False}
        self._calls = 0
        self._scanners: list[JsonScanner] = []  # each call's arguments
        self._sinks: list[int] = []  # the sink of each message that had a header, in order
        # Counting reasoning_tokens from the engine's ids (the model's own tokens, not the
        # re-encoded text's): the body of the n-th `<|message|>` is the n-th message's.
        self._message_id = marker_ids.get(MESSAGE)
        self._end_ids = frozenset(marker_ids[name] for name in _OUTSIDE_ENDS if name in marker_ids)
        self._segments: list[int] = []  # tokens in the body of each `<|message|>` seen in the ids
        self._count_body = False

    @property
    def tool_calls(self) -> int:
        return self._calls

    @property
    def reasoning_tokens(self) -> int:
        sinks = self._sinks
        return sum(n for i, n in enumerate(self._segments) if i < len(sinks) and sinks[i] == _TO_REASONING)

    def _count(self, token_ids: Sequence[int]) -> None:
        for token_id in token_ids:
            if token_id == self._message_id:
                self._segments.append(0)
                self._count_body = True
            elif token_id in self._end_ids:
                self._count_body = False
            elif self._count_body:
                self._segments[-1] += 1

    def _advance(self, text: str, *, final: bool) -> None:
        self._pending += text
        while self._pending:
            pending = self._pending
            if self._phase == _OUTSIDE:
                # Whitespace between messages is neither field's; before plain text it is content.
                body = pending.lstrip()
                if body.startswith(_OPENERS):
                    self._open_message()
                    # The role's start is the prompt's `<|start|>assistant` again: the message's
                    # parser starts after it, as the first one starts after the prompt's.
                    self._pending = body.removeprefix(START)
                elif not body and final:
                    self._pending = ""
                elif not body or (not final and any(m.startswith(body) for m in _OPENERS)):
                    return
                else:
                    self._phase = _STRAY
                    self._open_body(_TO_CONTENT)
            elif self._phase == _STRAY:
                at, marker = _first(pending, _OUTSIDE_ENDS)
                if at != -1:
                    self._write(pending[:at])
                    self._pending = pending[at + (len(marker) if marker in _TERMINATORS else 0) :]
                    self._phase = _OUTSIDE
                    continue
                keep = 0 if final else partial_marker_length(pending, _OUTSIDE_ENDS)
                self._write(pending[: len(pending) - keep])
                self._pending = pending[len(pending) - keep :]
                return
            else:
                keep = 0 if final else partial_marker_length(pending, MARKERS)
                ready = pending[: len(pending) - keep]
                self._pending = pending[len(pending) - keep :]
                if not ready:
                    return
                ids = self._encoding.encode(ready, allowed_special=_SPECIAL, disallowed_special=())
                for i, token in enumerate(ids):
                    if not self._read(token):
                        # The message ended: what follows is read as text again. The ids split
                        # only at a marker, so the rest decodes to exactly its own text.
                        self._pending = self._encoding.decode(ids[i + 1 :]) + self._pending
                        if token in self._opening:
                            self._pending = self._encoding.decode([token]) + self._pending
                        break

    def _open_message(self) -> None:
        self._harmony = openai_harmony.StreamableParser(self._encoding, role=openai_harmony.Role.ASSISTANT)
        self._phase = _HEADER

    def _read(self, token: int) -> bool:
        """One token of the open message to the library; False once the message has ended (the
        token, when it opens the next header, is to be read again)."""
        if self._phase == _HEADER:
            if token in self._stops:
                # A header with no message says nothing: skip past its terminator.
                self._phase = _OUTSIDE
                return False
            if token == self._start:
                return True  # a repeated role start says nothing new
            try:
                self._harmony.process(token)
            except openai_harmony.HarmonyError:
                # A header the library cannot read: its body is text outside the format.
                self._sinks.append(_TO_CONTENT)
                self._phase = _STRAY
                self._open_body(_TO_CONTENT)
                return False
            if token == self._message:
                self._start_body(self._harmony.current_channel, self._harmony.current_recipient)
            return True
        if token in self._stops or token in self._opening:
            # A terminator ends the body; so does the next header where the model left one out.
            self._phase = _OUTSIDE
            return False
        self._harmony.process(token)
        delta = self._harmony.last_content_delta
        if delta:
            self._write(delta)
        return True

    def _start_body(self, channel: str | None, recipient: str | None) -> None:
        if recipient is not None and recipient.startswith(_FUNCTIONS):
            index = self._calls
            self._calls += 1
            self._events.append(ToolCallStart(index, self._make_id(), recipient[len(_FUNCTIONS) :]))
            self._scanners.append(JsonScanner(object_only=True))
            sink = index
        elif recipient is not None or channel == "analysis":
            sink = _TO_REASONING
        else:
            sink = _TO_CONTENT
        self._sinks.append(sink)
        self._phase = _BODY
        self._open_body(sink)

    def _open_body(self, sink: int) -> None:
        self._sink = sink
        self._fresh = True

    def _write(self, text: str) -> None:
        if not text:
            return
        sink = self._sink
        if sink >= 0:
            fragment = self._scanners[sink].feed(text)
            if fragment:
                # The library decodes token by token: one step's pieces go out as one delta.
                last = self._events[-1] if self._events else None
                if isinstance(last, ToolCallArguments) and last.index == sink:
                    self._events[-1] = ToolCallArguments(sink, last.arguments + fragment)
                else:
                    self._events.append(ToolCallArguments(sink, fragment))
            return
        if self._fresh and self._written[sink]:
            text = "\n" + text
        self._fresh = False
        self._written[sink] = True
        if sink == _TO_REASONING:
            self._reasoning(text)
        else:
            self._content(text)


def _first(text: str, markers: Sequence[str]) -> tuple[int, str]:
    best, found = -1, ""
    for marker in markers:
        at = text.find(marker)
        if at != -1 and (best == -1 or at < best):
            best, found = at, marker
    return best, found


def _parser(
    prompt: str, marker_ids: Mapping[str, int], make_id: Callable[[], str], encoding: Any
) -> ReasoningParser:
    return HarmonyParser(encoding=encoding, marker_ids=marker_ids, make_id=make_id)


FORMAT = ReasoningFormat(
    name="gpt_oss",
    keeps_special_tokens=True,
    markers=(START, CHANNEL, MESSAGE, END, CALL, RETURN),
    factory=_parser,
    load=load_encoding,
)
