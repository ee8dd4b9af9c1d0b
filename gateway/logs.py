"""Logging set-up (text or JSON lines) and the per-request record behind the access log.

The record lives in a contextvar: the middleware creates it, the core fills in model,
tokens and TTFT, and the middleware logs one line when the response (the whole stream) is done.
Prompts and completions are never part of it.
"""

from __future__ import annotations

import contextvars
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

ACCESS_LOGGER = "gateway.access"


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    method: str
    path: str
    start: float = field(default_factory=time.perf_counter)
    status: int = 0
    # What the client was told went wrong, as "type/code" (invalid_request_error/model_not_found):
    # an access line of a 4xx says why without the body.
    error: str | None = None
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    # The admission priority of a generation request (gateway.http.admission).
    priority: int | None = None
    # Top-level body fields the gateway did not use (sent back in x-gateway-ignored-fields).
    ignored_fields: tuple[str, ...] = ()

    def fields(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "error": self.error,
            "model": self.model,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_ms": None if self.ttft_s is None else round(self.ttft_s * 1000, 2),
            "priority": self.priority,
            "duration_ms": round((time.perf_counter() - self.start) * 1000, 2),
            "ignored_fields": ",".join(self.ignored_fields) or None,
        }


class Repeating:
    """When to log a condition that repeats (a Triton that cannot be reached): the first time,
    whenever its message changes, and otherwise at a falling rate, after 1, 2, 4, ... seconds
    up to `max_interval_s`, with how often it happened meanwhile."""

    def __init__(self, *, first_interval_s: float = 1.0, max_interval_s: float = 300.0) -> None:
        self._first = first_interval_s
        self._max = max_interval_s
        self._message: str | None = None
        self._next_at = 0.0
        self._interval = first_interval_s
        self.suppressed = 0

    def should_log(self, message: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        if message != self._message:
            self._message = message
            self._interval = self._first
        elif now < self._next_at:
            self.suppressed += 1
            return False
        else:
            self._interval = min(self._interval * 2, self._max)
        self._next_at = now + self._interval
        return True

    def take_suppressed(self) -> int:
        count, self.suppressed = self.suppressed, 0
        return count


current_request: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar(
    "current_request", default=None
)


def note_error(kind: str, code: str | None) -> None:
    """Record the error this request answers with for its access line (the first, which the
    client got: a stream's later error event does not replace it)."""
    record = current_request.get()
    if record is not None and record.error is None:
        record.error = f"{kind}/{code}" if code else kind


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            out.update(extra)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            line += " " + " ".join(f"{k}={v}" for k, v in extra.items() if v is not None)
        return line


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
