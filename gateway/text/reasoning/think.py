"""The ``<think>`` ... ``</think>`` block that DeepSeek-R1 and Qwen3 write before their answer.

One block at most, at the start of the reply: text after ``</think>`` is the answer even if it
mentions the markers again. Whitespace at the block's edges and right after it is not part of
the reasoning or the answer. Where the reply starts (inside the block or not) is decided by the
rendered prompt: a chat template that ends it with ``<think>`` has opened the block itself, one
that ends it with ``</think>`` (Qwen3's ``enable_thinking: false``) has closed an empty one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from gateway.text.reasoning.base import ReasoningParser, partial_marker_length

THINK_START: Final = "<think>"
THINK_END: Final = "</think>"
MARKERS: Final = (THINK_START, THINK_END)

# Where the parser is in the reply.
_OPENING: Final = 0  # nothing but whitespace so far: a `<think>` may still open the block
_REASONING_LEAD: Final = 1  # inside the block, before its first visible character
_REASONING: Final = 2
_CONTENT_LEAD: Final = 3  # just after `</think>`
_CONTENT: Final = 4


def prompt_state(prompt: str) -> bool | None:
    """True when the prompt ends inside an open think block, False when it ends with a closed one,
    None when it ends with neither (the model decides)."""
    tail = prompt.rstrip()
    if tail.endswith(THINK_START):
        return True
    if tail.endswith(THINK_END):
        return False
    return None


class ThinkParser(ReasoningParser):
    """The think-block state machine; `starts_in_reasoning` says whether text before any marker is
    thinking (DeepSeek-R1, or a prompt that opened the block) or the answer."""

    __slots__ = ("_closed", "_count_open", "_end_id", "_pending", "_phase", "_start_id", "_starts", "_tokens")

    def __init__(self, *, starts_in_reasoning: bool, marker_ids: Mapping[str, int]) -> None:
        super().__init__()
        self._starts = starts_in_reasoning
        self._phase = _OPENING
        self._pending = ""
        self._start_id = marker_ids.get(THINK_START)
        self._end_id = marker_ids.get(THINK_END)
        self._count_open = starts_in_reasoning
        self._closed = False
        self._tokens = 0

    @property
    def reasoning_tokens(self) -> int:
        return self._tokens

    def _count(self, token_ids: Sequence[int]) -> None:
        # The marker tokens themselves are not reasoning; after the block closes nothing is.
        for token_id in token_ids:
            if self._closed:
                return
            if token_id == self._start_id:
                self._count_open = True
            elif token_id == self._end_id:
                self._count_open = False
                self._closed = True
            elif self._count_open:
                self._tokens += 1

    def _advance(self, text: str, *, final: bool) -> None:
        self._pending += text
        while True:
            phase = self._phase
            pending = self._pending
            if phase == _OPENING:
                body = pending.lstrip()
                if body.startswith(THINK_START):
                    self._pending = body[len(THINK_START) :]
                    self._phase = _REASONING_LEAD
                elif not final and THINK_START.startswith(body):
                    return  # only whitespace, or the start of `<think>`, so far
                else:
                    # The whitespace belongs to the answer, but is not the reasoning's.
                    self._phase = _REASONING_LEAD if self._starts else _CONTENT
            elif phase in (_REASONING_LEAD, _CONTENT_LEAD):
                self._pending = pending.lstrip()
                if not self._pending:
                    return
                self._phase = _REASONING if phase == _REASONING_LEAD else _CONTENT
            elif phase == _REASONING:
                end = pending.find(THINK_END)
                if end != -1:
                    self._reasoning(pending[:end].rstrip())
                    self._pending = pending[end + len(THINK_END) :]
                    self._phase = _CONTENT_LEAD
                    continue
                if final:
                    self._reasoning(pending.rstrip())
                    self._pending = ""
                    return
                # Held back: what may be the start of `</think>`, and trailing whitespace (which is
                # dropped if the block ends right after it).
                keep = len(pending[: len(pending) - partial_marker_length(pending, (THINK_END,))].rstrip())
                self._reasoning(pending[:keep])
                self._pending = pending[keep:]
                return
            else:
                self._content(pending)
                self._pending = ""
                return
