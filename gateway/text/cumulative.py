"""Cumulative text to exact deltas, for engines whose streamed responses each carry the whole text
so far (the `llmapi` model) rather than what is new. Pure.

Each response must extend the text already passed on: anything else is an error, never a guess.
A trailing U+FFFD is held back until the next response, because a detokenizer that has only part
of a multi-byte character may show it as U+FFFD and replace it once the rest arrives; the end of
the stream releases it. A server that answers a stream in one piece is one delta.
"""

from __future__ import annotations

_REPLACEMENT = "\ufffd".encode()


class NotCumulativeError(ValueError):
    """A streamed text did not start with the text sent before it."""


class CumulativeText:
    __slots__ = ("_held", "_sent")

    def __init__(self) -> None:
        # What has been passed on, and what the last response had beyond it (a U+FFFD run).
        self._sent = b""
        self._held = b""

    @property
    def text(self) -> bytes:
        """Everything passed on so far."""
        return self._sent

    def push(self, cumulative: bytes) -> bytes:
        """The part of `cumulative` not passed on before (maybe empty)."""
        sent = self._sent
        if not cumulative.startswith(sent):
            raise NotCumulativeError(
                f"the engine's streamed text no longer starts with what it sent before "
                f"({len(sent)} bytes passed on, {len(cumulative)} bytes now)"
            )
        new = cumulative[len(sent) :]
        keep = len(new)
        while new[:keep].endswith(_REPLACEMENT):
            keep -= len(_REPLACEMENT)
        self._held = new[keep:]
        delta = new[:keep]
        self._sent = sent + delta
        return delta

    def finish(self) -> bytes:
        """At the end of the stream: what was held back."""
        held, self._held = self._held, b""
        self._sent += held
        return held
