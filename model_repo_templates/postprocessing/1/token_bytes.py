"""Exact surface bytes of single tokens, so streamed tokens concatenate to exactly the decoded text.

Decoding one streamed token on its own (what the stock postprocessing does) loses SentencePiece word
spaces and turns partial UTF-8 characters into U+FFFD. Emitting each token's raw bytes instead lets a
client join the bytes and decode UTF-8 incrementally. Pure Python: no Triton imports, unit-tested.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

BYTE_LEVEL: Final = "byte_level"
METASPACE: Final = "metaspace"
ANCHORED: Final = "anchored"

_BYTE_FALLBACK_TOKEN: Final = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_SPIECE_SPACE: Final = "\u2581"


def _gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to U+0100+n."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


_UNICODE_TO_BYTE: Final = _gpt2_unicode_to_byte()


def _decoder_types(decoder: dict[str, Any] | None) -> list[str]:
    if not decoder:
        return []
    if decoder.get("type") == "Sequence":
        return [t for d in decoder.get("decoders", []) for t in _decoder_types(d)]
    types = [str(decoder.get("type"))]
    if decoder.get("type") == "Replace" and decoder.get("pattern", {}).get("String") == _SPIECE_SPACE:
        types.append("SpieceReplace")
    return types


def detect_decoder_kind(tokenizer: Any) -> str:
    """Classify a transformers tokenizer by its tokenizers-library decoder."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return ANCHORED
    decoder = json.loads(backend.to_str()).get("decoder")
    types = _decoder_types(decoder)
    if "ByteLevel" in types:
        return BYTE_LEVEL
    if "Metaspace" in types or "SpieceReplace" in types:
        return METASPACE
    return ANCHORED


class TokenBytes:
    """Maps token ids to the bytes they contribute to the text; results are cached per id."""

    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self.kind = detect_decoder_kind(tokenizer)
        self._skip_special = skip_special_tokens
        self._special_ids = frozenset(tokenizer.all_special_ids)
        # Added tokens (e.g. "<tool_call>") are stored as plain text, not in the model's byte alphabet.
        self._added = {int(i): t.content for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
        self._cache: dict[int, bytes] = {}
        self._anchor_id: int | None = None
        self._anchor_text = ""
        if self.kind == ANCHORED:
            anchor = tokenizer.encode("a", add_special_tokens=False)
            self._anchor_id = anchor[0] if anchor else None
            if self._anchor_id is not None:
                self._anchor_text = tokenizer.decode([self._anchor_id])

    def __call__(self, token_id: int) -> bytes:
        cached = self._cache.get(token_id)
        if cached is None:
            cached = self._cache[token_id] = self._compute(token_id)
        return cached

    def join(self, token_ids: list[int]) -> bytes:
        return b"".join(self(t) for t in token_ids)

    def _compute(self, token_id: int) -> bytes:
        if token_id in self._special_ids:
            return b"" if self._skip_special else str(self._added.get(token_id, "")).encode()
        if token_id in self._added:
            return self._added[token_id].encode()
        token = self._tokenizer.convert_ids_to_tokens(token_id)
        if token is None:
            return b""
        if self.kind == BYTE_LEVEL:
            try:
                return bytes(_UNICODE_TO_BYTE[ch] for ch in token)
            except KeyError:
                return token.encode()
        if self.kind == METASPACE:
            match = _BYTE_FALLBACK_TOKEN.match(token)
            if match is not None:
                return bytes([int(match.group(1), 16)])
            return token.replace(_SPIECE_SPACE, " ").encode()
        if self._anchor_id is None:
            return self._tokenizer.decode([token_id]).encode()
        # Decoders that rewrite a token by its neighbours (WordPiece "##"): measure it after an anchor.
        text = self._tokenizer.decode([self._anchor_id, token_id])
        if text.startswith(self._anchor_text):
            text = text[len(self._anchor_text) :]
        return text.encode()


def token_surface_bytes(tokenizer: Any, token_id: int, *, skip_special_tokens: bool = True) -> bytes:
    """One token's surface bytes (uncached convenience form of TokenBytes)."""
    return TokenBytes(tokenizer, skip_special_tokens=skip_special_tokens)(token_id)
