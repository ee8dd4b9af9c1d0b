"""The chat.completion.chunk stream writer (the per-token hot path: see apis.openai.sse)."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.apis.openai.sse import dump, head, usage_dict


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
        self._head = head(self._base)
        usage = b',"usage":null' if include_usage else b""
        self._content_tail = b',"finish_reason":null}]' + usage + b"}\n\n"

    def _chunk(self, choices: list[dict[str, Any]]) -> bytes:
        body: dict[str, Any] = {**self._base, "choices": choices}
        if self._with_usage:
            # OpenAI sends `usage: null` on every chunk but the last when usage is asked for.
            body["usage"] = None
        return dump(body)

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

    def reasoning(self, index: int, text: str, logprobs: dict[str, Any] | None = None) -> bytes:
        """Thinking text, as `delta.reasoning_content` (vLLM's and SGLang's field)."""
        # _chunk([{"index": index, "delta": {"reasoning_content": text}, "logprobs": logprobs, ...}])
        return b'%b%d,"delta":{"reasoning_content":%b},"logprobs":%b%b' % (
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

    def usage(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int | None = None,
        reasoning_tokens: int | None = None,
    ) -> bytes:
        usage = usage_dict(prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens)
        return dump({**self._base, "choices": [], "usage": usage})
