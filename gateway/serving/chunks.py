"""Stream chunks as finished SSE events. This is the per-token hot path, so chunks are plain dicts
dumped with orjson (about ten times faster than building pydantic models) straight into the
`data: ...` frame as bytes, which sse-starlette sends as they are (its own event objects cost more
per token than the JSON). The per-token text chunk goes one step further: everything before its
choice is the same in every chunk of a response, so it is dumped once and each token adds only
its orjson-dumped values (byte for byte what dumping the whole dict gives; tested). Tests validate
every chunk shape against OpenAI's published schemas."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import GatewayError

DONE = b"data: [DONE]\n\n"


def _dump(obj: dict[str, Any]) -> bytes:
    # One SSE event: the JSON has no newlines, so it is a single data line.
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _head(base: dict[str, Any]) -> bytes:
    # `data: {"id":...,"model":...,"choices":[{"index":` : orjson keeps insertion order, so this is
    # exactly how the dumped chunk dict begins.
    return b"data: " + orjson.dumps(base)[:-1] + b',"choices":[{"index":'


def usage_dict(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class ChatChunkWriter:
    __slots__ = ("_base", "_content_tail", "_head", "_with_usage")

    def __init__(self, completion_id: str, created: int, model: str, *, include_usage: bool) -> None:
        self._base = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }
        self._with_usage = include_usage
        self._head = _head(self._base)
        usage = b',"usage":null' if include_usage else b""
        self._content_tail = b',"finish_reason":null}]' + usage + b"}\n\n"

    def _chunk(self, choices: list[dict[str, Any]]) -> bytes:
        body: dict[str, Any] = {**self._base, "choices": choices}
        if self._with_usage:
            # OpenAI sends `usage: null` on every chunk but the last when usage is asked for.
            body["usage"] = None
        return _dump(body)

    def role(self, index: int) -> bytes:
        delta = {"role": "assistant", "content": ""}
        return self._chunk([{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}])

    def content(self, index: int, text: str, logprobs: dict[str, Any] | None = None) -> bytes:
        # _chunk([{"index": index, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": None}])
        return b'%b%d,"delta":{"content":%b},"logprobs":%b%b' % (
            self._head,
            index,
            orjson.dumps(text),
            orjson.dumps(logprobs),
            self._content_tail,
        )

    def finish(self, index: int, reason: str) -> bytes:
        return self._chunk([{"index": index, "delta": {}, "logprobs": None, "finish_reason": reason}])

    def tool_calls(self, index: int, calls: list[dict[str, Any]]) -> bytes:
        delta = {"tool_calls": calls}
        return self._chunk([{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}])

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        return _dump({**self._base, "choices": [], "usage": usage_dict(prompt_tokens, completion_tokens)})


class CompletionChunkWriter:
    # As chat chunks and as OpenAI streams them: with usage asked for, every chunk but the last
    # carries `usage: null` (the published schema shares one object with the non-streamed
    # response and does not say so).
    __slots__ = ("_base", "_head", "_tail")

    def __init__(self, completion_id: str, created: int, model: str, *, include_usage: bool = False) -> None:
        self._base = {"id": completion_id, "object": "text_completion", "created": created, "model": model}
        self._head = _head(self._base)
        self._tail = b'}],"usage":null}\n\n' if include_usage else b"}]}\n\n"

    def text(
        self, index: int, text: str, finish_reason: str | None = None, logprobs: dict[str, Any] | None = None
    ) -> bytes:
        # _dump({**base, "choices": [{"index": index, "text": text, "logprobs": logprobs,
        # "finish_reason": finish_reason}]} (+ "usage": None with include_usage))
        dumps = orjson.dumps
        return b'%b%d,"text":%b,"logprobs":%b,"finish_reason":%b%b' % (
            self._head,
            index,
            dumps(text),
            dumps(logprobs),
            dumps(finish_reason),
            self._tail,
        )

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        return _dump({**self._base, "choices": [], "usage": usage_dict(prompt_tokens, completion_tokens)})


def error_event(error: GatewayError) -> bytes:
    """A failure after the stream started: one error event, then [DONE] (what the SDKs expect)."""
    return _dump(error.to_body())
