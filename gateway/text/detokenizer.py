"""Incremental text decoding that never loses spaces and never splits a UTF-8 character.

Two sources of text exist: token ids (decoded here with the model's tokenizer) and text bytes
(`text_output` of an ensemble that does not expose ids). Both end in the same `TextDecoder`
interface so the streaming state machine does not care which one a model gives.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.text.tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"
_utf8_decode = codecs.utf_8_decode


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


class TextDecoder(Protocol):
    """Turns engine output pieces into text deltas; `flush` releases what was held back."""

    def push_ids(self, ids: Sequence[int]) -> str: ...

    def push_bytes(self, data: bytes) -> str: ...

    def flush(self) -> str: ...


class IncrementalDetokenizer:
    """The prefix/read-offset scheme (TGI, vLLM), exact to the tokenizer's decoding of the
    generated ids: the joined deltas equal `decode(all generated ids)`, however they are split.

    Each step decodes a short window twice, with and without the new tokens, and emits the
    difference. A window ending in U+FFFD is an incomplete multi-byte character: it is held
    back until the next token completes it, or released by `flush` at the end. A window ending in
    a byte-fallback token (SentencePiece `<0xNN>`) is held back too, until a token of another kind
    ends the run: the tokenizer decodes a run of byte tokens as one UTF-8 string, and one invalid
    byte anywhere in it turns every byte of the run into U+FFFD, even bytes already seen.

    No prompt tokens seed the window: the tokenizer's own decoding of the generated ids drops a
    SentencePiece text's leading space, and so does this.
    """

    __slots__ = (
        "_byte_ids",
        "_ids",
        "_prefix_offset",
        "_read_offset",
        "_skip_special",
        "_special_ids",
        "_tokenizer",
    )

    def __init__(
        self,
        tokenizer: Decoder,
        *,
        byte_ids: frozenset[int] = frozenset(),
        special_ids: frozenset[int] = frozenset(),
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._byte_ids = byte_ids
        self._special_ids = special_ids
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def push_ids(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        self._ids.extend(ids)
        return self._emit(final=False)

    def push_bytes(self, data: bytes) -> str:
        raise TypeError("IncrementalDetokenizer decodes token ids, not text")

    def flush(self) -> str:
        return self._emit(final=True)

    def _in_byte_run(self) -> bool:
        # Skipped special tokens vanish before decoding: the bytes on either side join one run.
        for token in reversed(self._ids):
            if token in self._byte_ids:
                return True
            if not (self._skip_special and token in self._special_ids):
                return False
        return False

    def _emit(self, *, final: bool) -> str:
        if not final and self._byte_ids and self._in_byte_run():
            return ""
        decode = self._tokenizer.decode
        window = self._ids[self._prefix_offset :]
        prefix_text = decode(window[: self._read_offset - self._prefix_offset], self._skip_special)
        new_text = decode(window, self._skip_special)
        if len(new_text) <= len(prefix_text):
            return ""
        if new_text.endswith(REPLACEMENT_CHAR) and not final:
            return ""
        delta = new_text[len(prefix_text) :]
        # Keep the window short: the list would otherwise grow with every token decoded.
        drop = self._read_offset
        self._ids = self._ids[drop:]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        return delta


class ByteTableDecoder:
    """Token ids -> text for tokenizers whose decoding is the UTF-8 decoding of their tokens' bytes
    joined (byte-level BPE; see tokenizer.byte_level_table): one look-up per token, and the
    incremental UTF-8 decoder holds an incomplete character back until it is completed or flushed.
    Exactly the tokenizer's decoding of the whole sequence, however it is split, at a fraction of
    the cost of the window scheme's two decodes per token."""

    __slots__ = ("_decoder", "_table")

    def __init__(self, table: Sequence[bytes]) -> None:
        self._table = table
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push_ids(self, ids: Sequence[int]) -> str:
        table, size = self._table, len(self._table)
        # Ids the tokenizer does not know (a padded model vocabulary) decode to nothing, as there.
        if len(ids) == 1:
            token = ids[0]
            data = table[token] if 0 <= token < size else b""
        else:
            data = b"".join(table[t] if 0 <= t < size else b"" for t in ids)
        return self._decoder.decode(data, False)

    def push_bytes(self, data: bytes) -> str:
        raise TypeError("ByteTableDecoder decodes token ids, not text")

    def flush(self) -> str:
        return self._decoder.decode(b"", True)


def ids_decoder(tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> TextDecoder:
    """The decoder for a stream of generated ids: by byte table where the tokenizer has one, else
    by window. Either way the text is the tokenizer's decoding of the ids, special tokens skipped
    unless `skip_special_tokens` is False (a reasoning format whose markers are special tokens)."""
    table = tokenizer.token_bytes if skip_special_tokens else tokenizer.token_bytes_with_special
    if table is not None:
        return ByteTableDecoder(table)
    return IncrementalDetokenizer(
        tokenizer,
        byte_ids=tokenizer.byte_fallback_ids,
        special_ids=tokenizer.special_ids,
        skip_special_tokens=skip_special_tokens,
    )


class Utf8TextAssembler:
    """Concatenates text bytes from an ensemble and decodes them as one UTF-8 stream.

    Our postprocessing sends each token's exact bytes (possibly half a character); the stock one
    sends text it decoded alone. An incremental decoder is exact for the first and harmless for
    the second; an incomplete trailing character is held until completed or flushed.

    `strip_prefix`: a whole result that repeats the prompt (a model set to echo it) starts with
    the prompt's decoding; those bytes are cut where they are found at the start.
    """

    __slots__ = ("_pending", "_prefix")

    def __init__(self, strip_prefix: bytes = b"") -> None:
        # What codecs' incremental UTF-8 decoder does, without its Python method around the C
        # decoder: this runs once per streamed token. `_pending` is an unfinished character's bytes.
        self._pending = b""
        self._prefix = strip_prefix

    def push_ids(self, ids: Sequence[int]) -> str:
        raise TypeError("Utf8TextAssembler decodes text bytes, not token ids")

    def push_bytes(self, data: bytes) -> str:
        if self._prefix:
            # A prompt-echoing result arrives whole, in one response.
            if data.startswith(self._prefix):
                data = data[len(self._prefix) :]
            self._prefix = b""
        if self._pending:
            data = self._pending + data
        text, used = _utf8_decode(data, "replace", False)
        self._pending = data[used:] if used < len(data) else b""
        return text

    def flush(self) -> str:
        data, self._pending = self._pending, b""
        return _utf8_decode(data, "replace", True)[0]
