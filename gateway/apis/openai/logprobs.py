"""How the OpenAI APIs show a token in log probabilities: its text, or `bytes:\\xNN...` where the
token is not whole UTF-8 characters (as OpenAI does), so distinct tokens stay distinct; and its
exact bytes."""

from __future__ import annotations

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
