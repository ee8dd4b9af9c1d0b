"""Prompt encoding off the event loop, and incremental: a prompt is encoded piece by piece between
the tokenizer's added tokens, each piece's ids cached by its text.

Why pieces are exact: a Hugging Face `tokenizers` tokenizer first cuts the text at its added
tokens that match on the raw text (`normalized: false`), and normalizes, pre-tokenizes and encodes
every piece between them on its own; nothing merges across an added token. So the ids of a text
are its pieces' ids (and the added tokens' own ids) joined, and a conversation that grows turn by
turn re-encodes only its new pieces. Two things could still tie a piece to its place: its offset
(a Metaspace pre-tokenizer that adds its space only at offset 0) and the post-processor (BOS/EOS
with `add_special_tokens`). A piece not at the start is therefore encoded behind an added token
(then dropped), and the post-processor's ids are found once and checked. Every tokenizer is also
checked at start-up on probe texts against its own full encode; one that fails is encoded whole.

Why threads are enough: `Tokenizer.encode_batch` releases the GIL while it encodes (`encode`
holds it the whole time), so new pieces are encoded by `encode_batch` on a small thread pool and
the event loop keeps serving other streams. Short texts are cheaper inline than a thread hop.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.text.ids import TokenIds

# A piece's ids: a read-only int32 array.
Ids = npt.NDArray[np.int32]

logger = logging.getLogger(__name__)

# Below this many characters a text is encoded inline: a few hundred tokens take well under a
# millisecond, less than handing the work to a thread and back.
INLINE_CHARS = 2048
# Default bound on the piece cache, per tokenizer.
CACHE_BYTES = 256 * 1024 * 1024
# What one cached id costs: its int32 in the piece's array.
_BYTES_PER_ID = 4

_PROBES = (
    "Hello world! How are you?",
    "  leading spaces, then <tags> and ünïcödé\n\n\tend ",
    "x",
    "数字 12345 and 'quotes' don't",
)


@dataclass(frozen=True, slots=True)
class Piece:
    """A run of text between added tokens (`token_id` None), or one added token."""

    text: str
    token_id: int | None
    start: int  # offset in the whole text


class PieceCache:
    """Piece text -> its ids, least recently used first out once the bytes held pass `max_bytes`.

    Ids are kept as read-only int32 arrays: a prompt is its pieces' arrays joined in one copy
    (text.ids), and an array of ints is one object the garbage collector never walks, so a cache
    of millions of ids adds nothing to the full collections (tens of milliseconds on the event
    loop's thread otherwise)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[tuple[bool, str], Ids] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def cost(key: tuple[bool, str], ids: Sequence[int] | Ids) -> int:
        return 200 + len(key[1]) + _BYTES_PER_ID * len(ids)

    def get(self, key: tuple[bool, str]) -> Ids | None:
        with self._lock:
            ids = self._items.get(key)
            if ids is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return ids

    def get_many(self, keys: Sequence[tuple[bool, str]]) -> dict[tuple[bool, str], Ids]:
        """The cached ones of `keys` (one lock for all: a long prompt has thousands of runs)."""
        found: dict[tuple[bool, str], Ids] = {}
        items = self._items
        with self._lock:
            for key in keys:
                ids = items.get(key)
                if ids is not None:
                    items.move_to_end(key)
                    found[key] = ids
            self.hits += len(found)
            self.misses += len(set(keys)) - len(found)
        return found

    def put_many(self, entries: Iterable[tuple[tuple[bool, str], Ids]]) -> None:
        for key, ids in entries:
            self.put(key, ids)

    def put(self, key: tuple[bool, str], ids: Ids) -> None:
        cost = self.cost(key, ids)
        if cost > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= self.cost(key, old)
            self._items[key] = ids
            self.bytes += cost
            while self.bytes > self.max_bytes:
                k, v = self._items.popitem(last=False)
                self.bytes -= self.cost(k, v)

    def __len__(self) -> int:
        return len(self._items)


def _trie_pattern(words: Sequence[str]) -> str:
    """A regex matching any of `words`, the longest where several match at one place (as the
    tokenizer's leftmost-longest matcher does), written as a trie so that a few thousand added
    tokens cost one pass over the text."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = True

    def walk(node: dict[str, Any]) -> str:
        ends = "" in node
        branches = [re.escape(ch) + walk(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        # Greedy: the longer token first; the shorter one only where the text stops matching.
        return f"(?:{body})?" if ends else body

    return walk(trie)


class PromptEncoder:
    """Encodes prompts as `backend` (a `tokenizers.Tokenizer`) does, incrementally and, for long
    texts, on threads that release the GIL."""

    def __init__(
        self,
        backend: Any,
        *,
        cache_bytes: int = CACHE_BYTES,
        inline_chars: int = INLINE_CHARS,
        threads: int | None = None,
    ) -> None:
        self._backend = backend
        self.inline_chars = inline_chars
        self.cache = PieceCache(cache_bytes)
        # Two threads: the Python part of the work (rendering, cutting, joining) is serialized by
        # the GIL whatever the count, and every extra thread holding it is one more the event loop
        # waits behind; the second overlaps one job's encode_batch (GIL released) with another's.
        self.pool = ThreadPoolExecutor(max_workers=threads or 2, thread_name_prefix="encode")
        self._split: re.Pattern[str] | None = None
        self._anchor: tuple[str, int] | None = None
        self._split_ids: dict[str, int] = {}
        self._token_text: dict[int, str] = {}
        self._single_ids: dict[int, Ids] = {}
        self._every_match_cuts = True
        # The ids the post-processor puts around a text with add_special_tokens (None: not a fixed
        # prefix and suffix, so such texts are encoded whole).
        self._specials: tuple[list[int], list[int]] | None = None
        self.incremental = False
        self._prepare()

    # ----------------------------------------------------------------------------- set-up

    def _prepare(self) -> None:
        added = self._backend.get_added_tokens_decoder()
        # Added tokens cut the raw text only where they match it as it is; the ones with stripping
        # or word rules take neighbouring text with them, so they are matched but not cut at.
        raw = {t.content: i for i, t in added.items() if not t.normalized and t.content}
        clean = {
            t.content: i
            for i, t in added.items()
            if not t.normalized and t.content and not (t.lstrip or t.rstrip or t.single_word)
        }
        if not clean:
            logger.info("tokenizer has no added tokens to cut prompts at: prompts are encoded whole")
            return
        self._split = re.compile("(" + _trie_pattern(sorted(raw)) + ")")
        self._split_ids = clean
        self._token_text = {i: t for t, i in clean.items()}
        # Where every matched token is a cut, one re.split call cuts the whole text.
        self._every_match_cuts = raw.keys() == clean.keys()
        anchor = min(clean, key=len)
        self._anchor = (anchor, clean[anchor])
        self._specials = self._find_specials()
        self.incremental = self._self_check()
        if not self.incremental:
            logger.warning("tokenizer's pieces do not join to its full encoding: prompts are encoded whole")

    def _find_specials(self) -> tuple[list[int], list[int]] | None:
        found = set()
        for probe in _PROBES:
            bare = list(self._backend.encode(probe, add_special_tokens=False).ids)
            full = list(self._backend.encode(probe, add_special_tokens=True).ids)
            for k in range(len(full) - len(bare) + 1):
                if full[k : k + len(bare)] == bare:
                    found.add((tuple(full[:k]), tuple(full[k + len(bare) :])))
                    break
            else:
                return None
        if len(found) != 1:
            return None
        prefix, suffix = found.pop()
        return list(prefix), list(suffix)

    def _self_check(self) -> bool:
        tokens = list(self._split_ids)[:8]
        texts = [*_PROBES]
        for i, token in enumerate(tokens):
            texts.append(f"{token}{_PROBES[i % len(_PROBES)]}{token}\n{_PROBES[(i + 1) % len(_PROBES)]}")
            texts.append(f" {token} x{token}{token}  ")
        for text in texts:
            for special in (False, True):
                want = list(self._backend.encode(text, add_special_tokens=special).ids)
                if self._encode_pieces(text, special, use_cache=False).tolist() != want:
                    logger.debug("piecewise encoding differs on %r", text)
                    return False
        return True

    # ----------------------------------------------------------------------------- pieces

    def pieces(self, text: str) -> list[Piece]:
        """`text` cut at the added tokens the tokenizer cuts it at."""
        out: list[Piece] = []
        pos = 0
        for part in self._parts(text):
            if isinstance(part, int):
                token = self._token_text[part]
                out.append(Piece(token, part, pos))
                pos += len(token)
            else:
                out.append(Piece(part, None, pos))
                pos += len(part)
        return out

    def _parts(self, text: str) -> list[str | int]:
        """`text` cut into its runs of text (str, none empty) and added tokens (int ids), in order;
        only the first part can start the text."""
        split = self._split
        if split is None:
            return [text] if text else []
        ids = self._split_ids
        out: list[str | int] = []
        if self._every_match_cuts:
            # re.split with a group: text, token, text, token, ..., text (one C call).
            for i, part in enumerate(split.split(text)):
                if i % 2:
                    out.append(ids[part])
                elif part:
                    out.append(part)
            return out
        pos = 0
        for match in split.finditer(text):
            token_id = ids.get(match.group())
            if token_id is None:
                continue  # matched (so nothing shorter inside it is cut at), but not a cut
            if match.start() > pos:
                out.append(text[pos : match.start()])
            out.append(token_id)
            pos = match.end()
        if pos < len(text):
            out.append(text[pos:])
        return out

    def _encode_texts(self, keys: Sequence[tuple[bool, str]]) -> list[Ids]:
        """Encode pieces (key: whether the piece starts the text, its text) in one encode_batch
        call, which releases the GIL."""
        assert self._anchor is not None
        anchor, anchor_id = self._anchor
        texts = [t if first else anchor + t for first, t in keys]
        encodings = self._backend.encode_batch(texts, add_special_tokens=False)
        out: list[Ids] = []
        for (first, _), enc in zip(keys, encodings, strict=True):
            ids = np.array(enc.ids, dtype=np.int32)
            if not first:
                if not len(ids) or ids[0] != anchor_id:
                    raise AssertionError("the anchor token did not encode as itself")
                ids = ids[1:].copy()
            ids.flags.writeable = False
            out.append(ids)
        return out

    def _encode_pieces(self, text: str, add_special_tokens: bool, *, use_cache: bool = True) -> TokenIds:
        parts = self._parts(text)
        # A run of text is keyed by whether it starts the text (encoded bare) and by its text.
        keys = [(i == 0, p) for i, p in enumerate(parts) if not isinstance(p, int)]
        found = self.cache.get_many(keys) if use_cache else {}
        missing = list(dict.fromkeys(k for k in keys if k not in found))
        if missing:
            encoded = self._encode_texts(missing)
            found.update(zip(missing, encoded, strict=True))
            if use_cache:
                self.cache.put_many(zip(missing, encoded, strict=True))
        # The pieces' arrays joined in one copy; added tokens between them as one-id arrays.
        singles = self._single_ids
        chunks: list[Ids] = []
        if add_special_tokens:
            assert self._specials is not None
            chunks.append(np.array(self._specials[0], dtype=np.int32))
        for i, part in enumerate(parts):
            if isinstance(part, int):
                single = singles.get(part)
                if single is None:
                    single = singles[part] = np.array([part], dtype=np.int32)
                chunks.append(single)
            else:
                chunks.append(found[(i == 0, part)])
        if add_special_tokens:
            assert self._specials is not None
            chunks.append(np.array(self._specials[1], dtype=np.int32))
        return TokenIds(np.concatenate(chunks) if chunks else np.empty(0, dtype=np.int32))

    def _whole(self, text: str, add_special_tokens: bool) -> bool:
        return not self.incremental or (add_special_tokens and self._specials is None)

    # ----------------------------------------------------------------------------- API

    def encode_now(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """The ids of `text`, on the calling thread (with the piece cache): for short texts and
        for callers that cannot wait."""
        if len(text) <= self.inline_chars or self._whole(text, add_special_tokens):
            return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)
        return self._encode_pieces(text, add_special_tokens).tolist()

    async def encode(self, text: str, *, add_special_tokens: bool) -> Sequence[int]:
        """The ids of `text`, exactly the tokenizer's (a long text's as TokenIds, one array). A
        long text is cut, looked up and joined on a thread too: that work is Python (the loop gets
        the GIL back every switch interval) and its new pieces are encoded by encode_batch (which
        releases the GIL)."""
        if len(text) <= self.inline_chars:
            return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)
        loop = asyncio.get_running_loop()
        if self._whole(text, add_special_tokens):
            encodings = await loop.run_in_executor(
                self.pool, lambda: self._backend.encode_batch([text], add_special_tokens=add_special_tokens)
            )
            return TokenIds(encodings[0].ids)
        return await loop.run_in_executor(self.pool, self._encode_pieces, text, add_special_tokens)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
