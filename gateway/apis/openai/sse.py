"""What the OpenAI APIs' stream writers share: SSE frames, pre-dumped chunk heads, the usage
object, the error event and [DONE]. Each API's writer lives in its folder (`stream.py`).

Stream chunks as finished SSE events. This is the per-token hot path, so chunks are plain dicts
dumped with orjson (about ten times faster than building pydantic models) straight into the
`data: ...` frame as bytes, which sse-starlette sends as they are (its own event objects cost more
per token than the JSON). The per-token text chunk goes one step further: everything before its
choice is the same in every chunk of a response, so it is dumped once and each token adds only
its orjson-dumped values (byte for byte what dumping the whole dict gives; tested). Tests validate
every chunk shape against OpenAI's published schemas."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.apis.openai.errors import error_body
from gateway.errors import GatewayError

DONE = b"data: [DONE]\n\n"


def dump(obj: dict[str, Any]) -> bytes:
    # One SSE event: the JSON has no newlines, so it is a single data line.
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def head(base: dict[str, Any]) -> bytes:
    # `data: {"id":...,"model":...,"choices":[{"index":` : orjson keeps insertion order, so this is
    # exactly how the dumped chunk dict begins.
    return b"data: " + orjson.dumps(base)[:-1] + b',"choices":[{"index":'


def usage_dict(
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int | None = None,
    reasoning_tokens: int | None = None,
) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    if reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return usage


def error_event(error: GatewayError) -> bytes:
    """A failure after the stream started: one error event, then [DONE] (what the SDKs expect)."""
    return dump(error_body(error))
