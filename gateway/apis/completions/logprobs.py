"""Completions' log probabilities: parallel lists, built block by block as tokens arrive."""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any

from gateway.apis.openai.logprobs import token_string
from gateway.engine import TokenLogprob
from gateway.text.tokenizer import Tokenizer


class CompletionLogprobs:
    """Completions' parallel lists; `text_offset` counts characters from the start of the
    choice's text (after an echoed prompt): a token that ends inside a character moves it by
    none, the one that completes the character by one, as the text itself grows."""

    __slots__ = ("_chars", "_offset", "_tokenizer", "_with_top")

    def __init__(self, tokenizer: Tokenizer, *, start: int, with_top: bool) -> None:
        self._tokenizer = tokenizer
        self._offset = start
        self._with_top = with_top
        self._chars = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def block(self, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
        tokens, values, tops, offsets = [], [], [], []
        for e in entries:
            text, raw = token_string(self._tokenizer, e.token_id, starts_text=e.starts_text)
            tokens.append(text)
            values.append(e.logprob)
            offsets.append(self._offset)
            self._offset += len(self._chars.decode(raw))
            if self._with_top:
                tops.append(
                    {token_string(self._tokenizer, t, starts_text=e.starts_text)[0]: lp for t, lp in e.top}
                )
        return {
            "tokens": tokens,
            "token_logprobs": values,
            "top_logprobs": tops if self._with_top else None,
            "text_offset": offsets,
        }

    def prompt_block(
        self, ids: Sequence[int], entries: Sequence[TokenLogprob | None], top: int, echo: str
    ) -> dict[str, Any]:
        """The echoed prompt's tokens: each with its log probability given the tokens before it,
        the first with none (null, as OpenAI's legacy API and vLLM give it). A special token the
        tokenizer added to a text prompt (a BOS) is not in the echoed text: it takes no characters
        there, so the offsets stay those of the text."""
        tokens, values, tops, offsets = [], [], [], []
        specials = self._tokenizer.special_ids
        for pos, token in enumerate(ids):
            entry = entries[pos] if pos < len(entries) else None
            first = pos == 0
            text, raw = token_string(self._tokenizer, token, starts_text=first)
            tokens.append(text)
            values.append(None if entry is None else entry.logprob)
            offsets.append(self._offset)
            if token not in specials or echo.startswith(text, self._offset):
                self._offset += len(self._chars.decode(raw))
            if self._with_top:
                tops.append(
                    None
                    if entry is None
                    else {token_string(self._tokenizer, t)[0]: lp for t, lp in entry.top[:top]}
                )
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
