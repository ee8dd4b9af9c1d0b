"""The Messages API's content, whole or streamed: a pure state machine fed the reply piece by
piece (thinking, text, tool calls), writing Anthropic's event sequence or assembling the
`Message`. Both are fed by the same `ReplyRouter`, so a streamed reply and a whole one cannot
disagree.

Event sequence: `message_start`; per content block `content_block_start`, its
`content_block_delta`s (`thinking_delta`, `text_delta`, `input_json_delta`) and
`content_block_stop`; `message_delta` with the stop reason and usage; `message_stop`. `ping`
may come between any two events; a failure is one `error` event (see `errors.error_event`).

Frames are finished SSE bytes, `event: <type>` then one `data:` line. The per-token text frame
is formatted from a constant head (byte for byte what dumping the event dict gives; tested), the
rest are dumped with orjson.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal, Protocol

import jiter
import orjson
from sse_starlette import ServerSentEvent

from gateway.apis.messages.protocol import (
    ContentBlock,
    Message,
    StopReason,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
)
from gateway.text.reasoning import ReasoningDelta
from gateway.text.reply import ReplyEvent, ReplyParser
from gateway.text.tool_calls import ContentDelta, ToolCallStart

PING: Final = b'event: ping\ndata: {"type":"ping"}\n\n'


def ping_event() -> ServerSentEvent:
    """`PING` as sse-starlette's keep-alive sends it, between any two events (tested equal)."""
    return ServerSentEvent(event="ping", data='{"type":"ping"}', sep="\n")


MESSAGE_STOP: Final = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'

_DELTA_HEAD: Final = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,"delta":{"type":'
)

BlockKind = Literal["text", "thinking", "tool_use"]


def frame(event: dict[str, Any]) -> bytes:
    """One SSE event: its type as the event name, the dict as one data line."""
    return b"event: %b\ndata: %b\n\n" % (event["type"].encode(), orjson.dumps(event))


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int | None) -> dict[str, int | None]:
    """Anthropic's usage of a prompt of `prompt_tokens`, `cached_tokens` of them reused from the
    engine's KV cache (None: the model's contract does not report reuse).

    Anthropic counts a prompt as input_tokens + cache_creation_input_tokens +
    cache_read_input_tokens, so the reused tokens leave input_tokens. A cache write, for Anthropic,
    is the prefix up to a `cache_control` breakpoint, billed apart; the engine keeps every prompt's
    blocks for reuse on its own, with no such write, so cache_creation_input_tokens is 0. Where reuse
    is not reported both cache fields are null (Anthropic's schema has them nullable): 0 would claim
    the prompt was computed in full.
    """
    if cached_tokens is None:
        return {
            "input_tokens": prompt_tokens,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": None,
            "cache_read_input_tokens": None,
        }
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
    }


def stop_reason(finish_reason: str, *, tool_calls: int, stop_sequence: str | None) -> StopReason:
    """Anthropic's stop reason from the core's finish reason ("stop" | "length")."""
    if finish_reason == "length":
        return "max_tokens"
    if stop_sequence is not None:
        return "stop_sequence"
    return "tool_use" if tool_calls else "end_turn"


def tool_input(arguments: str) -> dict[str, Any]:
    """A tool_use block's `input` from its call's arguments text (always JSON as far as it goes, see
    `gateway.text.tool_calls`), read the way the anthropic SDK reads the `input_json_delta`s of a
    stream (jiter's partial mode), so a whole message and a streamed one agree. Whole arguments give
    their object. Arguments cut by max_tokens give what was written: a cut string value is left
    out, a number is read as far as it goes, a cut nested object or array keeps its complete
    members. Anything that is not the start of an object gives {}."""
    if not arguments:
        return {}
    try:
        value = jiter.from_json(arguments.encode(), partial_mode=True)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class ContentSink(Protocol):
    def thinking(self, text: str) -> bytes: ...
    def text(self, text: str) -> bytes: ...
    def tool_use(self, id: str, name: str) -> bytes: ...
    def tool_input(self, partial_json: str) -> bytes: ...


