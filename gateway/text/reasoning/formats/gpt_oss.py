"""``gpt_oss``: the harmony format of OpenAI's gpt-oss models.

The chat template ends the prompt with ``<|start|>assistant``; the reply is then one or more
messages ``<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>TYPE]<|message|>BODY<|end|>``, each
after the first opened by ``<|start|>assistant`` again (the recipient may also follow the role).
The last one ends with ``<|return|>`` (the answer) or ``<|call|>`` (a tool call); both are
end-of-generation tokens, so they may be missing from the text.

- ``analysis``: the chain of thought, reasoning.
- ``commentary`` or any channel with recipient ``functions.NAME``: a call of the function NAME,
  the body its JSON arguments, streamed as they arrive and read as the tool-call parsers read
  arguments (the JSON text without whitespace between tokens, up to where it stops being a JSON
  object; see `gateway.text.tool_calls.base`); another recipient (the built-in
  ``browser`` or ``python`` tools, which the gateway does not run) is reasoning too.
- ``final``, and ``commentary`` with no recipient (a preamble the user may see): content.
- Text before any header (a model that ignores the format) is content. A header that never
  reaches ``<|message|>`` holds no text and is dropped. Bodies of successive messages that go to
  the same field are joined with a newline.

The markers are special tokens: the text must be decoded with skip_special_tokens=False.

Parsed here rather than with the ``openai-harmony`` library: its parser works on token ids of the
``o200k_harmony`` encoding, which it loads from the ``o200k_base.tiktoken`` vocabulary (3.6 MB)
downloaded at run time (or found through ``TIKTOKEN_ENCODINGS_BASE``); neither the gpt-oss model
directory nor the wheel carries it, so an offline server would fail, and the ids of any other
tokenizer (the tests' tiny one) mean nothing to it. The channel markers are a small grammar.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final

from gateway.text.reasoning.base import ReasoningFormat, ReasoningParser, partial_marker_length
from gateway.text.tool_calls import JsonScanner, ToolCallArguments, ToolCallStart

START: Final = "<|start|>"
CHANNEL: Final = "<|channel|>"
MESSAGE: Final = "<|message|>"
CONSTRAIN: Final = "<|constrain|>"
END: Final = "<|end|>"
CALL: Final = "<|call|>"
RETURN: Final = "<|return|>"

_HEADER_OPENERS: Final = (START, CHANNEL)
# A body ends at a terminator, or where the next header starts if the model left one out.
_BODY_ENDS: Final = (END, CALL, RETURN, START, CHANNEL)
_CONSUMED_ENDS: Final = (END, CALL, RETURN)
_FUNCTIONS: Final = "functions."

# Where a body's text goes.
_TO_REASONING: Final = -1
_TO_CONTENT: Final = -2  # otherwise: the index of the tool call it is the arguments of

_EXPECT: Final = 0  # between messages
_HEADER: Final = 1
_BODY: Final = 2


def _first(text: str, markers: Sequence[str]) -> tuple[int, str]:
    best, found = -1, ""
    for marker in markers:
        at = text.find(marker)
        if at != -1 and (best == -1 or at < best):
            best, found = at, marker
    return best, found


def _route(header: str) -> tuple[str, str | None]:
    """The channel and recipient of a header (everything before `<|message|>`)."""
    channel = ""
    recipient = None
    role_part, _, channel_part = header.partition(CHANNEL)
    for part, is_channel in ((role_part, False), (channel_part, True)):
        words = part.replace(START, " ").replace(CONSTRAIN, " ").split()
        for i, word in enumerate(words):
            if word.startswith("to="):
                recipient = word[3:]
            elif is_channel and i == 0:
                channel = word
    return channel, recipient


class HarmonyParser(ReasoningParser):
    __slots__ = (
        "_calls",
        "_count_body",
        "_end_ids",
        "_fresh",
        "_make_id",
        "_message_id",
        "_pending",
        "_phase",
        "_scanners",
        "_segments",
        "_sink",
        "_sinks",
        "_written",
    )

    def __init__(self, *, marker_ids: Mapping[str, int], make_id: Callable[[], str]) -> None:
        super().__init__()
        self._make_id = make_id
        self._pending = ""
        self._phase = _EXPECT
        self._sink = _TO_CONTENT
        self._fresh = False  # no text of the current body has gone out yet
        self._written = {_TO_REASONING: False, _TO_CONTENT: False}
        self._calls = 0
        self._scanners: list[JsonScanner] = []  # each call's arguments
        self._sinks: list[int] = []  # the sink of each message that had a header, in order
        self._message_id = marker_ids.get(MESSAGE)
        self._end_ids = frozenset(marker_ids[name] for name in _BODY_ENDS if name in marker_ids)
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
        while self._pending or final:
            pending = self._pending
            if self._phase == _EXPECT:
                # Whitespace between messages is neither field's; before plain text it is content.
                body = pending.lstrip()
                if body.startswith(_HEADER_OPENERS):
                    self._pending = body
                    self._phase = _HEADER
                elif not body and final:
                    self._pending = ""
                    return
                elif not final and any(m.startswith(body) for m in _HEADER_OPENERS):
                    return
                else:
                    self._open_body(_TO_CONTENT)
            elif self._phase == _HEADER:
                at = pending.find(MESSAGE)
                cut, marker = _first(pending, _CONSUMED_ENDS)
                if at != -1 and (cut == -1 or at < cut):
                    self._start_message(pending[:at])
                    self._pending = pending[at + len(MESSAGE) :]
                elif cut != -1:
                    # A header with no message says nothing: skip past its terminator.
                    self._pending = pending[cut + len(marker) :]
                    self._phase = _EXPECT
                else:
                    if final:
                        self._pending = ""
                    return
            else:
                at, marker = _first(pending, _BODY_ENDS)
                if at != -1:
                    self._write(pending[:at])
                    consumed = len(marker) if marker in _CONSUMED_ENDS else 0
                    self._pending = pending[at + consumed :]
                    self._phase = _EXPECT
                    continue
                if final:
                    self._write(pending)
                    self._pending = ""
                    return
                keep = len(pending) - partial_marker_length(pending, _BODY_ENDS)
                self._write(pending[:keep])
                self._pending = pending[keep:]
                return

    def _start_message(self, header: str) -> None:
        channel, recipient = _route(header)
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
        self._open_body(sink)

    def _open_body(self, sink: int) -> None:
        self._phase = _BODY
        self._sink = sink
        self._fresh = True

    def _write(self, text: str) -> None:
        if not text:
            return
        sink = self._sink
        if sink >= 0:
            fragment = self._scanners[sink].feed(text)
            if fragment:
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


def _parser(prompt: str, marker_ids: Mapping[str, int], make_id: Callable[[], str]) -> ReasoningParser:
    return HarmonyParser(marker_ids=marker_ids, make_id=make_id)


FORMAT = ReasoningFormat(
    name="gpt_oss",
    keeps_special_tokens=True,
    markers=(START, CHANNEL, MESSAGE, END, CALL, RETURN),
    factory=_parser,
)
