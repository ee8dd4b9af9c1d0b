"""The text_completion stream writer (the per-token hot path: see apis.openai.sse)."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.apis.openai.sse import dump, head, usage_dict


class CompletionChunkWriter:
    # As chat chunks and as OpenAI streams them: with usage asked for, every chunk but the last
    # carries `usage: null` (the published schema shares one object with the non-streamed
    # response and does not say so).
    __slots__ = ("_base", "_head", "_tail")

    def __init__(self, completion_id: str, created: int, model: str, *, include_usage: bool = False) -> None:
        self._base = {"id": completion_id, "object": "text_completion", "created": created, "model": model}
        self._head = head(self._base)
        self._tail = b'}],"usage":null}\n\n' if include_usage else b"}]}\n\n"

    def text(
        self, index: int, text: str, finish_reason: str | None = None, logprobs: dict[str, Any] | None = None
    ) -> bytes:
        # dump({**base, "choices": [{"index": index, "text": text, "logprobs": logprobs,
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
        return dump({**self._base, "choices": [], "usage": usage_dict(prompt_tokens, completion_tokens)})
