"""Log probabilities in OpenAI's two shapes: chat's `content` entries and completions' parallel lists."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.engine import TokenLogprob
from gateway.errors import InvalidRequestError, UnsupportedParameterError
from gateway.text.tokenizer import Tokenizer


def requested(
    *, enabled: bool, top: int | None, top_param: str, supported: bool, top_supported: bool
) -> int | None:
    """How many alternatives per token the request asks for (None: no log probabilities)."""
    if not enabled:
        if top:
            raise InvalidRequestError(f"{top_param} requires logprobs to be true", param=top_param)
        return None
    if not supported:
        raise UnsupportedParameterError(
            "this model does not return log probabilities (it needs output_ids and return_log_probs)",
            param="logprobs",
        )
    if top and not top_supported:
        raise UnsupportedParameterError(
            "this model cannot return top alternatives (it needs return_generation_logits)", param=top_param
        )
    return top or 0


def _entry(tokenizer: Tokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    text = tokenizer.token_text(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def chat_content(tokenizer: Tokenizer, entries: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    return [
        {
            **_entry(tokenizer, e.token_id, e.logprob),
            "top_logprobs": [_entry(tokenizer, t, lp) for t, lp in e.top],
        }
        for e in entries
    ]


def chat_logprobs(tokenizer: Tokenizer, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    return {"content": chat_content(tokenizer, entries), "refusal": None}


class CompletionLogprobs:
    """Completions' parallel lists; `text_offset` counts characters from the start of the
    choice's text (after an echoed prompt)."""

    __slots__ = ("_offset", "_tokenizer", "_with_top")

    def __init__(self, tokenizer: Tokenizer, *, start: int, with_top: bool) -> None:
        self._tokenizer = tokenizer
        self._offset = start
        self._with_top = with_top

    def block(self, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
        tokens, values, tops, offsets = [], [], [], []
        for e in entries:
            text = self._tokenizer.token_text(e.token_id)
            tokens.append(text)
            values.append(e.logprob)
            offsets.append(self._offset)
            self._offset += len(text)
            if self._with_top:
                tops.append({self._tokenizer.token_text(t): lp for t, lp in e.top})
        return {
            "tokens": tokens,
            "token_logprobs": values,
            "top_logprobs": tops if self._with_top else None,
            "text_offset": offsets,
        }


def merge_blocks(blocks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": None, "text_offset": []}
    for block in blocks:
        out["tokens"] += block["tokens"]
        out["token_logprobs"] += block["token_logprobs"]
        out["text_offset"] += block["text_offset"]
        if block["top_logprobs"] is not None:
            out["top_logprobs"] = (out["top_logprobs"] or []) + block["top_logprobs"]
    return out
