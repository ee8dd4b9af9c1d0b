"""Chat's log probabilities: `content` entries with each token's exact bytes and its alternatives."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.apis.openai.logprobs import token_string
from gateway.engine import TokenLogprob
from gateway.text.tokenizer import Tokenizer


def _entry(tokenizer: Tokenizer, token_id: int, logprob: float, starts_text: bool) -> dict[str, Any]:
    text, raw = token_string(tokenizer, token_id, starts_text=starts_text)
    return {"token": text, "logprob": logprob, "bytes": list(raw)}


def chat_content(tokenizer: Tokenizer, entries: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    return [
        {
            **_entry(tokenizer, e.token_id, e.logprob, e.starts_text),
            "top_logprobs": [_entry(tokenizer, t, lp, e.starts_text) for t, lp in e.top],
        }
        for e in entries
    ]


def chat_logprobs(tokenizer: Tokenizer, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    return {"content": chat_content(tokenizer, entries), "refusal": None}
