"""How the OpenAI APIs show a token in log probabilities: its text, or `bytes:\\xNN...` where the
token is not whole UTF-8 characters (as OpenAI does), so distinct tokens stay distinct; and its
exact bytes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.engine import TokenLogprob
from gateway.text.tokenizer import Tokenizer


def token_string(tokenizer: Tokenizer, token_id: int, *, starts_text: bool = False) -> tuple[str, bytes]:
    """(the token as logprobs name it, its exact bytes); `starts_text`: the output's first token,
    whose leading space a SentencePiece decoder drops from the text."""
    raw = tokenizer.token_raw_bytes(token_id, starts_text=starts_text)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), raw
    return tokenizer.token_text(token_id, starts_text=starts_text), raw


def ranked_prompt_logprobs(
    tokenizer: Tokenizer, entries: Sequence[TokenLogprob | None], top: int
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's `prompt_logprobs`: per prompt token, {token id: {logprob, rank, decoded_token}} for the
    token itself and the most likely alternatives (ranked 1, 2, ...); the first token None."""
    out: list[dict[str, dict[str, Any]] | None] = []
    for entry in entries:
        if entry is None:
            out.append(None)
            continue
        ranked = {
            str(entry.token_id): {
                "logprob": entry.logprob,
                "rank": entry.rank,
                "decoded_token": token_string(tokenizer, entry.token_id)[0],
            }
        }
        for rank, (token, value) in enumerate(entry.top[:top], start=1):
            ranked.setdefault(
                str(token),
                {"logprob": value, "rank": rank, "decoded_token": token_string(tokenizer, token)[0]},
            )
        out.append(ranked)
    return out
