"""One reply's text split into the model's thinking, its answer and its tool calls, streamed or
whole: the model's reasoning parser first, then its tool-call parser on the answer. Every API that
parses replies (chat completions, Responses, Messages) runs this one chain. Pure: no tokenizer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.text.reasoning import (
    ReasoningDelta,
    ReasoningEvent,
    ReasoningFormat,
    ReasoningParser,
    get_format,
)
from gateway.text.tool_calls import (
    ContentDelta,
    ForcedToolParser,
    StreamingToolParser,
    ToolCall,
    ToolCallArguments,
    ToolCallStart,
)
from gateway.text.tool_calls.registry import HARMONY
from gateway.text.tool_calls.registry import check_format as check_tool_format

# What a reply parser reports: thinking, answer text, and the calls the model made.
ReplyEvent = ReasoningEvent


def reasoning_format_of(reasoning_parser: str, tool_parser: str) -> ReasoningFormat | None:
    """The reasoning format a model's replies are read with: its `reasoning_parser`'s, or, for a
    model whose tool parser is harmony's (gpt-oss), the harmony channel parser in any case, since
    its calls are messages among its channels."""
    fmt = get_format(reasoning_parser)
    if fmt is None and check_tool_format(tool_parser) == HARMONY:
        return get_format("gpt_oss")
    return fmt


class ReplyParser:
    """Decoded text (and the ids it came from) in, reply events out, for one choice.

    The reasoning parser (when the model has one) splits off the thinking; what it leaves as the
    answer goes through the tool-call parser (when the request can call tools). A gpt_oss model's
    calls come from its reasoning parser itself and pass straight through.

    `count_text`, for a reply decoded from text with no ids (an ensemble that returns text), counts
    the thinking's tokens by encoding it: the ids are the exact count, this is the tokenizer's.
    `completion_tokens`, with it, gives the choice's own count of its reply: text encoded again may
    take more tokens than were generated, so the thinking is never counted above it, and a reply
    that was all thinking is counted as all of it.
    """

    __slots__ = (
        "_answered",
        "_completion_tokens",
        "_count_text",
        "_reasoning",
        "_seen_ids",
        "_thinking",
        "_tools",
    )

    def __init__(
        self,
        *,
        reasoning: ReasoningParser | None = None,
        tools: StreamingToolParser | ForcedToolParser | None = None,
        count_text: Callable[[str], int] | None = None,
        completion_tokens: Callable[[], int] | None = None,
    ) -> None:
        self._reasoning = reasoning
        self._tools = tools
        self._count_text = count_text if reasoning is not None else None
        self._completion_tokens = completion_tokens
        self._seen_ids = False
        self._thinking: list[str] = []
        # Whether anything but thinking (answer text, a call) came out.
        self._answered = False

    @property
    def tool_calls(self) -> int:
        """How many calls have been announced so far."""
        calls = self._tools.tool_calls if self._tools is not None else 0
        return calls + (self._reasoning.tool_calls if self._reasoning is not None else 0)

    @property
    def reasoning_tokens(self) -> int:
        """Output tokens spent thinking (usage's `reasoning_tokens`); exact once `finish` was called."""
        if self._reasoning is None:
            return 0
        if self._seen_ids or self._count_text is None:
            return self._reasoning.reasoning_tokens
        if not self._thinking:
            return 0
        if self._completion_tokens is None:
            return self._count_text("".join(self._thinking))
        if not self._answered:
            return self._completion_tokens()
        return min(self._count_text("".join(self._thinking)), self._completion_tokens())

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[ReplyEvent]:
        if token_ids:
            self._seen_ids = True
        if self._reasoning is None:
            return self._answer(text) if text else []
        if not text and not token_ids:
            return []
        return self._split(self._reasoning.feed(text, token_ids))

    def finish(self) -> list[ReplyEvent]:
        """The reply is complete (or was cut): whatever the parsers still held back."""
        out = self._split(self._reasoning.finish()) if self._reasoning is not None else []
        if self._tools is not None:
            out += self._tools.finish()
        return out

    def _answer(self, text: str) -> list[ReplyEvent]:
        if self._tools is None:
            return [ContentDelta(text)]
        return list(self._tools.feed(text))

    def _split(self, events: list[ReasoningEvent]) -> list[ReplyEvent]:
        if self._tools is None and self._count_text is None:
            return events
        out: list[ReplyEvent] = []
        for event in events:
            if isinstance(event, ContentDelta):
                answer = self._answer(event.text)
                self._answered = self._answered or bool(answer)
                out += answer
            else:
                if not isinstance(event, ReasoningDelta):
                    self._answered = True
                elif self._count_text is not None:
                    self._thinking.append(event.text)
                out.append(event)
        return out


@dataclass(frozen=True, slots=True)
class ParsedReply:
    """A whole reply, split."""

    # None when the model did not think (or its thinking was empty).
    reasoning: str | None
    content: str
    tool_calls: tuple[ToolCall, ...]


class ReplyCollector:
    """Reply events gathered into a `ParsedReply` (the non-streamed answer of the same parser)."""

    __slots__ = ("_arguments", "_content", "_names", "_reasoning")

    def __init__(self) -> None:
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._names: dict[int, tuple[str, str]] = {}
        self._arguments: dict[int, list[str]] = {}

    def add(self, events: Sequence[ReplyEvent]) -> None:
        for event in events:
            if isinstance(event, ContentDelta):
                self._content.append(event.text)
            elif isinstance(event, ReasoningDelta):
                self._reasoning.append(event.text)
            elif isinstance(event, ToolCallStart):
                self._names[event.index] = (event.id, event.name)
            elif isinstance(event, ToolCallArguments):
                self._arguments.setdefault(event.index, []).append(event.arguments)

    def reply(self) -> ParsedReply:
        calls = tuple(
            ToolCall(call_id, name, "".join(self._arguments.get(index, ())))
            for index, (call_id, name) in sorted(self._names.items())
        )
        return ParsedReply("".join(self._reasoning) or None, "".join(self._content), calls)


def parse_reply(parser: ReplyParser, text: str, token_ids: Sequence[int] = ()) -> ParsedReply:
    """A complete reply through `parser` at once."""
    collector = ReplyCollector()
    collector.add(parser.feed(text, token_ids))
    collector.add(parser.finish())
    return collector.reply()
