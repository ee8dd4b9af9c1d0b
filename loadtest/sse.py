"""Incremental Server-Sent Events parser for the load generator's hot path.

It follows the WHATWG event-stream rules (CR, LF and CRLF line ends, comments, multi-line data) and
is fed raw network reads of any size, so the events do not depend on how the bytes were split.
"""

from __future__ import annotations

from dataclasses import dataclass

from loadtest.fastjson import loads

__all__ = ["DONE", "SSEEvent", "SSEParser", "loads"]

DONE = b"[DONE]"


@dataclass(frozen=True, slots=True)
class SSEEvent:
    data: bytes
    event: str = "message"
    id: str | None = None


class SSEParser:
    """Turns a byte stream into events; `feed` returns the events completed by that read."""

    __slots__ = ("_buf", "_data", "_event", "_has_data", "_id", "_skip_lf")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        self._event = ""
        self._id: str | None = None
        self._has_data = False
        self._skip_lf = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if not chunk:
            return []
        buf = self._buf + chunk if self._buf else chunk
        if self._skip_lf:
            # The previous read ended with CR, already taken as a line end: its LF half is not a new line.
            self._skip_lf = False
            if buf[:1] == b"\n":
                buf = buf[1:]
        if b"\r" in buf:
            self._skip_lf = buf[-1:] == b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        events: list[SSEEvent] = []
        for line in lines:
            if not line:
                if self._has_data:
                    events.append(SSEEvent(b"\n".join(self._data), self._event or "message", self._id))
                self._data = []
                self._event = ""
                self._has_data = False
                continue
            # The common case first: one "data: <json>" line per event.
            if line[:6] == b"data: ":
                self._data.append(line[6:])
                self._has_data = True
                continue
            if line[:1] == b":":
                continue  # comment / keep-alive
            name, sep, value = line.partition(b":")
            if sep and value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                self._data.append(value)
                self._has_data = True
            elif name == b"event":
                self._event = value.decode("utf-8", "replace")
            elif name == b"id" and b"\0" not in value:
                self._id = value.decode("utf-8", "replace")
            # "retry" and unknown fields are ignored, as the spec says.
        return events

    @property
    def pending(self) -> bool:
        """True when the stream stopped inside an event (the spec discards such an event)."""
        return bool(self._buf) or self._has_data
