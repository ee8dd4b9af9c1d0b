"""The text_completion stream writer (the per-token hot path: see apis.openai.sse)."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.apis.openai.sse import dump, head, usage_dict


class CompletionChunkWriter:
    # Unlike chat chunks, completion chunks leave `usage` out until the last one: the published
    # schema does not allow it to be null there.
    __slots__ = ("_base", "_head")

    def __init__(self, completion_id: str, created: int, model: str) -> None:
        self._base = {"id": completion_id, "object": "text_completion", "created": created, "model": model}
        self._head = head(self._base)

    def text(
        self, index: int, text: str, finish_reason: str | None = None, logprobs: dict[str, Any] | None = None
    ) -> bytes:
        # dump({**base, "choices": [{"index": index, "text": text, "logprobs": logprobs,
        # "finish_reason": finish_reason}]})
        dumps = orjson.dumps
        return b'%b%d,"text":%b,"logprobs":%b,"finish_reason":%b}]}\n\n' % (
            self._head,
            index,
            dumps(text),
            dumps(logprobs),
            dumps(finish_reason),
        )

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        return dump({**self._base, "choices": [], "usage": usage_dict(prompt_tokens, completion_tokens)})