class MessageStreamWriter:
    """Anthropic's streaming events for one message. Blocks open when their first content
    arrives and close when content of another block (or the end) follows."""

    __slots__ = ("_base", "_index", "_open", "_text_head", "_thinking_head")

    def __init__(self, message_id: str, model: str) -> None:
        self._base = {"id": message_id, "type": "message", "role": "assistant", "content": [], "model": model}
        self._index = -1
        self._open: BlockKind | None = None
        self._text_head = b""
        self._thinking_head = b""

    def start(self, prompt_tokens: int, cached_tokens: int | None) -> bytes:
        usage_now = usage(prompt_tokens, 0, cached_tokens)
        message = {**self._base, "stop_reason": None, "stop_sequence": None, "usage": usage_now}
        return frame({"type": "message_start", "message": message})

    def _switch(self, kind: BlockKind, block: dict[str, Any]) -> bytes:
        out = self._close()
        self._index += 1
        self._open = kind
        index = self._index
        # `data: {"type":"content_block_delta","index":N,"delta":{"type":"text_delta","text":`
        head = (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,"delta":{"type":'
            % index
        )
        self._text_head = head + b'"text_delta","text":'
        self._thinking_head = head + b'"thinking_delta","thinking":'
        return out + frame({"type": "content_block_start", "index": index, "content_block": block})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return frame({"type": "content_block_stop", "index": self._index})

    def text(self, text: str) -> bytes:
        if not text:
            return b""
        out = b"" if self._open == "text" else self._switch("text", {"type": "text", "text": ""})
        # frame({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": text}})
        return out + self._text_head + orjson.dumps(text) + b"}}\n\n"

    def thinking(self, text: str) -> bytes:
        if not text:
            return b""
        out = b""
        if self._open != "thinking":
            out = self._switch("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        return out + self._thinking_head + orjson.dumps(text) + b"}}\n\n"

    def tool_use(self, id: str, name: str) -> bytes:
        return self._switch("tool_use", {"type": "tool_use", "id": id, "name": name, "input": {}})

    def tool_input(self, partial_json: str) -> bytes:
        assert self._open == "tool_use", "tool input follows its tool_use block's start"
        if not partial_json:
            return b""
        delta = {"type": "input_json_delta", "partial_json": partial_json}
        return frame({"type": "content_block_delta", "index": self._index, "delta": delta})

    def finish(
        self,
        reason: StopReason,
        stop_sequence: str | None,
        *,
        prompt_tokens: int,
        output_tokens: int,
        cached_tokens: int | None,
    ) -> bytes:
        delta = {"stop_reason": reason, "stop_sequence": stop_sequence}
        # The whole usage, as Anthropic's message_delta carries it (the SDKs take its input and
        # cache counts over message_start's).
        totals = usage(prompt_tokens, output_tokens, cached_tokens)
        end = frame({"type": "message_delta", "delta": delta, "usage": totals})
        return self._close() + end + MESSAGE_STOP


class MessageAssembler:
    """The same content as `MessageStreamWriter`, as a whole `Message`'s blocks."""

    __slots__ = ("_blocks", "_inputs")

    def __init__(self) -> None:
        self._blocks: list[dict[str, Any]] = []
        self._inputs: dict[int, list[str]] = {}

    def _last(self, kind: str) -> dict[str, Any] | None:
        return self._blocks[-1] if self._blocks and self._blocks[-1]["type"] == kind else None

    def text(self, text: str) -> bytes:
        if text:
            block = self._last("text")
            if block is None:
                self._blocks.append({"type": "text", "text": text})
            else:
                block["text"] += text
        return b""

    def thinking(self, text: str) -> bytes:
        if text:
            block = self._last("thinking")
            if block is None:
                self._blocks.append({"type": "thinking", "thinking": text})
            else:
                block["thinking"] += text
        return b""

    def tool_use(self, id: str, name: str) -> bytes:
        self._inputs[len(self._blocks)] = []
        self._blocks.append({"type": "tool_use", "id": id, "name": name})
        return b""

    def tool_input(self, partial_json: str) -> bytes:
        self._inputs[len(self._blocks) - 1].append(partial_json)
        return b""

    def content(self) -> list[ContentBlock]:
        out: list[ContentBlock] = []
        for i, block in enumerate(self._blocks):
            if block["type"] == "text":
                out.append(TextBlock(text=block["text"]))
            elif block["type"] == "thinking":
                out.append(ThinkingBlock(thinking=block["thinking"]))
            else:
                raw = "".join(self._inputs[i])
                out.append(ToolUseBlock(id=block["id"], name=block["name"], input=tool_input(raw)))
        return out

    def message(
        self,
        message_id: str,
        model: str,
        reason: StopReason,
        stop_sequence: str | None,
        *,
        prompt_tokens: int,
        output_tokens: int,
        cached_tokens: int | None,
    ) -> Message:
        return Message(
            id=message_id,
            content=self.content(),
            model=model,
            stop_reason=reason,
            stop_sequence=stop_sequence,
            usage=Usage.model_validate(usage(prompt_tokens, output_tokens, cached_tokens)),
        )


class ReplyRouter:
    """One reply's text into content blocks, through the core's reply parser (the model's
    reasoning parser, then its tool-call parser): thinking becomes `thinking` blocks (or nothing,
    when the client asked for thinking to be omitted), calls `tool_use` blocks, the rest `text`.
    Whatever the sink returns (a writer's frames, an assembler's nothing) is handed back."""

    __slots__ = ("_parser", "_show_thinking", "_sink")

    def __init__(self, sink: ContentSink, parser: ReplyParser | None, *, show_thinking: bool = True) -> None:
        self._sink = sink
        self._parser = parser
        self._show_thinking = show_thinking

    @property
    def tool_calls(self) -> int:
        return self._parser.tool_calls if self._parser is not None else 0

    def thinking(self, text: str) -> bytes:
        return self._sink.thinking(text) if self._show_thinking else b""

    def text(self, text: str, token_ids: Sequence[int] = ()) -> bytes:
        if self._parser is None:
            return self._sink.text(text) if text else b""
        return self._route(self._parser.feed(text, token_ids))

    def finish(self) -> bytes:
        """The reply is complete: whatever the parsers still held back."""
        return self._route(self._parser.finish()) if self._parser is not None else b""

    def _route(self, events: list[ReplyEvent]) -> bytes:
        out = b""
        for event in events:
            if isinstance(event, ContentDelta):
                out += self._sink.text(event.text)
            elif isinstance(event, ReasoningDelta):
                out += self.thinking(event.text)
            elif isinstance(event, ToolCallStart):
                out += self._sink.tool_use(event.id, event.name)
            else:
                out += self._sink.tool_input(event.arguments)
        return out
