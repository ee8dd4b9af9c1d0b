"""Stop-string matching over a text stream, with a hold-back buffer.

Text that might be the start of a stop string is held back until it is known not to be; when
a stop string appears, everything from its first character on is dropped. The emitted text is
the same however the stream was split.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    __slots__ = ("_buffer", "_stops", "matched", "stopped")

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._buffer = ""
        self.stopped = False
        # The stop string that matched (Anthropic's `stop_sequence` names it).
        self.matched: str | None = None

    def push(self, text: str) -> str:
        """Feed new text; return what can be emitted now. Sets `stopped` on a match."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        buffer = self._buffer + text
        # The stop string that completes first wins (as if text arrived a character at a time),
        # so the result does not depend on how the stream was split; ties go to the longest.
        cut, end, matched = -1, -1, ""
        for stop in self._stops:
            at = buffer.find(stop)
            if at == -1:
                continue
            stop_end = at + len(stop)
            if end == -1 or stop_end < end or (stop_end == end and at < cut):
                cut, end, matched = at, stop_end, stop
        if cut != -1:
            self.stopped = True
            self.matched = matched
            self._buffer = ""
            return buffer[:cut]
        keep = self._held_suffix_length(buffer)
        self._buffer = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """The stream ended: what was held back was not a stop string after all."""
        held, self._buffer = self._buffer, ""
        return "" if self.stopped else held

    def _held_suffix_length(self, buffer: str) -> int:
        # The longest suffix of `buffer` that is a proper prefix of some stop string.
        best = 0
        for stop in self._stops:
            upto = min(len(stop) - 1, len(buffer))
            for k in range(upto, best, -1):
                if stop.startswith(buffer[len(buffer) - k :]):
                    best = k
                    break
        return best
