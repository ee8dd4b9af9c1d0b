"""What every reasoning format shares: the events a parser emits, the parser's interface, and the
whole-text result built from the same parser so the streamed and non-streamed paths cannot disagree."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.text.tool_calls import ContentDelta, ToolCall, ToolCallArguments, ToolCallStart, new_tool_call_id


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """A piece of the model's thinking: `reasoning_content` in chat, `reasoning_text` in Responses."""

    text: str


# ContentDelta is the answer text, ToolCallStart/ToolCallArguments a call the model made
# (gpt_oss only; think formats hand their content on to the model's tool-call parser).
ReasoningEvent = ReasoningDelta | ContentDelta | ToolCallStart | ToolCallArguments


@dataclass(frozen=True, slots=True)
class ReasoningOutput:
    """A complete reply split by `parse_reasoning`."""

    # None when the model did not think (or its thinking was empty).
    reasoning: str | None
    content: str
    tool_calls: tuple[ToolCall, ...]
    # Output tokens spent thinking (usage's `reasoning_tokens`), counted from the token ids.
    reasoning_tokens: int


class ReasoningParser(ABC):
    """Decoded text in (with each step's token ids), reasoning, content and tool-call events out,
    for one choice.

    `feed` takes each step's new text, decoded the way `ReasoningFormat.keeps_special_tokens` says,
    and the ids that produced it; text that may be the start of a marker is held back until the
    next step decides it. `finish` releases what is left. Any split of the same text gives the same
    events once adjacent ones are merged, and any split of the same ids the same `reasoning_tokens`.
    """

    __slots__ = ("_events",)

    def __init__(self) -> None:
        self._events: list[ReasoningEvent] = []

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[ReasoningEvent]:
        self._count(token_ids)
        self._advance(text, final=False)
        return self._take()

    def finish(self) -> list[ReasoningEvent]:
        """The reply is complete (or was cut): decide everything still held back."""
        self._advance("", final=True)
        return self._take()

    @property
    @abstractmethod
    def reasoning_tokens(self) -> int:
        """Output tokens spent thinking so far; exact once `finish` was called."""

    @property
    def tool_calls(self) -> int:
        """How many calls have been announced so far."""
        return 0

    @abstractmethod
    def _advance(self, text: str, *, final: bool) -> None: ...

    @abstractmethod
    def _count(self, token_ids: Sequence[int]) -> None: ...

    def _reasoning(self, text: str) -> None:
        if text:
            last = self._events[-1] if self._events else None
            if isinstance(last, ReasoningDelta):
                self._events[-1] = ReasoningDelta(last.text + text)
            else:
                self._events.append(ReasoningDelta(text))

    def _content(self, text: str) -> None:
        if text:
            last = self._events[-1] if self._events else None
            if isinstance(last, ContentDelta):
                self._events[-1] = ContentDelta(last.text + text)
            else:
                self._events.append(ContentDelta(text))

    def _take(self) -> list[ReasoningEvent]:
        events, self._events = self._events, []
        return events


@dataclass(frozen=True, slots=True)
class ReasoningFormat:
    """One registered format: its name (the per-model `reasoning_parser` setting), how its text must be
    decoded, which marker strings it needs the token ids of, and how to make a parser for a request."""

    name: str
    # True when the format's markers are special tokens: decode with skip_special_tokens=False.
    keeps_special_tokens: bool
    # The strings whose token ids `reasoning_tokens` counting needs (see `marker_ids`).
    markers: tuple[str, ...]
    # (prompt, marker ids, make_id, encoding) -> a parser for one choice.
    factory: Callable[[str, Mapping[str, int], Callable[[], str], Any], ReasoningParser]
    # What the format builds from a model's files once, at start-up, and hands to each parser as
    # `encoding` (tokenizer folder, cache folder) -> encoding: harmony's parser reads token ids of
    # its own encoding. None: the format reads the text alone. Raises ServerConfigError for a
    # model the format cannot read.
    load: Callable[[Path, Path], Any] | None = None

    def marker_ids(self, vocab: Mapping[str, int]) -> dict[str, int]:
        """The ids of this format's markers in a tokenizer's vocabulary (added tokens included).

        Resolve once per model. A marker that is not one token cannot be seen in the ids, and the
        tokens it delimits are then not counted as reasoning.
        """
        return {marker: vocab[marker] for marker in self.markers if marker in vocab}

    def parser(
        self,
        *,
        prompt: str = "",
        marker_ids: Mapping[str, int] | None = None,
        make_id: Callable[[], str] = new_tool_call_id,
        encoding: Any = None,
    ) -> ReasoningParser:
        """A parser for one choice of a request whose rendered prompt is `prompt` (the chat template
        may have opened or closed the think block there); `encoding`: what `load` made of the
        model's files, for a format that has one."""
        return self.factory(prompt, marker_ids or {}, make_id, encoding)


def partial_marker_length(text: str, markers: Sequence[str]) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of one of `markers`."""
    best = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:k]):
                best = k
                break
    return best
